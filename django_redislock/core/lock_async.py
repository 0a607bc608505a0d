"""``AsyncLock`` over ``redis.asyncio``: the same protocol and scripts as ``Lock``.

The asyncio driver, paired with ``lock.py`` (same order of definitions): it
sends, receives and waits; ``protocol.py`` decides. Wake-ups come from one
pub/sub reader task per event loop and pool (``notify_async.py``). An acquire
that is cancelled at any await gives back whatever it may have been granted,
shielded from the cancellation, so a cancelled task never leaves a lease
behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from types import TracebackType
from typing import Any, TypeVar

from redis.exceptions import RedisError

from . import giveback, scripts
from .aio_calls import (
    CLEANUP_TIMEOUT,
    cancel_requests,
    complete,
    keep_cancellation,
    raise_if_cancelled_since,
    wait_for,
)
from .base import LockBase, same_token
from .exceptions import (
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    RedisUnavailable,
    ReplicationTimeout,
)
from .notify_async import get_async_notifier
from .protocol import (
    BARGE_DEFER,
    Acquisition,
    Move,
    check_adopted,
    may_have_run,
    renew_interval,
    retry_renewal_in,
    short_of_replicas,
)

__all__ = ["AsyncHandle", "AsyncLock"]

log_acquire = logging.getLogger("django_redislock.acquire")
log_renew = logging.getLogger("django_redislock.renew")

_AH = TypeVar("_AH", bound="AsyncHandle")

# A release runs to the end even if its task is cancelled, within this bound
# (the client's socket timeout normally ends it much sooner).
_RELEASE_TIMEOUT = 10.0


class AsyncHandle(LockBase):
    """What ``AsyncLock`` and ``AsyncSemaphore`` share: the task gate, the wait
    loop, and giving back whatever a cancelled or timed-out attempt may hold.

    Shared between tasks, a handle behaves like ``asyncio.Lock``: a second
    task waits for the first to release, and only the task that acquired may
    release. Subclasses say how to try (``_attempt``), how to give back
    (``_cancel``, ``_cancel_script``) and what holding starts (``_on_acquired``).
    """

    # Takes the lease or permit, or queues for it; gives back whatever a
    # token may hold or be queued for (safe to repeat).
    _acquire_script: scripts.Script
    _cancel_script: scripts.Script
    # Whether a give-back must wait for the late reply of the call it follows
    # (else the late call could run after it and take what it gave back).
    _give_back_after_late_reply = True

    def _init_driver(self) -> None:
        self._gate: asyncio.Lock | None = None
        self._gate_loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self.retry_after: float | None = None

    async def _attempt(
        self, token: str, ttl_ms: int, who: str, wait_ms: int, address: bytes
    ) -> tuple[int, int]:
        """Run the acquire script once: (1, fence) or (0, ms until a change)."""
        args = self._args_acquire(token, ttl_ms, who, wait_ms, address)
        if not self.replicas:
            reply = await scripts.run_async(
                self.client, self._acquire_script, self._key_tuple, args
            )
            return self._acquire_reply(reply)
        reply, acked = await scripts.run_acked_async(
            self.client,
            self._acquire_script,
            self._key_tuple,
            args,
            self.replicas,
            self.replicas_timeout,
        )
        granted, value = self._acquire_reply(reply)
        if short_of_replicas(granted, acked, self.replicas):
            await self._cancel(token)
            raise ReplicationTimeout(
                self.name, acked=acked, wanted=self.replicas, timeout=self.replicas_timeout
            )
        return granted, value

    async def _cancel(self, token: str) -> None:
        """Give back whatever ``token`` may hold or be queued for."""
        try:
            await complete(self._cancel_call(token), CLEANUP_TIMEOUT)
        except (RedisUnavailable, asyncio.TimeoutError) as exc:
            # A queue entry expires at its deadline, a lease or permit handed
            # to us unheard with its TTL; until then, keep trying off our path.
            log_acquire.info("could not leave the queue of %r: %r", self.name, exc)
            self._give_back_later(token, after=exc)

    def _on_acquired(self, ttl_ms: int) -> None:
        """Called once the handle holds what it asked for."""

    def _already_held(self) -> LockError:
        return LockError(
            f"lock {self.name!r} is already held by this handle in this task; "
            "locks are not reentrant: release it first or use another name"
        )

    def _get_gate(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._gate is None or self._gate_loop is not loop:
            self._gate = asyncio.Lock()
            self._gate_loop = loop
        return self._gate

    async def acquire(self, wait: float | None = None, *, ttl: float | None = None) -> bool:
        """Take it, waiting up to ``wait`` seconds (0: try once)."""
        wait_s = self._wait_s(wait)
        ttl_ms = self._ttl_ms(ttl)
        me = asyncio.current_task()
        if self.token is not None and self._task is me:
            raise self._already_held()
        started = time.monotonic()
        gate = self._get_gate()
        if wait_s > 0:
            try:
                await wait_for(gate.acquire(), wait_s, undo=gate.release)
            except asyncio.TimeoutError:
                self.observer.busy(self, time.monotonic() - started)
                return False
        elif gate.locked():
            self.observer.busy(self, 0.0)
            return False
        else:
            await gate.acquire()
        try:
            acquired = await self._acquire(started + wait_s, ttl_ms)
        except BaseException:
            gate.release()
            raise
        if not acquired:
            gate.release()
            self.observer.busy(self, time.monotonic() - started)
            return False
        self._task = me
        self._on_acquired(ttl_ms)
        self.observer.acquired(self, time.monotonic() - started)
        return True

    async def _acquire(self, deadline: float, ttl_ms: int) -> bool:
        token = self._new_token()
        task = asyncio.current_task()
        who = task.get_name() if task is not None else "?"
        now = time.monotonic()
        acq = Acquisition(
            ttl_ms=ttl_ms,
            deadline=deadline,
            drift_factor=self.drift_factor,
            can_take_handed=not self.replicas,
            now=now,
            defer=0.0 if self.fair else BARGE_DEFER,
        )
        notifier = get_async_notifier(self.client, self.keyspace) if deadline > now else None
        tag = self.keys.tag  # on a Cluster, the wake-up channel lives in this slot
        event = None
        if notifier is not None and notifier.is_ready(tag):
            event = notifier.register(token, tag)
            acq.listening_on(notifier.address_for(tag))
        cancels = cancel_requests()
        try:
            while True:
                if (
                    event is not None
                    and notifier is not None
                    and acq.queued_without_channel
                    and notifier.is_ready(tag)
                ):
                    # Queued while the channel was down; it is up now: queue
                    # again with it, so that our turn wakes us.
                    acq.channel_up(notifier.address_for(tag))
                self._round, wait_ms = acq.attempt(time.monotonic())
                granted, value = await keep_cancellation(
                    self._attempt(token, ttl_ms, who, wait_ms, acq.address)
                )
                # redis-py's send may have swallowed our cancellation (3.11).
                raise_if_cancelled_since(cancels)
                step = acq.on_reply(granted, value, time.monotonic())
                self.retry_after = acq.retry_after
                if step.move is Move.LISTEN and notifier is not None:
                    event = notifier.register(token, tag)
                    up = await notifier.wait_ready(step.timeout, tag)
                    acq.listening_on(notifier.address_for(tag) if up else None)
                    continue
                if step.move is Move.SLEEP and event is not None and notifier is not None:
                    # Marked first, so that the channel coming up wakes us;
                    # if it came up meanwhile, queue again with it at once.
                    event.needs_channel = acq.queued_without_channel
                    if event.needs_channel and notifier.is_ready(tag):
                        continue
                    with contextlib.suppress(asyncio.TimeoutError):
                        await wait_for(event.wait(), step.timeout)
                    handed, event.handed = event.handed, None
                    event.clear()
                    step = acq.on_wakeup(handed, time.monotonic())
                    while step.move is Move.SLEEP:
                        # Barging: woken to look again, it lets the releaser go first.
                        with contextlib.suppress(asyncio.TimeoutError):
                            await wait_for(event.wait(), step.timeout)
                        handed, event.handed = event.handed, None
                        event.clear()
                        step = acq.on_wakeup(handed, time.monotonic())
                    if step.move is Move.RETRY:
                        continue
                if step.move is Move.ACCEPT:
                    self._granted(token, step.fence, acq.sent, ttl_ms)
                    return True
                if step.move is Move.GIVE_BACK:
                    log_acquire.warning("acquire reply for %r came after its validity", self.name)
                    await self._cancel(token)
                elif acq.queued:
                    await self._cancel(token)  # out of time: leave the queue
                return False
        except RedisUnavailable as exc:
            if may_have_run(exc):
                # The script may have granted or queued us, or may yet, once
                # Redis reads it: give it back, off the caller's path.
                self._give_back_later(token, after=exc)
            raise
        except BaseException:
            # Cancelled or interrupted at some await: the script may have run
            # and granted us what we asked. Give it back, whatever happens to us.
            await self._cancel(token)
            raise
        finally:
            if event is not None and notifier is not None:
                notifier.unregister(token)

    def _give_back_later(self, token: str, after: BaseException | None = None) -> None:
        """Give back whatever ``token`` may hold, retried off the caller's
        path until Redis answers or the lease would have ended anyway;
        ``after``: the failed call it follows, whose late reply comes first."""
        giveback.submit_async(
            lambda: self._cancel_call(token),
            within=self.ttl,
            after=after if self._give_back_after_late_reply else None,
            what=self._label(),
        )

    async def _cancel_call(self, token: str) -> None:
        await scripts.run_async(
            self.client, self._cancel_script, self._key_tuple, self._cancel_args(token)
        )

    # -- context manager ---------------------------------------------------------
    async def __aenter__(self: _AH) -> _AH:
        if not await self.acquire():
            raise LockNotAcquired(self.name, retry_after=self.retry_after)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.release()
        except LockError:
            if exc_type is None:
                raise

    async def _release_call(self, token: str) -> int:
        """Run the release script: 1 when released, 0 when not held."""
        raise NotImplementedError

    def _check_owner(self, action: str) -> str:
        """The token, if this thread or task may ``action`` it; else LockNotOwned."""
        raise NotImplementedError

    def _stop_renewal(self) -> None:
        """Called before releasing; renewing handles stop their renewal task."""

    async def release(self) -> None:
        """Give it back. Raises ``LockLost`` if it had been lost meanwhile,
        ``RedisUnavailable`` if Redis did not answer (the give-back then goes
        on off the caller's path until Redis answers or the lease ends)."""
        token = self._check_owner("release")
        self._stop_renewal()
        held = time.monotonic() - self._acquired_at
        # Forget first, as Lock.release does: a renewal in flight that finds
        # the lease gone must see that we let it go, not report it lost.
        self._forget()
        try:
            # Runs to the end even if this task is cancelled (see complete).
            released = await complete(self._release_call(token), _RELEASE_TIMEOUT)
        except asyncio.TimeoutError as exc:
            self._give_back_later(token, after=exc)
            raise RedisUnavailable(f"release of {self.name!r} did not finish in time") from exc
        except RedisUnavailable as exc:
            self._give_back_later(token, after=exc)
            raise
        finally:
            self._task = None
            if self._gate is not None and self._gate.locked():
                self._gate.release()
        self._settle_release(released, held)


class AsyncLock(AsyncHandle):
    """``Lock`` for asyncio. Shared between tasks it behaves like ``asyncio.Lock``:
    a second task waits for the first to release, and only the task that
    acquired may release or extend the lease. ``fair=False``: the barging
    order, as for ``Lock``.
    """

    _acquire_script = scripts.ACQUIRE
    _cancel_script = scripts.CANCEL
    # The lock's cancel remembers the token and its acquire then grants
    # nothing: the give-back need not wait for a late reply that may never
    # come (a reply lost on the way), it frees the name as soon as Redis answers.
    _give_back_after_late_reply = False

    def _init_driver(self) -> None:
        super()._init_driver()
        self._renewer: asyncio.Task[None] | None = None
        self._ttl_ms_held = 0
        if not self.fair:
            # Barging (see _barging.lua): its own scripts; the FIFO ones are untouched.
            self._acquire_script = scripts.ACQUIRE_BARGING

    def _on_acquired(self, ttl_ms: int) -> None:
        self._ttl_ms_held = ttl_ms
        if self.renew:
            self._renewer = asyncio.get_running_loop().create_task(
                self._renew_loop(), name=f"redislock-renew:{self.name[:40]}"
            )

    async def _release_call(self, token: str) -> int:
        script = scripts.RELEASE if self.fair else scripts.RELEASE_BARGING
        args = self._release_args(token)
        return int(await scripts.run_async(self.client, script, self._key_tuple, args))

    # -- release / extend ---------------------------------------------------------
    def _check_owner(self, action: str) -> str:
        if self.token is None:
            raise LockNotOwned(f"cannot {action} {self.name!r}: this handle does not hold it")
        if self._task is not asyncio.current_task():
            raise LockNotOwned(f"cannot {action} {self.name!r}: it was acquired by another task")
        return self.token

    def _stop_renewal(self) -> None:
        renewer, self._renewer = self._renewer, None
        if renewer is not None and renewer is not asyncio.current_task():
            renewer.cancel()

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the lease to ``ttl`` seconds (default: the handle's) from now."""
        token = self._check_owner("extend")
        if self.lost:
            raise LockLost(f"lock {self.name!r} was already lost")
        ttl_ms = self._ttl_ms(ttl)
        sent = time.monotonic()
        try:
            ok = await self._extend_call(token, ttl_ms)
        except RedisUnavailable as exc:
            self._reset_unknown(exc, sent, ttl_ms)
            raise
        if not ok:
            self._mark_lost("the lease was gone at extend (expired, cleared or lost by Redis)")
            raise LockLost(f"lock {self.name!r} was lost before it could be extended")
        self._ttl_ms_held = ttl_ms
        if self.token == token and not self.lost:
            self._valid_until = self._validity(sent, ttl_ms)

    async def _extend_call(self, token: str, ttl_ms: int) -> bool:
        return bool(
            await scripts.run_async(self.client, scripts.EXTEND, self._key_tuple, (token, ttl_ms))
        )

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
        """Hold the lease that another handle took as ``token`` with ``fence``;
        as ``Lock.adopt``."""
        token, fence = check_adopted(token, fence)
        ttl_ms = self._ttl_ms(ttl)
        me = asyncio.current_task()
        if self.token is not None and self._task is me:
            raise self._already_held()
        gate = self._get_gate()
        if gate.locked():
            raise LockError(
                f"lock {self.name!r}: this handle is held by another task; "
                "adopt with a handle of its own"
            )
        await gate.acquire()
        sent = time.monotonic()
        try:
            ok = await self._extend_call(token, ttl_ms)
        except BaseException:
            gate.release()
            raise
        if not ok:
            gate.release()
            return False
        self._granted(token, fence, sent, ttl_ms)
        self._task = me
        self._on_acquired(ttl_ms)
        log_acquire.debug("adopted %r fence=%s", self.name, fence)
        return True

    async def detach(self, ttl: float | None = None) -> str:
        """Stop holding the lease without releasing it; as ``Lock.detach``."""
        token = self._check_owner("detach")
        try:
            if self.lost:
                raise LockLost(f"lock {self.name!r} was already lost")
            await self.extend(ttl)
        finally:
            self._stop_renewal()
            self._forget()
            self._task = None
            if self._gate is not None and self._gate.locked():
                self._gate.release()
        return token

    async def _renew_loop(self) -> None:
        """The renewal task: ``Lock._renew_once`` in a loop, on this event loop."""
        token = self.token
        started = self._acquired_at
        delay: float | None = renew_interval(self._ttl_ms_held)
        while delay is not None:
            await asyncio.sleep(delay)
            if self.token != token or token is None or self.lost:
                return
            if self.renew_max is not None and time.monotonic() - started >= self.renew_max:
                log_renew.info("stopped renewing %r after renew_max", self.name)
                return
            ttl_ms = self._ttl_ms_held
            sent = time.monotonic()
            try:
                ok = await self._extend_call(token, ttl_ms)
            except RedisUnavailable as exc:
                self._reset_unknown(exc, sent, ttl_ms)
                delay = retry_renewal_in(self._valid_until, sent, time.monotonic(), ttl_ms)
                if delay is None and self.token == token:
                    self._mark_lost(f"could not renew before the lease ran out: {exc}")
                continue
            if self.token != token:
                return  # released while we were renewing: nothing to report
            if not ok:
                self._mark_lost("the lease was gone at renewal (expired, cleared or lost by Redis)")
                return
            if not self.lost:
                self._valid_until = self._validity(sent, ttl_ms)
            delay = renew_interval(ttl_ms)
