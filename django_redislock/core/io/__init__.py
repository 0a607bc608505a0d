"""The I/O plumbing under the drivers: bounded calls, renewal, wake-ups.

``transport`` sends every command with its deadline; ``giveback`` returns what
a cut-off call may still have taken; ``renewal`` keeps leases alive; the
``notify*`` modules and ``wakeup`` tell waiters that a lock was released.
"""
