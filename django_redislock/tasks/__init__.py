"""Unique tasks: a duplicate enqueue is refused while a task with the same key is pending.

* ``options.py``: a unique task's checked arguments, and the claim that
  travels with its message.
* ``claims.py``: the enqueuer's side (take the key, hand it to the task).
* ``run.py``: the worker's side (adopt the key, let it go).
* ``unique.py``: ``unique_task``, the glue for Django's tasks. Celery's is
  ``django_redislock.contrib.celery_unique``, and ``celery_lifecycle.py``
  the worker's side of the ends a run never sees (revoked, expired, lost).
* ``local.py``: unique tasks run where they are enqueued, for the test kit.
"""
