"""The I/O plumbing under the drivers: bounded calls, renewal, wake-ups.

``calls_async`` (and its generated twin ``calls``) sends every command with
its deadline, on decisions made without I/O in ``calls_base``; ``giveback``
and ``giveback_async`` return what a cut-off call may still have taken;
``renewal`` keeps leases alive; ``scheduler`` is the one thread the sync
give-backs and renewal run on; the ``notify*`` modules and ``wakeup`` tell
waiters that a lock was released.
"""
