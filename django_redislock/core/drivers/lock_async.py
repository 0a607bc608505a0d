"""``AsyncLock``: a Redis lease with fencing, fair queueing and notification wake-ups.

Protocol, one round trip each when uncontended:

* acquire runs ``acquire.lua``: it grants the lease (writing token, fence and
  owner in one go) or, if the caller will wait, appends the caller to the
  lock's FIFO queue along with the process's wake-up channel.
* release runs ``release.lua``: compare-token delete, then the lease is
  handed straight to the oldest live waiter, which is woken through its
  channel with its fence: it holds the lock as it wakes, no second round trip.

Because a freed lock goes straight to the oldest waiter, nobody can barge in
and waits are first come first served across processes. ``fair=False`` opts
into barging instead (``acquire.lua`` told the barging limit, and
``release_barging.lua``): a release frees the lease and wakes the oldest
waiter to look again, and whoever asks first takes it, until the head of the
queue has seen ``BARGE_LIMIT`` others served; then it is handed over as above.

This module is the driver: it sends, receives and waits. What a reply means
and what to do next is decided in ``protocol.py``. It is written once, for
asyncio, and ``tools/gen_sync.py`` makes the sync driver from it by renaming
and dropping ``async`` and ``await``: edit the asyncio source, never the
generated file. What threads and tasks do
differently (the gate, who holds a handle, cancellation, where renewal runs)
lives in the primitives module imported below.

Waiting and giving back are ``AsyncHandle``'s (``handle_async.py``): waiters
sleep on the process's wake-up channel, one connection however many wait,
and an acquire interrupted or cancelled at any point gives back whatever it
may have been granted, so a lease is never left behind it.
"""

from __future__ import annotations

import logging
import time

from redis.exceptions import RedisError

from ..engine import scripts
from ..engine.protocol import (
    check_adopted,
    renew_interval,
    retry_renewal_in,
)
from ..exceptions import (
    LockError,
    RedisUnavailable,
)
from ..process import this_process
from ._async_prims import (
    HOLDER_KIND,
    Renewer,
    current_name,
    start_renewal,
    stop_renewal,
)
from .base import same_token
from .handle_async import AsyncHandle

__all__ = ["AsyncHandle", "AsyncLock"]

log_acquire = logging.getLogger("django_redislock.acquire")
log_renew = logging.getLogger("django_redislock.renew")


class AsyncLock(AsyncHandle):
    """A lock on ``name`` in Redis, held by this handle.

    ``AsyncLock(client, "purchase:7", ttl=30, wait=10)``. A handle is
    reusable: it may be acquired again after release. Shared between threads
    (sync) or tasks (asyncio), it behaves like ``threading.Lock`` or
    ``asyncio.Lock``: a second holder waits for the first to release, and
    only the one that acquired may release or extend. Not reentrant.

    ``fair=False`` takes it in the barging order (``docs/locks.rst``): a release
    frees the lease and wakes the oldest waiter to look again, whoever asks
    first takes it, and the head of the queue is served within ``BARGE_LIMIT``
    others. More throughput for a hot lock, longer tail waits.
    """

    _acquire_script = scripts.ACQUIRE
    _cancel_script = scripts.CANCEL
    _release_script = scripts.RELEASE
    _extend_script = scripts.EXTEND
    # The lock's cancel remembers the token and its acquire then grants
    # nothing: the give-back need not wait for a late reply that may never
    # come (a reply lost on the way), it frees the name as soon as Redis answers.
    _give_back_after_late_reply = False

    def _init_driver(self) -> None:
        super()._init_driver()
        self._renewer: Renewer | None = None
        self._ttl_ms_held = 0
        # The longest a failed renewal took since Redis last answered one.
        self._renew_slowest = 0.0
        if not self.fair:
            # Barging: the acquire script told its limit, and a release of its own.
            self._acquire_script = scripts.ACQUIRE_BARGING
            self._release_script = scripts.RELEASE_BARGING

    def _on_acquired(self, ttl_ms: int) -> None:
        self._ttl_ms_held = ttl_ms
        if self.renew:
            self._renew_slowest = 0.0
            self._renewer = start_renewal(self, renew_interval(ttl_ms))

    # -- release / extend ---------------------------------------------------------
    def _stop_renewal(self) -> None:
        renewer, self._renewer = self._renewer, None
        stop_renewal(self, renewer)

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the lease to ``ttl`` seconds (default: the handle's) from now."""
        self._ttl_ms_held = await self._extend("extend", ttl)

    async def owned(self) -> bool:
        """Ask Redis whether this handle still holds the lease (one round trip)."""
        token = self.token
        if token is None or not self.held:
            return False
        try:
            current = await self.client.hget(self.keys.lease, "t")
        except RedisError as exc:
            raise RedisUnavailable(f"could not check lock {self.name!r}: {exc}") from exc
        return same_token(current, token) and self.held

    async def adopt(self, token: str, fence: int, *, ttl: float | None = None) -> bool:
        """Hold the lease that another handle took as ``token`` with ``fence``.

        For a lease handed across processes (a task's enqueuer to the worker
        that runs it): one round trip resets it to ``ttl`` seconds (default:
        the handle's) from now if ``token`` still holds it, and from then on
        this handle holds it as if it had acquired it, renewal included.
        Returns False, holding nothing, when ``token`` no longer holds it.
        """
        token, fence = check_adopted(token, fence)
        ttl_ms = self._ttl_ms(ttl)
        me = self._claim()
        if not await self._gate.acquire(0):
            raise LockError(
                f"lock {self.name!r}: this handle is held by another {HOLDER_KIND}; "
                "adopt with a handle of its own"
            )
        sent = time.monotonic()
        try:
            ok = await self._extend_call(token, ttl_ms)
        except BaseException:
            self._gate.release()
            raise
        if not ok:
            self._gate.release()
            return False
        self._granted(token, fence, sent, ttl_ms)
        self._who = current_name()
        self._holder = me
        self._on_acquired(ttl_ms)
        log_acquire.debug("adopted %r fence=%s", self.name, fence, extra=self.log_fields())
        return True

    async def detach(self, ttl: float | None = None) -> str:
        """Stop holding the lease without releasing it, for a handle to ``adopt``.

        The lease is reset to ``ttl`` seconds (default: the handle's) from now
        and no longer renewed; returns its token. Raises ``LockLost`` (and the
        handle holds nothing) if the lease was gone.
        """
        token = self._check_owner("detach")
        try:
            self._check_not_lost()
            await self.extend(ttl)
        finally:
            self._stop_renewal()
            self._forget()
            self._holder = None
            self._gate.release()
        return token

    async def _renew_once(self) -> float | None:
        """One renewal: seconds until the next, or None to stop."""
        token = self.token
        if token is None or self.lost or self._pid != this_process.pid:
            return None
        if self.renew_max is not None and time.monotonic() - self._acquired_at >= self.renew_max:
            log_renew.info(
                "stopped renewing %r after renew_max", self.name, extra=self.log_fields()
            )
            return None
        ttl_ms = self._ttl_ms_held
        sent = time.monotonic()
        try:
            ok = await self._extend_call(token, ttl_ms)
        except RedisUnavailable as exc:
            self._reset_unknown(exc, sent, ttl_ms)
            now = time.monotonic()
            self._renew_slowest = max(self._renew_slowest, now - sent)
            delay = retry_renewal_in(self._valid_until, now, self._renew_slowest, ttl_ms)
            if delay is None and self.token == token:
                self._mark_lost(f"could not renew before the lease ran out: {exc}")
            return delay
        if self.token != token:
            return None  # released while we were renewing: nothing to report
        if not ok:
            self._mark_lost("the lease was gone at renewal", await self._loss_trace(token))
            return None
        self._renew_slowest = 0.0
        if not self.lost:
            self._valid_until = self._validity(sent, ttl_ms)
        return renew_interval(ttl_ms)
