"""What ``Lock`` and ``AsyncLock`` share: arguments, timing, owner metadata."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext, suppress
from functools import cache, lru_cache
from typing import Any, Generic, TypeVar

from ..clients import AnyRedisClient
from ..engine.keys import KeySpace, LockKeys, shows_name
from ..engine.loss import Loss, Trace, cause_of
from ..engine.protocol import BARGE_LIMIT, STATE_KEEP_MS, acquire_reply, may_have_run, validity
from ..exceptions import LockError, LockLost
from ..process import new_token, this_process
from ..validate import check_replicas, check_seconds

__all__ = [
    "DEFAULT_DRIFT",
    "DEFAULT_REPLICAS_TIMEOUT",
    "STATE_KEEP_MS",
    "LockBase",
    "Observer",
    "after_block",
    "fields_of",
    "same_token",
]

log_acquire = logging.getLogger("django_redislock.acquire")
log_release = logging.getLogger("django_redislock.release")
log_lost = logging.getLogger("django_redislock.lost")

# Semaphores: a woken waiter has this long to claim its reserved permit before
# the next one is woken. Long enough to ride out a scheduling hiccup on a
# loaded host, short enough that a waiter that died in its queue costs little.
# (Locks hand the lease itself to the next waiter and do not use it.)
DEFAULT_GRACE = 2.0
# The share of a lease's TTL a handle counts as lost to clock drift and
# Redis's expiry, and how long an acquire waits for its replicas by default.
DEFAULT_DRIFT = 0.01
DEFAULT_REPLICAS_TIMEOUT = 0.1


def fields_of(lock: Any, **more: Any) -> dict[str, Any]:
    """The structured fields of a log record about ``lock`` (a handle, or a
    multi-lock), for ``extra=``: log processors and Sentry see them as
    attributes of the record, whatever the message says."""
    fields = getattr(lock, "log_fields", None)
    if fields is not None:
        return dict(fields(), **more)
    template = getattr(lock, "metric_name", None)
    return {
        "lock_name": getattr(lock, "name", None),
        "template": template if isinstance(template, str) else None,
        "kind": getattr(lock, "kind", "lock"),
        **more,
    }


class Observer:
    """Receives lifecycle events. The core logs; the Django layer sends signals.

    Every record carries ``lock.log_fields()`` in ``extra`` (``lock_name``,
    ``template``, ``kind``, ``owner``, ``label``, ``fence``), and the event's
    own: ``waited_seconds``, ``held_seconds``, or for a loss ``lock.loss``'s
    (``cause``, ``held_seconds``, ``ttl_seconds``, ``forced_by``).
    """

    def acquired(self, lock: LockBase, waited: float) -> None:
        if log_acquire.isEnabledFor(logging.DEBUG):
            log_acquire.debug(
                "acquired %r fence=%s after %.4fs",
                lock.name,
                lock.fence,
                waited,
                extra=lock.log_fields(waited_seconds=waited),
            )

    def busy(self, lock: LockBase, waited: float) -> None:
        if log_acquire.isEnabledFor(logging.DEBUG):
            log_acquire.debug(
                "busy %r after %.4fs",
                lock.name,
                waited,
                extra=lock.log_fields(waited_seconds=waited),
            )

    def released(self, lock: LockBase, held: float) -> None:
        if log_release.isEnabledFor(logging.DEBUG):
            log_release.debug(
                "released %r after %.4fs", lock.name, held, extra=lock.log_fields(held_seconds=held)
            )

    def lost(self, lock: LockBase, reason: str) -> None:
        loss = lock.loss
        more = loss.fields() if loss is not None else {"cause": None}
        log_lost.warning(
            "lost %r (fence %s): %s",
            lock.name,
            lock.fence,
            reason,
            extra=lock.log_fields(**more),
        )


DEFAULT_OBSERVER = Observer()


def same_token(current: bytes | str | None, token: str) -> bool:
    """Compare a token read from Redis with ours, for clients that decode or not."""
    if current is None:
        return False
    return (current.decode() if isinstance(current, bytes) else current) == token


def after_block(exc_type: type[BaseException] | None) -> AbstractContextManager[object]:
    """Around the release that ends a ``with`` block: a ``LockError`` (lost, not
    owned) is raised only when the block raised nothing, so the block's own
    exception passes through unchanged (a loss is already reported to the
    observer and ``on_lost``)."""
    return nullcontext() if exc_type is None else suppress(LockError)


@cache
def _hostname() -> str:
    return socket.gethostname()


# Same process, thread and label: same JSON. Serialising it again on every
# acquire would cost as much as a quarter of the client-side work, and a
# handle made per call (as the decorator makes them) would never reuse its own.
# Bounded: thread names, labels and templates are few, but need not be.
@lru_cache(maxsize=1024)
def _owner_json(
    pid: int,
    who: str,
    label: str,
    template: str | None = None,
    renew: bool = False,
    wait_ms: int = 0,
) -> str:
    data: dict[str, Any] = {"host": _hostname(), "pid": pid, "thread": who, "label": label}
    if template is not None:
        # The lock's template (``metric_name``), so operators can group names
        # that carry ids: one short key, and nothing at all for ad-hoc locks.
        # Readers treat an owner without it (an older entry) as ad-hoc.
        data["t"] = template
    if renew:
        # Renewed in the background (renew=True): operators are shown when it
        # was last renewed, and "off" for a lease nobody renews.
        data["r"] = 1
    if wait_ms:
        # The wait its call asked for, ms: a queued waiter's entry holds its
        # deadline (server clock), and the deadline less this is when the
        # call began to wait, so operators see how long each has waited.
        data["w"] = wait_ms
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


# The client a handle holds: a sync one for the sync drivers, an asyncio one
# for theirs (``clients.py``).
ClientT = TypeVar("ClientT", bound=AnyRedisClient)


class LockBase(Generic[ClientT]):
    """State and arguments of one lock handle; subclasses do the I/O."""

    # A name for metrics that stays the same across calls (the decorator's
    # template, a throttling rule): never the lock's own name, which may hold
    # an id per call. None: the Django layer's metrics count it as "other".
    metric_name: str | None = None
    # What logs and operators call this kind of handle.
    kind = "lock"

    # Options a handle seldom changes: read from the class until a handle is
    # given another value. A handle made per call (the decorator's) then has
    # fewer than the 30 attributes CPython keeps in a shared key table, and
    # its __dict__ is a fifth of the size, quicker to build and to read.
    label = ""
    renew_max: float | None = None
    on_lost: Callable[[Any], None] | None = None
    observer: Observer = DEFAULT_OBSERVER
    drift_factor = DEFAULT_DRIFT
    _grace_ms = int(DEFAULT_GRACE * 1000)
    replicas = 0
    replicas_timeout = DEFAULT_REPLICAS_TIMEOUT
    fair = True

    def __init__(
        self,
        client: ClientT,
        name: str,
        *,
        ttl: float = 30.0,
        wait: float = 10.0,
        keyspace: KeySpace | None = None,
        label: str = "",
        renew: bool = False,
        renew_max: float | None = None,
        on_lost: Callable[[Any], None] | None = None,
        observer: Observer | None = None,
        # Client clocks drift and Redis expires keys a little late or early:
        # the lease counts as ours for ttl*drift_factor + 2 ms less than asked.
        drift_factor: float = DEFAULT_DRIFT,
        grace: float = DEFAULT_GRACE,
        # WAIT for this many replicas to acknowledge each new lease (0: off);
        # fewer in time and the lease is given back (ReplicationTimeout).
        replicas: int = 0,
        replicas_timeout: float = DEFAULT_REPLICAS_TIMEOUT,
        # True: first come, first served. False: barging, a freed lease goes
        # to whoever asks first, within a bound (BARGE_LIMIT); locks only.
        fair: bool = True,
    ) -> None:
        self.client = client
        self.keyspace = keyspace if keyspace is not None else KeySpace.default()
        self.keys: LockKeys = self.keyspace.lock(name)
        self.name = name
        self._name_b = name.encode("utf-8", "surrogatepass")
        # What the lease stores of the name: nothing when its keys show it.
        self._stored_name = b"" if shows_name(self._name_b) else self._name_b
        self.ttl = check_seconds("ttl", ttl, allow_zero=False)
        self.wait = check_seconds("wait", wait, allow_zero=True)
        if label:
            self.label = label
        self.renew = bool(renew)
        if renew_max is not None:
            self.renew_max = check_seconds("renew_max", renew_max, allow_zero=False)
        if on_lost is not None:
            self.on_lost = on_lost
        if observer is not None:
            self.observer = observer
        if not 0 <= drift_factor < 0.5:
            raise ValueError(f"drift_factor must be between 0 and 0.5, got {drift_factor!r}")
        if drift_factor != DEFAULT_DRIFT:
            self.drift_factor = drift_factor
        if grace != DEFAULT_GRACE:
            self._grace_ms = int(check_seconds("grace", grace, allow_zero=False) * 1000)
        if type(replicas) is not int or replicas:
            self.replicas = check_replicas(replicas)
        if replicas_timeout != DEFAULT_REPLICAS_TIMEOUT:
            self.replicas_timeout = check_seconds(
                "replicas_timeout", replicas_timeout, allow_zero=False
            )
        if fair is not True:
            if fair is not False:
                raise TypeError(
                    "fair must be True (first come, first served: the default) or False "
                    f"(barging: more throughput, waiters served within a bound); got {fair!r}"
                )
            self.fair = False
        # Per-acquisition state. The token lives here, in the handle, and in
        # nothing shared: no other handle, thread or process can present it.
        self.token: str | None = None
        self.fence: int | None = None
        # The grant's serial, which the release sends so that a retry of it
        # can tell a release from a loss (lua/_prelude.lua): a lease's fence,
        # a private number for a permit or a reader; None when unknown.
        self._serial: int | None = None
        self.lost = False
        # Why and how the lease was lost, once it was (``engine/loss.py``).
        self.loss: Loss | None = None
        self._valid_until = 0.0
        self._acquired_at = 0.0
        # Who holds the lease (the thread or task that took it, as its owner
        # metadata names it; the driver sets it) and its TTL in seconds as
        # last set: for logs and for the report of a loss.
        self._who = ""
        self._ttl_s = self.ttl
        # The number of the acquire attempt in flight (protocol.Acquisition):
        # a lease handed over names it, and only the latest counts.
        self._round = 0
        # The wait the acquire in progress asked for, ms (0: none): in the
        # owner metadata it writes (``_owner_json``).
        self._asked_wait_ms = 0
        self._init_driver()
        self._pid = this_process.pid

    def _init_driver(self) -> None:
        """What the sync or asyncio driver keeps per handle (gate, owner)."""

    def __repr__(self) -> str:
        state = "held" if self.token else "free"
        return f"<{type(self).__name__} {self.name!r} {state} fence={self.fence}>"

    # -- arguments ----------------------------------------------------------
    def _ttl_ms(self, ttl: float | None) -> int:
        seconds = self.ttl if ttl is None else check_seconds("ttl", ttl, allow_zero=False)
        return max(1, int(seconds * 1000))

    def _wait_s(self, wait: float | None) -> float:
        return self.wait if wait is None else check_seconds("wait", wait, allow_zero=True)

    def _owner(self, who: str) -> str:
        template = self.metric_name
        # Set by the caller after construction: anything but a str is left out.
        return _owner_json(
            this_process.pid,
            who,
            self.label,
            template if isinstance(template, str) else None,
            self.renew,
            self._asked_wait_ms,
        )

    def owner_metadata(self, who: str) -> str:
        """The owner metadata (JSON) this handle writes with a lease it takes,
        naming ``who`` (a thread or an asyncio task): for a lease it came to
        hold another way, such as a unique task's ``adopt``."""
        return self._owner(who)

    def _validity(self, sent: float, ttl_ms: int) -> float:
        return validity(sent, ttl_ms, self.drift_factor)

    # -- state ----------------------------------------------------------------
    @property
    def held(self) -> bool:
        """True while this handle holds a lease it has not seen expire.

        Judged on this process's monotonic clock from the moment the acquire
        or extend was sent, so it turns False a little before Redis would
        expire the key: never after. False from the moment the handle learns
        that the lease is gone (a renewal, extend or release found it taken,
        cleared or expired), whatever time was left.
        """
        return self.remaining > 0

    @property
    def remaining(self) -> float:
        """Seconds of conservative validity left (0 when not held or lost)."""
        # A forked child inherits the handle, never the lease.
        if self.token is None or self.lost or self._pid != this_process.pid:
            return 0.0
        return max(0.0, self._valid_until - time.monotonic())

    def _new_token(self) -> str:
        # 64 random bits: no two acquisitions of one name ever share one, and
        # a short token keeps the state's memory of recent ones compact.
        return new_token()

    def _reset_unknown(self, exc: BaseException, sent: float, ttl_ms: int) -> None:
        """An extend, refresh or renewal sent at ``sent`` failed without an
        answer. It may have run all the same and set the lease to ``ttl_ms``
        from then, which can be sooner than the end counted so far (an extend
        to a shorter TTL): count only what both allow."""
        if may_have_run(exc):
            self._valid_until = min(self._valid_until, self._validity(sent, ttl_ms))

    def _granted(self, token: str, fence: int, sent: float, ttl_ms: int) -> None:
        self.token = token
        self.fence = int(fence)
        self._serial = int(fence) or None
        self.lost = False
        self.loss = None
        self._valid_until = self._validity(sent, ttl_ms)
        self._acquired_at = sent
        self._ttl_s = ttl_ms / 1000

    def log_fields(self, **more: Any) -> dict[str, Any]:
        """The structured fields of every record logged about this handle."""
        template = self.metric_name
        return {
            "lock_name": self.name,
            "template": template if isinstance(template, str) else None,
            "kind": self.kind,
            "owner": f"{_hostname()}:{self._pid}/{self._who or '?'}",
            "label": self.label,
            "fence": self.fence,
            **more,
        }

    @property
    def _forced_key(self) -> bytes:
        """Where a force-release leaves its mark for this name (``engine/loss.py``)."""
        return self.keyspace.forced(self.name)

    def _forget(self) -> None:
        self.token = None
        self._valid_until = 0.0

    # What a handle holds, for messages; semaphores say "permit". LockNotOwned's
    # messages: this handle holds nothing, or another thread or task took it.
    _holding = "lease"
    _not_held = "cannot {action} {name!r}: this handle does not hold it"
    _not_ours = "cannot {action} {name!r}: it was acquired by another {kind}"

    def _label(self) -> str:
        return f"lock {self.name!r}"

    def _settle_release(
        self, released: int, held: float, trace: Trace | None = None, valid_until: float = 0.0
    ) -> None:
        """After the release script: report a loss, or the release. ``trace``:
        what the read after a loss found; ``valid_until``: the validity the
        handle counted before it let the lease go."""
        if not released:
            self._mark_lost(f"the {self._holding} was gone at release", trace, valid_until)
        if self.lost:
            raise LockLost(f"{self._label()} was lost before it was released")
        self.observer.released(self, held)

    def _check_not_lost(self) -> None:
        if self.lost:
            raise LockLost(f"{self._label()} was already lost")

    def _settle_extend(
        self,
        ok: bool,
        action: str,
        token: str,
        sent: float,
        ttl_ms: int,
        trace: Trace | None = None,
    ) -> None:
        """After the extend or refresh script sent at ``sent``: report a loss,
        or count the lease (unless released meanwhile) from then."""
        if not ok:
            self._mark_lost(f"the {self._holding} was gone at {action}", trace)
            raise LockLost(f"{self._label()} was lost before it could be {action}ed")
        if self.token == token and not self.lost:
            self._valid_until = self._validity(sent, ttl_ms)
            self._ttl_s = ttl_ms / 1000

    def _mark_lost(
        self, reason: str, trace: Trace | None = None, valid_until: float | None = None
    ) -> None:
        """Report the loss once: why (``engine/loss.py``: ``trace`` is what the
        read after it found, None without one), then to the observer and
        ``on_lost``. ``valid_until``: the validity counted, if the handle
        already let it go (a release)."""
        now = time.monotonic()
        counted = self._valid_until if valid_until is None else valid_until
        # From here on the handle holds nothing (invariant 11), whatever time
        # its lease had left: `held` is False and `remaining` 0 before anyone
        # hears of it, the decorator's pre-commit check included.
        self._valid_until = 0.0
        if self.lost:
            return
        fence = self.fence if self.kind == "lock" else None
        cause, why, by, at = cause_of(trace, now=now, valid_until=counted, fence=fence)
        held = now - self._acquired_at
        self.loss = Loss(cause, f"{reason}: {why}", held, self._ttl_s, by, at)
        self.lost = True
        self.observer.lost(self, self.loss.reason)
        if self.on_lost is not None:
            try:
                self.on_lost(self)
            except Exception:
                log_lost.exception(
                    "on_lost callback of %r failed", self.name, extra=self.log_fields()
                )

    def _args_acquire(
        self, token: str, ttl_ms: int, who: str, wait_ms: int, address: bytes
    ) -> tuple:
        args = (
            token,
            ttl_ms,
            self._stored_name,
            self._owner(who),
            wait_ms,
            address,
            ttl_ms + STATE_KEEP_MS,
            self._round,
        )
        return args if self.fair else (*args, BARGE_LIMIT)

    def _acquire_reply(self, reply: Any) -> tuple[int, int]:
        """``(granted, fence or ms until a change)`` from the acquire script."""
        return acquire_reply(reply)

    def _release_args(self, token: str) -> tuple:
        # The serial last: a script from before it ignores it.
        serial = "" if self._serial is None else self._serial
        return (token, serial) if self.fair else (token, BARGE_LIMIT, serial)

    def _cancel_args(self, token: str) -> tuple:
        return (token,)

    def _extend_args(self, token: str, ttl_ms: int) -> tuple:
        return (token, ttl_ms)

    @property
    def _key_tuple(self) -> tuple[bytes, bytes, bytes]:
        k = self.keys
        return (k.lease, k.queue, k.state)
