"""The I/O plumbing under the drivers: bounded calls, wake-ups, background work.

``calls_async`` (and its generated twin ``calls``) sends every command with
its deadline, on decisions made without I/O in ``calls_base``; ``giveback``
and ``giveback_async`` return what a cut-off call may still have taken;
``breaker`` fails calls fast while a Redis does not answer; ``background`` is
the one thread the sync give-backs and renewal run on, and keeps leases
alive; the ``wakeups*`` modules tell waiters that a lock was released.
"""
