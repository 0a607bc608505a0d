"""``AsyncLock`` over ``redis.asyncio``: the same protocol and scripts as ``Lock``.

Wake-ups come from one pub/sub reader task per event loop (and connection
pool), so hundreds of waiting tasks cost one connection. An acquire that is
cancelled at any await gives back whatever it may have been granted, shielded
from the cancellation, so a cancelled task never leaves a lease behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import weakref
from collections.abc import Awaitable
from types import TracebackType
from typing import Any, TypeVar

from redis.exceptions import RedisError

from . import scripts
from .base import STATE_KEEP_MS, LockBase, acquire_reply, may_have_run, same_token
from .exceptions import (
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    RedisUnavailable,
    ReplicationTimeout,
)
from .keys import KeySpace
from .notify import parse_wakeup

__all__ = ["AsyncLock", "AsyncNotifier", "get_async_notifier"]

log_acquire = logging.getLogger("django_redislock.acquire")
log_notify = logging.getLogger("django_redislock.notify")
log_renew = logging.getLogger("django_redislock.renew")

T = TypeVar("T")
_AH = TypeVar("_AH", bound="AsyncHandle")

_NO_CHANNEL = b"-"
# Cleanup after a cancelled acquire may take this long before we give up on it.
_CLEANUP_TIMEOUT = 2.0
# A release runs to the end even if its task is cancelled, within this bound
# (the client's socket timeout normally ends it much sooner).
_RELEASE_TIMEOUT = 10.0


def _cancel_requests() -> int:
    task = asyncio.current_task()
    # Task.cancelling() exists from Python 3.11; 3.10 cannot tell.
    return task.cancelling() if task is not None and hasattr(task, "cancelling") else 0


def _raise_if_cancelled_since(count: int) -> None:
    """Raise a cancellation that an await swallowed.

    Before Python 3.12, ``asyncio.wait_for`` (ours, and the one redis-py uses
    to send a command) returns normally when its inner awaitable finishes in
    the same loop iteration as the caller's cancellation, and the cancellation
    is lost: a cancelled acquire would carry on waiting its whole wait.
    """
    if _cancel_requests() > count:
        raise asyncio.CancelledError


def _undo_if_done(undo: Any) -> Any:
    def callback(inner: asyncio.Future[Any]) -> None:
        if not inner.cancelled() and inner.exception() is None:
            undo()

    return callback


def _retrieve(inner: asyncio.Future[Any]) -> None:
    if not inner.cancelled():
        inner.exception()


async def _wait_for(aw: Any, timeout: float, undo: Any = None) -> Any:
    """``asyncio.wait_for`` that never swallows a cancellation of the caller;
    ``undo`` gives back what the inner awaitable took if the caller does not
    get its result (cancelled, or timed out just as it finished).

    Built on ``asyncio.wait``, which never swallows a cancellation: before
    Python 3.12 ``asyncio.wait_for`` returns the result when the awaitable
    finishes in the same loop iteration as the cancellation, and Python 3.10
    has no ``Task.cancelling()`` to notice that afterwards.
    """
    inner = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({inner}, timeout=timeout)
    except asyncio.CancelledError:
        inner.cancel()
        inner.add_done_callback(_undo_if_done(undo) if undo is not None else _retrieve)
        raise
    if not done:
        inner.cancel()
        inner.add_done_callback(_undo_if_done(undo) if undo is not None else _retrieve)
        raise asyncio.TimeoutError
    return inner.result()


async def _keep_cancellation(aw: Awaitable[T]) -> T:
    """Await ``aw`` (a Redis call) in a task of its own, so that a cancellation
    of the caller always reaches the caller.

    redis-py sends each command under ``asyncio.wait_for``, which before Python
    3.12 swallows a cancellation that lands as the send completes, and Python
    3.10 cannot notice that afterwards (see ``_raise_if_cancelled_since``).
    Here the cancellation lands on ``asyncio.wait`` instead. The call still
    runs to its end (bounded), so that what the caller sends next to undo it
    reaches Redis after it.
    """
    inner = asyncio.ensure_future(aw)
    try:
        await asyncio.wait({inner})
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await complete(inner, _CLEANUP_TIMEOUT)
        raise
    return inner.result()


async def complete(call: Awaitable[T], timeout: float) -> T:
    """Await ``call`` to the end, even if the caller is cancelled meanwhile.

    Giving back a lease or a turn must not be cut short by the cancellation
    that made it necessary (a release never written would hold the lock for
    its whole TTL). The wait is bounded by ``timeout`` (then TimeoutError);
    a cancellation that arrived meanwhile is re-raised once the call is over.
    """
    loop = asyncio.get_running_loop()
    inner = asyncio.ensure_future(call)
    deadline = loop.time() + timeout
    cancelled = False
    while not inner.done():
        left = deadline - loop.time()
        if left <= 0:
            inner.cancel()
            break
        try:
            # asyncio.wait does not cancel `inner` when we are cancelled.
            await asyncio.wait({inner}, timeout=left)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if inner.done() and not inner.cancelled():
            inner.exception()  # retrieved: the cancellation is what we report
        raise asyncio.CancelledError
    if not inner.done() or inner.cancelled():
        raise asyncio.TimeoutError(f"cleanup did not finish within {timeout}s")
    return inner.result()


LIVENESS_INTERVAL = 5.0
IDLE_TIMEOUT = 60.0


class AsyncWakeup(asyncio.Event):
    """A waiting task's event; ``fence`` is set when the lease was handed to it.
    ``needs_channel``: the task queued without the channel (it was down) and
    is to be woken to queue again once the channel is up."""

    fence: int | None = None
    needs_channel: bool = False


class AsyncNotifier:
    """The wake-up channel of this process for one event loop and pool."""

    def __init__(self, client: Any, keyspace: KeySpace) -> None:
        self._client = client
        self.channel = keyspace.channel(secrets.token_hex(8))
        self.address = b"p" + self.channel
        self._slots: dict[str, AsyncWakeup] = {}
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._idle_since = time.monotonic()
        self._connected_before = False
        self._failures = 0

    def address_for(self, tag: bytes = b"") -> bytes:
        return self.address

    def is_ready(self, tag: bytes = b"") -> bool:
        return self._ready.is_set()

    def register(self, token: str, tag: bytes = b"") -> AsyncWakeup:
        event = AsyncWakeup()
        self._slots[token] = event
        if self._task is None or self._task.done():
            self._ready.clear()
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="redislock-notify"
            )
        return event

    def unregister(self, token: str) -> None:
        self._slots.pop(token, None)
        if not self._slots:
            self._idle_since = time.monotonic()

    async def wait_ready(self, timeout: float, tag: bytes = b"") -> bool:
        with contextlib.suppress(asyncio.TimeoutError):
            await _wait_for(self._ready.wait(), timeout)
        return self._ready.is_set()

    def _wake_all(self) -> None:
        for event in list(self._slots.values()):
            event.set()

    def _idle(self) -> bool:
        return not self._slots and time.monotonic() - self._idle_since > IDLE_TIMEOUT

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            pubsub = self._client.pubsub()
            try:
                await pubsub.subscribe(self.channel)
                await self._listen(pubsub)
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failures += 1
                # One warning per outage; each retry after it is only a debug line.
                first = self._failures == 1 and bool(self._slots)
                log = log_notify.warning if first else log_notify.debug
                log("wake-up channel lost, reconnecting: %s", exc)
            finally:
                self._ready.clear()
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
                self._wake_all()
            if self._idle() or (self._failures and not self._slots):
                return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    async def _listen(self, pubsub: Any) -> None:
        last_heard = time.monotonic()
        ping_sent: float | None = None
        while True:
            message = await pubsub.get_message(timeout=1.0)
            now = time.monotonic()
            if message is None:
                if ping_sent is not None and now - ping_sent > LIVENESS_INTERVAL:
                    raise TimeoutError("no answer to PING on the wake-up channel")
                if ping_sent is None and now - last_heard > LIVENESS_INTERVAL:
                    if self._idle():
                        return
                    await pubsub.ping()
                    ping_sent = now
                continue
            last_heard = now
            ping_sent = None
            kind = message["type"]
            if kind == "message":
                token, fence = parse_wakeup(message["data"])
                event = self._slots.get(token)
                if event is not None:
                    event.fence = fence
                    event.set()
            elif kind == "subscribe":
                if self._failures:
                    log_notify.info("wake-up channel back after %d attempt(s)", self._failures)
                    self._failures = 0
                self._ready.set()
                for event in list(self._slots.values()):
                    # Back after an outage, wake-ups may have been missed; and
                    # whoever queued without the channel can now queue with it.
                    if self._connected_before or event.needs_channel:
                        event.set()
                self._connected_before = True


_notifiers: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[int, str], tuple[Any, Any]]
] = weakref.WeakKeyDictionary()


def get_async_notifier(client: Any, keyspace: KeySpace) -> Any:
    """The notifier of the running loop for the client's pool and prefix.

    An asyncio ``RedisCluster`` gets an ``AsyncShardedNotifier``.
    """
    per_loop = _notifiers.setdefault(asyncio.get_running_loop(), {})
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        pool = client
    key = (id(pool), keyspace.prefix)
    entry = per_loop.get(key)
    if entry is None or entry[0] is not pool:
        from .notify_sharded import AsyncShardedNotifier
        from .topology import is_cluster

        kind = AsyncShardedNotifier if is_cluster(client) else AsyncNotifier
        entry = (pool, kind(client, keyspace))
        per_loop[key] = entry
    return entry[1]


class AsyncHandle(LockBase):
    """What ``AsyncLock`` and ``AsyncSemaphore`` share: the task gate, the wait
    loop, and giving back whatever a cancelled or timed-out attempt may hold.

    Shared between tasks, a handle behaves like ``asyncio.Lock``: a second
    task waits for the first to release, and only the task that acquired may
    release. Subclasses say how to try (``_attempt``), how to give back
    (``_cancel``) and what holding starts (``_on_acquired``).
    """

    def __init__(self, client: Any, name: str, **options: Any) -> None:
        super().__init__(client, name, **options)
        self._gate: asyncio.Lock | None = None
        self._gate_loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self.retry_after: float | None = None

    async def _attempt(
        self, token: str, ttl_ms: int, who: str, wait_ms: int, address: bytes
    ) -> tuple[int, int]:
        """Run the acquire script once: (1, fence) or (0, ms until a change)."""
        raise NotImplementedError

    async def _cancel(self, token: str) -> None:
        """Give back whatever ``token`` may hold or be queued for."""
        raise NotImplementedError

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
                await _wait_for(gate.acquire(), wait_s, undo=gate.release)
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
        wait_ms = int(max(0.0, deadline - time.monotonic()) * 1000)
        notifier = get_async_notifier(self.client, self.keyspace) if wait_ms else None
        event = None
        address = _NO_CHANNEL
        tag = self.keys.tag  # on a Cluster, the wake-up channel lives in this slot
        if notifier is not None and notifier.is_ready(tag):
            event = notifier.register(token, tag)
            address = notifier.address_for(tag)
        cancels = _cancel_requests()
        try:
            while True:
                sent = time.monotonic()
                granted, value = await _keep_cancellation(
                    self._attempt(token, ttl_ms, who, wait_ms if event else 0, address)
                )
                # redis-py's send may have swallowed our cancellation (3.11).
                _raise_if_cancelled_since(cancels)
                if granted == 1:
                    if time.monotonic() >= self._validity(sent, ttl_ms):
                        log_acquire.warning(
                            "acquire reply for %r arrived after its validity", self.name
                        )
                        await self._cancel(token)
                        return False
                    self._granted(token, value, sent, ttl_ms)
                    return True
                self.retry_after = max(value, 0) / 1000
                remaining = deadline - time.monotonic()
                if remaining <= 0 or notifier is None:
                    break
                if event is None:
                    event = notifier.register(token, tag)
                    if await notifier.wait_ready(min(remaining, 2.0), tag):
                        address = notifier.address_for(tag)
                elif address == _NO_CHANNEL and notifier.is_ready(tag):
                    # Queued without the channel (it was down); it is up now:
                    # queue again with it at once.
                    address = notifier.address_for(tag)
                else:
                    # Marked so that the channel coming up wakes us to do that.
                    event.needs_channel = address == _NO_CHANNEL
                    with contextlib.suppress(asyncio.TimeoutError):
                        await _wait_for(event.wait(), min(remaining, max(value, 1) / 1000))
                    handed, event.fence = event.fence, None
                    event.clear()
                    if handed is not None and self._take_handed(sent, ttl_ms):
                        self._granted(token, handed, sent, ttl_ms)
                        return True
                wait_ms = int(max(0.0, deadline - time.monotonic()) * 1000) or 1
            await self._cancel(token)
            return False
        except RedisUnavailable as exc:
            if may_have_run(exc):
                await self._cancel(token)
            raise
        except BaseException:
            # Cancelled or interrupted at some await: the script may have run
            # and granted us what we asked. Give it back, whatever happens to us.
            await self._cancel(token)
            raise
        finally:
            if event is not None and notifier is not None:
                notifier.unregister(token)

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
        """Give it back. Raises ``LockLost`` if it had been lost meanwhile."""
        token = self._check_owner("release")
        self._stop_renewal()
        held = time.monotonic() - self._acquired_at
        try:
            # Runs to the end even if this task is cancelled (see complete).
            released = await complete(self._release_call(token), _RELEASE_TIMEOUT)
        except asyncio.TimeoutError as exc:
            raise RedisUnavailable(f"release of {self.name!r} did not finish in time") from exc
        finally:
            self._forget()
            self._task = None
            if self._gate is not None and self._gate.locked():
                self._gate.release()
        self._settle_release(released, held)


class AsyncLock(AsyncHandle):
    """``Lock`` for asyncio. Shared between tasks it behaves like ``asyncio.Lock``:
    a second task waits for the first to release, and only the task that
    acquired may release or extend the lease.
    """

    def __init__(self, client: Any, name: str, **options: Any) -> None:
        super().__init__(client, name, **options)
        self._renewer: asyncio.Task[None] | None = None
        self._ttl_ms_held = 0

    async def _attempt(
        self, token: str, ttl_ms: int, who: str, wait_ms: int, address: bytes
    ) -> tuple[int, int]:
        args = self._args_acquire(token, ttl_ms, who, wait_ms, address)
        return await self._run_acquire(token, self._key_tuple, args)

    def _on_acquired(self, ttl_ms: int) -> None:
        self._ttl_ms_held = ttl_ms
        if self.renew:
            self._renewer = asyncio.get_running_loop().create_task(
                self._renew_loop(), name=f"redislock-renew:{self.name[:40]}"
            )

    async def _run_acquire(
        self, token: str, keys: tuple[bytes, ...], args: tuple
    ) -> tuple[int, int]:
        if not self.replicas:
            return acquire_reply(await scripts.run_async(self.client, scripts.ACQUIRE, keys, args))
        reply, acked = await scripts.run_acked_async(
            self.client, scripts.ACQUIRE, keys, args, self.replicas, self.replicas_timeout
        )
        granted, value = acquire_reply(reply)
        if granted == 1 and acked < self.replicas:
            # Give back a grant a failover could lose (see Lock._run_acquire).
            await self._cancel(token)
            raise ReplicationTimeout(
                self.name, acked=acked, wanted=self.replicas, timeout=self.replicas_timeout
            )
        return granted, value

    async def _cancel(self, token: str) -> None:
        """Give back whatever this token may hold: lease, reserved turn, queue place."""
        call = scripts.run_async(
            self.client, scripts.CANCEL, self._key_tuple, (token,)
        )
        try:
            await complete(call, _CLEANUP_TIMEOUT)
        except (RedisUnavailable, asyncio.TimeoutError) as exc:
            # The queue entry expires at its deadline; a lease handed to us
            # unheard expires with its TTL.
            log_acquire.info("could not leave the queue of %r: %r", self.name, exc)

    def _check_owner(self, action: str) -> str:
        if self.token is None:
            raise LockNotOwned(f"cannot {action} {self.name!r}: this handle does not hold it")
        if self._task is not asyncio.current_task():
            raise LockNotOwned(f"cannot {action} {self.name!r}: it was acquired by another task")
        return self.token

    async def _release_call(self, token: str) -> int:
        return int(
            await scripts.run_async(
                self.client, scripts.RELEASE, self._key_tuple, (token,)
            )
        )

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the lease to ``ttl`` seconds (default: the handle's) from now."""
        token = self._check_owner("extend")
        if self.lost:
            raise LockLost(f"lock {self.name!r} was already lost")
        ttl_ms = self._ttl_ms(ttl)
        if not await self._extend(token, ttl_ms):
            self._mark_lost("the lease was gone at extend (expired, cleared or lost by Redis)")
            raise LockLost(f"lock {self.name!r} was lost before it could be extended")
        self._ttl_ms_held = ttl_ms

    async def _extend(self, token: str, ttl_ms: int) -> bool:
        sent = time.monotonic()
        ok = await scripts.run_async(
            self.client, scripts.EXTEND, self._key_tuple, (token, ttl_ms, STATE_KEEP_MS)
        )
        if ok and self.token == token:
            self._valid_until = self._validity(sent, ttl_ms)
        return bool(ok)

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

    def _stop_renewal(self) -> None:
        renewer, self._renewer = self._renewer, None
        if renewer is not None and renewer is not asyncio.current_task():
            renewer.cancel()

    async def _renew_loop(self) -> None:
        token = self.token
        started = self._acquired_at
        delay = self._ttl_ms_held / 3000
        while self.token == token and token is not None and not self.lost:
            await asyncio.sleep(delay)
            if self.token != token:
                return
            if self.renew_max is not None and time.monotonic() - started >= self.renew_max:
                log_renew.info("stopped renewing %r after renew_max", self.name)
                return
            sent = time.monotonic()
            try:
                ok = await self._extend(token, self._ttl_ms_held)
            except RedisUnavailable as exc:
                now = time.monotonic()
                left = self._valid_until - now
                # As in Lock._renew_once: report the loss while Redis still has
                # the key unless another attempt as slow can end well inside it.
                spent = now - sent
                if left <= 2 * spent:
                    self._mark_lost(f"could not renew before the lease ran out: {exc}")
                    return
                delay = min(left - 2 * spent, max(0.05, self._ttl_ms_held / 10000))
                continue
            if self.token != token:
                return
            if not ok:
                self._mark_lost("the lease was gone at renewal (expired, cleared or lost by Redis)")
                return
            delay = self._ttl_ms_held / 3000
