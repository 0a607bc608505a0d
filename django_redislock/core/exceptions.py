"""One exception hierarchy, named after the state the caller is in."""

from __future__ import annotations


class LockError(Exception):
    """Base class of every error this library raises."""


class LockNotAcquired(LockError):
    """The lock stayed busy for the whole wait."""

    def __init__(self, name: str, *, retry_after: float | None = None) -> None:
        self.name = name
        # Seconds until the current holder's lease runs out, when Redis told us.
        self.retry_after = retry_after
        super().__init__(f"lock {name!r} is busy")


class LockNotOwned(LockError):
    """Release or extend by a handle that does not own the lease.

    Raised for a handle that was never acquired, was already released, or is
    used from another thread, task or process than the one that acquired it.
    """


class LockLost(LockNotOwned):
    """The lease was lost while the caller believed it held it.

    It expired, was force-released, or Redis lost it (restart, failover).
    Subclasses ``LockNotOwned`` so that one ``except`` covers both.
    """


class RedisUnavailable(LockError):
    """Redis could not be reached, timed out, or answered with an error.

    Never the same thing as busy: callers choose a policy for it explicitly.
    ``reason`` says which, where known: ``"auth"`` (wrong username or
    password), ``"permission"`` (an ACL forbids the command), ``"refused"``
    (nothing listens at ``address``), ``"timeout"``, ``"breaker_open"`` (not
    sent: a call to that Redis timed out lately, and calls to it fail fast for
    a moment, ``BREAKER_WINDOW``), ``"unreachable"`` (another connection
    failure) or ``"error"`` (an error reply); else ``None``.
    ``address`` is the ``host:port`` or socket path, where known.
    """

    reason: str | None = None
    address: str | None = None


class ReplicationTimeout(RedisUnavailable):
    """Fewer replicas than asked acknowledged a new lease in time (``replicas=N``).

    The lease was given back, so nobody holds it because of this attempt. It is
    not "busy": the lock was free, but Redis could not make the grant as
    durable as requested, so the caller's unavailable policy applies.
    """

    def __init__(self, name: str, *, acked: int, wanted: int, timeout: float) -> None:
        self.name = name
        self.acked = acked
        self.wanted = wanted
        super().__init__(
            f"lock {name!r}: {acked} of {wanted} replica(s) acknowledged the new lease "
            f"within {timeout:g}s; it was given back (see the replicas option)"
        )
