"""A counting semaphore in Redis with expiring permits and fair admission:
its scripts, arguments and state, for both drivers.

Protocol, one round trip each when uncontended:

* acquire runs ``sem_acquire.lua``: it drops permits whose expiry (on the Redis
  server's clock) has passed, counts the rest, and either grants a permit or,
  if the caller will wait, appends it to the FIFO queue with its process's
  wake-up channel. All of it in one script, so two clients can never both
  take the last permit.
* release runs ``sem_release.lua``: it removes the permit and gives every free
  permit to the oldest live waiters, each as a short reservation, waking each
  one through its channel. With a limit of N, up to N waiters may be woken.
* a woken waiter runs ``sem_acquire.lua`` again and claims its reservation.

A reservation occupies a permit, so newcomers cannot barge past the queue, and
it expires after a grace period, so a waiter that died in the queue costs
little. A crashed holder's permit expires by itself after its permit TTL.

Each handle holds at most one permit at a time; shared between threads it
behaves like ``threading.Lock`` (one thread at a time, only that thread may
release). Make one handle per concurrent user: handles are cheap.

The drivers are ``semaphore_async.py`` (``AsyncSemaphore``) and
``semaphore.py`` (``Semaphore``), generated from it.
"""

from __future__ import annotations

from typing import Any

from ..engine.keys import KeySpace
from ..validate import check_limit
from .base import DEFAULT_DRIFT, DEFAULT_REPLICAS_TIMEOUT, STATE_KEEP_MS, ClientT, Observer
from .holders_base import HoldersBase, holder_scripts

__all__ = [
    "ACQUIRE",
    "CANCEL",
    "CLEAR",
    "DEFAULT_PERMIT_TTL",
    "REFRESH",
    "RELEASE",
    "SemaphoreBase",
    "check_limit",
]


# Permits last this long unless told otherwise (the PERMIT_TIMEOUT default).
DEFAULT_PERMIT_TTL = 60.0


ACQUIRE, RELEASE, REFRESH, CANCEL, CLEAR = holder_scripts("semaphore", "sem")


class SemaphoreBase(HoldersBase[ClientT]):
    """Arguments and state of one semaphore handle; subclasses do the I/O.

    ``fence`` is always None: permits are shared, so no order among their
    holders exists for a fencing token to express.
    """

    kind = "semaphore"

    def __init__(
        self,
        client: ClientT,
        name: str,
        limit: int,
        *,
        ttl: float = DEFAULT_PERMIT_TTL,
        wait: float = 10.0,
        keyspace: KeySpace | None = None,
        label: str = "",
        observer: Observer | None = None,
        drift_factor: float = DEFAULT_DRIFT,
        grace: float | None = None,
        # WAIT for this many replicas to acknowledge each new permit (0: off);
        # fewer in time and the permit is given back (ReplicationTimeout).
        replicas: int = 0,
        replicas_timeout: float = DEFAULT_REPLICAS_TIMEOUT,
    ) -> None:
        options: dict[str, Any] = {}
        if grace is not None:
            options["grace"] = grace
        super().__init__(
            client,
            name,
            ttl=ttl,
            wait=wait,
            keyspace=keyspace,
            label=label,
            observer=observer,
            drift_factor=drift_factor,
            replicas=replicas,
            replicas_timeout=replicas_timeout,
            **options,
        )
        self.keys = self.keyspace.semaphore(name)
        self._limit = check_limit(limit)
        self.retry_after: float | None = None

    @property
    def limit(self) -> int:
        return self._limit

    @limit.setter
    def limit(self, value: int) -> None:
        # Takes effect at this handle's next acquire, which makes it the
        # current limit for everyone; permits already held are not revoked.
        self._limit = check_limit(value)

    def __repr__(self) -> str:
        state = "held" if self.token else "free"
        return f"<{type(self).__name__} {self.name!r} limit={self._limit} {state}>"

    def _acquire_reply(self, reply: Any) -> tuple[int, int]:
        # sem_acquire.lua answers {1, serial} or {0, ms}: a permit has no
        # fence, only the serial its release sends (see _granted).
        granted, value = reply
        return int(granted), int(value)

    def _kind_arg(self) -> int:
        return self._limit

    _holding = "permit"
    _not_held = "cannot {action} a permit of {name!r}: this handle holds none"
    _not_ours = "cannot {action} a permit of {name!r}: another {kind} acquired it"

    def _label(self) -> str:
        return f"permit of semaphore {self.name!r}"

    @property
    def serial(self) -> int | None:
        """The serial Redis gave the permit held (None when none is): what
        ``release_permit`` needs, with the token, to tell a retried release
        from a loss."""
        return self._serial if self.token is not None else None

    def _release_args(self, token: str) -> tuple:
        # sem_cancel.lua reads the first three; sem_release.lua all five.
        serial = "" if self._serial is None else self._serial
        return (token, self._grace_ms, self._limit, STATE_KEEP_MS, serial)

    def _cancel_args(self, token: str) -> tuple:
        return self._release_args(token)

    def _granted(self, token: str, fence: int, sent: float, ttl_ms: int) -> None:
        # What came as the fence is the permit's serial (see _acquire_reply).
        super()._granted(token, fence, sent, ttl_ms)
        self.fence = None  # permits are shared: no order for a fence to express
