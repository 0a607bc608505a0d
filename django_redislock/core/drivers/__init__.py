"""The lock drivers: locks, semaphores, read-write locks and multi-locks.

Each ``*_async.py`` driver is the source; its sync twin is generated from it
by ``tools/gen_sync.py``. What threads and tasks do differently is in
``_async_prims.py`` and ``_sync_prims.py``; what both share, in ``*_base.py``.
"""
