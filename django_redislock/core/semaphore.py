"""``Semaphore``: a counting semaphore in Redis with expiring permits and fair admission.

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
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from . import scripts
from .base import DEFAULT_GRACE, STATE_KEEP_MS, LockBase, Observer
from .exceptions import (
    LockError,
    LockLost,
    LockNotOwned,
    RedisUnavailable,
)
from .keys import KeySpace
from .lock import SyncHandle

__all__ = ["Semaphore", "SemaphoreBase", "check_limit", "clear_semaphore", "release_permit"]


# Permits last this long unless told otherwise (the PERMIT_TIMEOUT default).
DEFAULT_PERMIT_TTL = 60.0


def _load(name: str, *, repeatable: bool = False) -> scripts.Script:
    return scripts.load(name, prelude="semaphore", repeatable=repeatable)


ACQUIRE = _load("sem_acquire")
RELEASE = _load("sem_release", repeatable=True)
REFRESH = scripts.HOLDERS_REFRESH
CANCEL = _load("sem_cancel", repeatable=True)
CLEAR = _load("holders_clear")


def check_limit(limit: object) -> int:
    """Validate a semaphore limit, with an error that names the fix."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be a whole number of permits, not {limit!r}")
    if limit < 1:
        raise ValueError(f"limit must be 1 or more permits; got {limit!r}")
    return limit


class SemaphoreBase(LockBase):
    """Arguments and state of one semaphore handle; subclasses do the I/O.

    ``fence`` is always None: permits are shared, so no order among their
    holders exists for a fencing token to express.
    """

    def __init__(
        self,
        client: Any,
        name: str,
        limit: int,
        *,
        ttl: float = DEFAULT_PERMIT_TTL,
        wait: float = 10.0,
        keyspace: KeySpace | None = None,
        label: str = "",
        observer: Observer | None = None,
        drift_factor: float = 0.01,
        grace: float | None = None,
        # WAIT for this many replicas to acknowledge each new permit (0: off);
        # fewer in time and the permit is given back (ReplicationTimeout).
        replicas: int = 0,
        replicas_timeout: float = 0.1,
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

    def _args_acquire(
        self, token: str, ttl_ms: int, who: str, wait_ms: int, address: bytes
    ) -> tuple:
        return (
            token,
            ttl_ms,
            self._name_b,
            self._owner(who),
            wait_ms,
            address,
            self._grace_ms,
            STATE_KEEP_MS,
            self._limit,
        )

    _holding = "permit"

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


class Semaphore(SemaphoreBase, SyncHandle):
    """At most ``limit`` holders of ``name`` at once, across every process.

    ``Semaphore(client, "reports", 3, ttl=60, wait=5)``. ``acquire`` waits up
    to ``wait`` seconds for a permit, in arrival order; a permit lasts ``ttl``
    seconds on the Redis server's clock unless ``refresh``-ed, so a crashed
    holder's permit comes back by itself.
    """

    def _already_held(self) -> LockError:
        return LockError(
            f"semaphore {self.name!r}: this handle already holds a permit in this "
            "thread; release it first, or use one handle per concurrent holder"
        )

    _acquire_script = ACQUIRE
    _cancel_script = CANCEL

    # -- release / refresh ------------------------------------------------------
    def _check_owner(self, action: str) -> str:
        if self.token is None or self._pid != os.getpid():
            raise LockNotOwned(f"cannot {action} a permit of {self.name!r}: this handle holds none")
        if self._thread != threading.get_ident():
            raise LockNotOwned(
                f"cannot {action} a permit of {self.name!r}: another thread acquired it"
            )
        return self.token

    def _release_call(self, token: str) -> int:
        return int(scripts.run(self.client, RELEASE, self._key_tuple, self._release_args(token)))

    def refresh(self, ttl: float | None = None) -> None:
        """Reset this permit to ``ttl`` seconds (default: the handle's) from now."""
        token = self._check_owner("refresh")
        if self.lost:
            raise LockLost(f"permit of semaphore {self.name!r} was already lost")
        ttl_ms = self._ttl_ms(ttl)
        sent = time.monotonic()
        try:
            ok = scripts.run(self.client, REFRESH, self._key_tuple, (token, ttl_ms, STATE_KEEP_MS))
        except RedisUnavailable as exc:
            self._reset_unknown(exc, sent, ttl_ms)
            raise
        if not ok:
            self._mark_lost("the permit was gone at refresh (expired, cleared or lost by Redis)")
            raise LockLost(f"permit of semaphore {self.name!r} was lost before it was refreshed")
        if self.token == token and not self.lost:
            self._valid_until = self._validity(sent, ttl_ms)

    extend = refresh

    def owned(self) -> bool:
        """Ask Redis whether this handle still holds its permit (one round trip)."""
        token = self.token
        if token is None or self._pid != os.getpid() or not self.held:
            return False
        try:
            score = self.client.zscore(self.keys.lease, token)
        except Exception as exc:
            raise RedisUnavailable(f"could not check semaphore {self.name!r}: {exc}") from exc
        return score is not None and self.held


def release_permit(
    client: Any, keyspace: KeySpace, name: str, token: str, serial: int | None = None
) -> bool:
    """Give back the permit ``token`` of ``name`` from any thread, by its token.

    For code that hands a permit over to whoever finishes the work (a
    response's ``close()``, for one). Returns False when it was no longer held.
    ``serial`` (the handle's ``serial``) lets a release sent again after its
    reply was lost report success; without it such a retry reports False.
    """
    keys = keyspace.semaphore(name)
    return bool(
        scripts.run(
            client,
            RELEASE,
            (keys.lease, keys.queue, keys.state),
            (token, int(DEFAULT_GRACE * 1000), 1, STATE_KEEP_MS, "" if serial is None else serial),
        )
    )


def clear_semaphore(client: Any, keyspace: KeySpace, name: str, token: str | None = None) -> int:
    """Force-release one holder of ``name`` (or all, when ``token`` is None).

    Owner details are removed and waiters are woken for the freed permits.
    Former holders find out at their next refresh or release. Returns how many
    permits (including unclaimed reservations) were dropped.
    """
    keys = keyspace.semaphore(name)
    return int(
        scripts.run(
            client,
            CLEAR,
            (keys.lease, keys.queue, keys.state),
            (int(DEFAULT_GRACE * 1000), token or ""),
        )
    )
