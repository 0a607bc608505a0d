"""Locks for Django code: ``redis_locked``, ``redis_lock`` and what they decide.

* ``decorators.py``: ``redis_locked``, a lock around a view, task or function;
  ``blocks.py``: ``redis_lock``, the same lock as a ``with`` block.
* ``running.py``: ``run_locked``, one body run under one lock as a locked view
  runs (transaction, lease check before the commit, release after it): every
  call of ``redis_locked`` and the idempotency guard's claim of a key.
* ``options.py`` checks their arguments once; ``naming.py`` turns a call into
  a lock name; ``context.py`` knows which lock is current (and re-entry).
* ``transactions.py`` and ``deferred.py``: the lock outlives the database
  transaction of the work it protects.
* ``outcomes.py``: what a caller sees when the lock is busy, Redis is down,
  or the lock is lost.
* ``factories.py``: ``get_lock`` and its kin, core handles configured from
  ``REDISLOCK``; the other folders take their locks and semaphores here.
* ``fencing.py``: ``fenced_get``, ``fenced_update``, ``FencedQuerySet``;
  ``fence_shapes.py``: the route each shape of queryset takes to its fences.

Nothing here imports ``throttling``, ``tasks``, ``ops`` or ``idempotency``: they
build on this folder, not the other way round. Import from the modules; this
package imports nothing, so that loading one of them loads no other.
"""
