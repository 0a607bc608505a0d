"""``AsyncHandle``: what every waiting primitive does with Redis, written once.

The gate (a handle shared between threads or tasks is held by one at a time),
the wait loop (attempt, listen, sleep on the process's wake-up channel,
``wakeups_async.py``, accept or give back), and giving back whatever an
interrupted, cancelled or timed-out attempt may hold, so a lease is never
left behind it. ``AsyncLock``, ``AsyncSemaphore`` and ``AsyncReadWriteLock``
say how to try and how to give back.

What a reply means and what to do next is decided in ``protocol.py``. It is
written once, for asyncio, and ``tools/gen_sync.py`` makes the sync module
from it: edit the asyncio source, never the generated file. What threads and
tasks do differently lives in the primitives module imported below.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol, TypeVar

from redis.exceptions import RedisError

from ..clients import AsyncRedisClient
from ..engine import scripts
from ..engine.keys import LockKeys
from ..engine.loss import Trace, inquiry, trace_of
from ..engine.protocol import (
    BARGE_DEFER,
    Acquisition,
    Move,
    may_have_run,
    short_of_replicas,
)
from ..exceptions import (
    LockError,
    LockNotAcquired,
    LockNotOwned,
    RedisUnavailable,
    ReplicationTimeout,
)
from ..failures import said_retry
from ..io import calls_async, giveback_async
from ..io.wakeups_async import get_async_notifier
from ..process import this_process
from ._async_prims import (
    CLEANUP_TIMEOUT,
    HOLDER_KIND,
    CallTimeout,
    Cancelled,
    Gate,
    Holder,
    cancel_requests,
    complete,
    current_holder,
    current_name,
    keep_cancellation,
    pause,
    raise_if_cancelled_since,
)
from .base import DEFAULT_GRACE, LockBase, after_block

__all__ = ["AsyncHandle", "AsyncHeldInBlock", "clear_holders_async"]

log_acquire = logging.getLogger("django_redislock.acquire")


class _Takes(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def retry_after(self) -> float | None: ...
    async def acquire(self) -> bool: ...
    async def release(self) -> None: ...


_T = TypeVar("_T", bound=_Takes)

# A release runs to the end even if its task is cancelled, within this bound
# (the client's socket timeout normally ends it much sooner).
_RELEASE_TIMEOUT = 10.0


async def clear_holders_async(
    client: AsyncRedisClient, script: scripts.Script, keys: LockKeys, token: str | None
) -> int:
    """Force-release the holder ``token`` (every one, when None) of a kind whose
    holders share a sorted set, with its ``script``: how many went, unclaimed
    reservations included."""
    args = (int(DEFAULT_GRACE * 1000), token or "")
    return int(
        await calls_async.run_async(client, script, (keys.lease, keys.queue, keys.state), args)
    )


class AsyncHeldInBlock:
    """``async with``: acquire, or raise ``LockNotAcquired`` when it stays busy;
    release at the end, the block's own exception passing through unchanged."""

    async def __aenter__(self: _T) -> _T:
        if not await self.acquire():
            raise LockNotAcquired(self.name, retry_after=self.retry_after)
        return self

    async def __aexit__(self: _Takes, exc_type: type[BaseException] | None, *_: object) -> None:
        with after_block(exc_type):
            await self.release()


class AsyncHandle(LockBase[AsyncRedisClient], AsyncHeldInBlock):
    """What ``AsyncLock`` and ``AsyncSemaphore`` share: the gate, the wait
    loop, and giving back whatever an interrupted or timed-out attempt may hold.

    Shared between threads (sync) or tasks (asyncio), a handle behaves like
    ``threading.Lock`` or ``asyncio.Lock``: a second holder waits for the
    first to release, and only the one that acquired may release. Subclasses
    say how to try (``_attempt``), how to give back (``_cancel``,
    ``_cancel_script``) and what holding starts (``_on_acquired``).
    """

    # Takes the lease or permit, or queues for it; gives back whatever a
    # token may hold or be queued for (safe to repeat); releases what a token
    # holds and serves the queue (1: released, 0: not held); resets what it
    # holds to a new TTL (0: not held).
    _acquire_script: scripts.Script
    _cancel_script: scripts.Script
    _release_script: scripts.Script
    _extend_script: scripts.Script
    # Whether a give-back must wait for the late reply of the call it follows
    # (else the late call could run after it and take what it gave back).
    _give_back_after_late_reply = True

    def _init_driver(self) -> None:
        self._gate = Gate()
        # The thread or task that holds the handle (None: nobody).
        self._holder: Holder | None = None
        self.retry_after: float | None = None

    async def _attempt(
        self, token: str, ttl_ms: int, who: str, wait_ms: int, address: bytes
    ) -> tuple[int, int]:
        """Run the acquire script once: (1, fence) or (0, ms until a change)."""
        args = self._args_acquire(token, ttl_ms, who, wait_ms, address)
        if not self.replicas:
            reply = await calls_async.run_async(
                self.client, self._acquire_script, self._key_tuple, args
            )
            return self._acquire_reply(reply)
        reply, acked = await calls_async.run_acked_async(
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
            # To the end, even if the caller is cancelled meanwhile (asyncio).
            await complete(self._cancel_call(token), CLEANUP_TIMEOUT)
        except (RedisUnavailable, CallTimeout) as exc:
            # A queue entry expires at its deadline, a lease or permit handed
            # to us unheard with its TTL; until then, keep trying off our path.
            log_acquire.info(
                "could not leave the queue of %r: %r", self.name, exc, extra=self.log_fields()
            )
            self._give_back_later(token, after=exc)

    def _on_acquired(self, ttl_ms: int) -> None:
        """Called once the handle holds what it asked for."""

    def _claim(self) -> Holder | None:
        """Who takes the handle: the running thread or task (a forked child's
        handle starts free); ``LockError`` if it holds the handle already."""
        if self._pid != this_process.pid:
            self._detach_after_fork()
        me = current_holder()
        if self.token is not None and self._holder == me:
            raise self._already_held()
        return me

    def _already_held(self) -> LockError:
        return LockError(
            f"lock {self.name!r} is already held by this handle in this {HOLDER_KIND}; "
            "locks are not reentrant: release it first or use another name"
        )

    async def acquire(self, wait: float | None = None, *, ttl: float | None = None) -> bool:
        """Take it, waiting up to ``wait`` seconds (0: try once).

        Returns True when held, False when it stayed busy. Raises
        ``RedisUnavailable`` when Redis cannot be reached: that is not busy.
        """
        wait_s = self._wait_s(wait)
        ttl_ms = self._ttl_ms(ttl)
        me = self._claim()
        started = time.monotonic()
        self._asked_wait_ms = int(wait_s * 1000)
        if not await self._gate.acquire(wait_s):
            self.observer.busy(self, time.monotonic() - started)
            return False
        try:
            acquired = await self._acquire(started + wait_s, ttl_ms)
        except BaseException:
            self._gate.release()
            raise
        if not acquired:
            self._gate.release()
            self.observer.busy(self, time.monotonic() - started)
            return False
        self._holder = me
        try:
            self._on_acquired(ttl_ms)
            self.observer.acquired(self, time.monotonic() - started)
        except BaseException:
            # Between the grant and the return (an interrupt, a broken
            # observer): the caller will never release what it does not know
            # it holds, and a renewal would keep it for ever. Let it go.
            self._let_go()
            raise
        return True

    async def _acquire(self, deadline: float, ttl_ms: int) -> bool:
        token = self._new_token()
        who = current_name()
        now = time.monotonic()
        acq = Acquisition(
            ttl_ms=ttl_ms,
            deadline=deadline,
            drift_factor=self.drift_factor,
            can_take_handed=not self.replicas,
            now=now,
            defer=0.0 if self.fair else BARGE_DEFER,
        )
        # Only a process already listening queues on the first attempt; the
        # uncontended path must not start a channel or wait for one.
        notifier = get_async_notifier(self.client, self.keyspace) if deadline > now else None
        tag = self.keys.tag  # on a Cluster, the wake-up channel lives in this slot
        event = None
        if notifier is not None:
            event = notifier.register_if_ready(token, tag)
            if event is not None:
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
                try:
                    granted, value = await keep_cancellation(
                        self._attempt(token, ttl_ms, who, wait_ms, acq.address)
                    )
                except RedisUnavailable as exc:
                    # Redis said the script did not run and may if sent
                    # again (a Cluster's slot migrating, or failing over):
                    # again, after a pause, within the caller's wait.
                    pause_s = acq.on_refused(said_retry(exc), time.monotonic())
                    if pause_s is None:
                        raise
                    await pause(pause_s)
                    continue
                # redis-py's send may have swallowed our cancellation (3.11).
                raise_if_cancelled_since(cancels)
                step = acq.on_reply(granted, value, time.monotonic())
                self.retry_after = acq.retry_after
                if step.move is Move.LISTEN and notifier is not None:
                    # First contention in this process: start listening, then
                    # queue at once (the channel must be there to hear our turn).
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
                    handed = await notifier.wait(event, step.timeout)
                    step = acq.on_wakeup(handed, time.monotonic())
                    while step.move is Move.SLEEP:
                        # Barging: woken to look again, it lets the releaser go first.
                        handed = await notifier.wait(event, step.timeout)
                        step = acq.on_wakeup(handed, time.monotonic())
                    if step.move is Move.RETRY:
                        continue
                if step.move is Move.ACCEPT:
                    self._granted(token, step.fence, acq.sent, ttl_ms)
                    self._who = who
                    return True
                if step.move is Move.GIVE_BACK:
                    log_acquire.warning(
                        "acquire reply for %r came after its validity",
                        self.name,
                        extra=self.log_fields(),
                    )
                    await self._cancel(token)
                elif acq.queued:
                    await self._cancel(token)  # out of time: leave the queue
                return False
        except RedisUnavailable as exc:
            # The script may have granted or queued us, or may yet, once
            # Redis reads it; or an earlier attempt queued us and this one was
            # not sent (a breaker open): give it back, off the caller's path.
            if may_have_run(exc) or (acq.queued and acq.round > 1):
                self._give_back_later(token, after=exc)
            raise
        except BaseException:
            # Interrupted (a signal's KeyboardInterrupt or SystemExit) or,
            # asyncio, cancelled at some await: the script may have run and
            # granted us what we asked. Give it back (one bounded call, then
            # off our path), and the interrupt goes on as itself.
            await self._cancel(token)
            raise
        finally:
            if event is not None and notifier is not None:
                notifier.unregister(token)

    def _let_go(self) -> None:
        """Stop holding at once, without waiting for Redis: the renewal
        stopped, the gate freed, the give-back off the caller's path."""
        token = self.token
        self._stop_renewal()
        self._forget()
        self._holder = None
        self._gate.release()
        if token is not None:
            self._give_back_later(token)

    def _give_back_later(self, token: str, after: BaseException | None = None) -> None:
        """Give back whatever ``token`` may hold, retried off the caller's
        path until Redis answers or the lease would have ended anyway;
        ``after``: the failed call it follows, whose late reply comes first."""
        giveback_async.submit_async(
            lambda: self._cancel_call(token),
            within=self.ttl,
            after=after if self._give_back_after_late_reply else None,
            what=self._label(),
        )

    async def _cancel_call(self, token: str) -> Any:
        script, args = self._cancel_script, self._cancel_args(token)
        return await calls_async.run_async(self.client, script, self._key_tuple, args)

    def _detach_after_fork(self) -> None:
        # A child inherits the parent's handle, not what it holds: it starts free.
        self._pid = this_process.pid
        self._gate = Gate()
        self._holder = None
        self._forget()

    async def _in_sorted_set(self) -> bool:
        """``owned()`` of the kinds whose holders are members of a sorted set
        scored by expiry (a semaphore's permits, a read-write lock's turns)."""
        token = self.token
        if token is None or not self.held:
            return False
        try:
            score = await self.client.zscore(self.keys.lease, token)
        except RedisError as exc:
            raise RedisUnavailable(f"could not check {self._label()}: {exc}") from exc
        return score is not None and self.held

    async def _extend(self, action: str, ttl: float | None) -> int:
        """``extend`` or ``refresh``: reset what this handle holds to ``ttl``
        seconds (default: the handle's) from now; returns the new TTL in ms."""
        token = self._check_owner(action)
        self._check_not_lost()
        ttl_ms = self._ttl_ms(ttl)
        sent = time.monotonic()
        try:
            ok = await self._extend_call(token, ttl_ms)
        except RedisUnavailable as exc:
            self._reset_unknown(exc, sent, ttl_ms)
            raise
        trace = None if ok else await self._loss_trace(token)
        self._settle_extend(ok, action, token, sent, ttl_ms, trace)
        return ttl_ms

    async def _loss_trace(self, token: str) -> Trace | None:
        """After a loss, one bounded read of why (``engine/loss.py``): the
        force-release mark of ``token`` and the name's state. None when Redis
        does not answer: the holder's clock alone says then."""
        try:
            replies = await calls_async.call_async(
                self.client, inquiry(self.keys, self._forced_key, token), self.keys.state
            )
        except calls_async.CallFailed:
            return None
        return trace_of(replies)

    async def _extend_call(self, token: str, ttl_ms: int) -> bool:
        script, args = self._extend_script, self._extend_args(token, ttl_ms)
        return bool(await calls_async.run_async(self.client, script, self._key_tuple, args))

    async def _release_call(self, token: str) -> int:
        script, args = self._release_script, self._release_args(token)
        return int(await calls_async.run_async(self.client, script, self._key_tuple, args))

    def _check_owner(self, action: str) -> str:
        """The token, if this thread or task may ``action`` it; else LockNotOwned."""
        # A forked child inherits the handle, never what it holds.
        if self.token is None or self._pid != this_process.pid:
            raise LockNotOwned(self._not_held.format(action=action, name=self.name))
        if self._holder != current_holder():
            raise LockNotOwned(
                self._not_ours.format(action=action, name=self.name, kind=HOLDER_KIND)
            )
        return self.token

    def _stop_renewal(self) -> None:
        """Called before releasing; renewing handles stop their renewal."""

    async def release(self) -> None:
        """Give it back. Raises ``LockLost`` if it had been lost meanwhile,
        ``RedisUnavailable`` if Redis did not answer (the give-back then goes
        on off the caller's path until Redis answers or the lease ends)."""
        token = self._check_owner("release")
        self._stop_renewal()
        held = time.monotonic() - self._acquired_at
        valid_until = self._valid_until
        # Forget first: a renewal in flight that finds the lease gone must see
        # that we let it go, not report it lost.
        self._forget()
        try:
            # To the end, even if the caller is cancelled meanwhile (asyncio).
            released = await complete(self._release_call(token), _RELEASE_TIMEOUT)
        except CallTimeout as exc:
            self._give_back_later(token, after=exc)
            raise RedisUnavailable(f"release of {self.name!r} did not finish in time") from exc
        except RedisUnavailable as exc:
            self._give_back_later(token, after=exc)
            raise
        except Cancelled:
            raise  # asyncio: the release ran to its end all the same
        except BaseException:
            # Interrupted before the reply (a signal's KeyboardInterrupt or
            # SystemExit): the release may not have run. It is given back off
            # the caller's path, and the interrupt goes on.
            self._give_back_later(token)
            raise
        finally:
            self._holder = None
            self._gate.release()
        trace = None if released else await self._loss_trace(token)
        self._settle_release(released, held, trace, valid_until)
