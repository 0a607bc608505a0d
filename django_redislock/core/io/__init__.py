"""The I/O plumbing under the drivers: bounded calls, renewal, wake-ups.

``transport`` sends every command with its deadline (``checkout``, ``batch``
and ``cluster_calls`` are its steps); ``giveback`` returns what a cut-off call
may still have taken; ``background`` is the one thread both run on, and keeps
leases alive (renewal); the ``wakeups*`` modules tell waiters that a lock was
released.
"""
