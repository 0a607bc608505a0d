"""``AsyncSemaphore`` over ``redis.asyncio``: the same scripts and protocol as ``Semaphore``.

Waiting tasks share the event loop's one wake-up reader (``aio.get_async_notifier``),
so hundreds of them cost one connection. An acquire cancelled at any await
gives back whatever it may have been granted, shielded from the cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from types import TracebackType
from typing import Any

from . import scripts
from .aio import (
    _RELEASE_TIMEOUT,
    _cancel_requests,
    _raise_if_cancelled_since,
    _wait_for,
    complete,
    get_async_notifier,
)
from .base import DEFAULT_GRACE, STATE_KEEP_MS
from .exceptions import LockError, LockLost, LockNotAcquired, LockNotOwned, RedisUnavailable
from .keys import KeySpace
from .semaphore import ACQUIRE, CANCEL, CLEAR, REFRESH, RELEASE, SemaphoreBase

__all__ = ["AsyncSemaphore", "clear_semaphore_async"]

log_acquire = logging.getLogger("django_redislock.acquire")

_NO_CHANNEL = b"-"
_CLEANUP_TIMEOUT = 2.0


class AsyncSemaphore(SemaphoreBase):
    """``Semaphore`` for asyncio. A handle holds one permit at a time; shared
    between tasks it behaves like ``asyncio.Lock``, and only the task that
    acquired the permit may release or refresh it.
    """

    def __init__(self, client: Any, name: str, limit: int, **options: Any) -> None:
        super().__init__(client, name, limit, **options)
        self._gate: asyncio.Lock | None = None
        self._gate_loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None

    def _get_gate(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._gate is None or self._gate_loop is not loop:
            self._gate = asyncio.Lock()
            self._gate_loop = loop
        return self._gate

    async def acquire(self, wait: float | None = None, *, ttl: float | None = None) -> bool:
        """Take a permit, waiting up to ``wait`` seconds (0: try once)."""
        wait_s = self._wait_s(wait)
        ttl_ms = self._ttl_ms(ttl)
        me = asyncio.current_task()
        if self.token is not None and self._task is me:
            raise LockError(
                f"semaphore {self.name!r}: this handle already holds a permit in this "
                "task; release it first, or use one handle per concurrent holder"
            )
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
        self.observer.acquired(self, time.monotonic() - started)
        return True

    async def _acquire(self, deadline: float, ttl_ms: int) -> bool:
        token = self._new_token()
        task = asyncio.current_task()
        who = task.get_name() if task is not None else "?"
        keys = self._key_tuple
        wait_ms = int(max(0.0, deadline - time.monotonic()) * 1000)
        notifier = get_async_notifier(self.client, self.keyspace) if wait_ms else None
        event = None
        address = _NO_CHANNEL
        tag = self.keys.tag  # a Cluster's wake-up channel lives in this slot
        if notifier is not None and notifier.is_ready(tag):
            event = notifier.register(token, tag)
            address = notifier.address_for(tag)
        cancels = _cancel_requests()
        try:
            while True:
                sent = time.monotonic()
                granted, value = await scripts.run_async(
                    self.client,
                    ACQUIRE,
                    keys,
                    self._sem_args(token, ttl_ms, who, wait_ms if event else 0, address),
                )
                # As in AsyncLock: redis-py's send may have swallowed our cancellation.
                _raise_if_cancelled_since(cancels)
                if granted == 1:
                    if time.monotonic() >= self._validity(sent, ttl_ms):
                        log_acquire.warning(
                            "acquire reply for %r arrived after its validity", self.name
                        )
                        await self._cancel(token)
                        return False
                    self._granted(token, 0, sent, ttl_ms)
                    self.fence = None
                    return True
                self.retry_after = max(value, 0) / 1000
                remaining = deadline - time.monotonic()
                if remaining <= 0 or notifier is None:
                    break
                if event is None:
                    event = notifier.register(token, tag)
                    if await notifier.wait_ready(min(remaining, 2.0), tag):
                        address = notifier.address_for(tag)
                else:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await _wait_for(event.wait(), min(remaining, max(value, 1) / 1000))
                    event.clear()
                wait_ms = int(max(0.0, deadline - time.monotonic()) * 1000) or 1
            await self._cancel(token)
            return False
        except RedisUnavailable:
            raise
        except BaseException:
            # Cancelled at some await: the script may have granted us a
            # permit. Give it back, whatever happens to this task.
            await self._cancel(token)
            raise
        finally:
            if event is not None and notifier is not None:
                notifier.unregister(token)

    async def _cancel(self, token: str) -> None:
        call = scripts.run_async(self.client, CANCEL, self._key_tuple, self._release_args(token))
        try:
            await complete(call, _CLEANUP_TIMEOUT)
        except (RedisUnavailable, asyncio.TimeoutError) as exc:
            log_acquire.info("could not leave the queue of %r: %r", self.name, exc)

    def _check_owner(self, action: str) -> str:
        if self.token is None:
            raise LockNotOwned(
                f"cannot {action} a permit of {self.name!r}: this handle holds none"
            )
        if self._task is not asyncio.current_task():
            raise LockNotOwned(
                f"cannot {action} a permit of {self.name!r}: another task acquired it"
            )
        return self.token

    async def release(self) -> None:
        """Give the permit back. Raises ``LockLost`` if it had expired or been cleared."""
        token = self._check_owner("release")
        held = time.monotonic() - self._acquired_at
        try:
            # Runs to the end even if this task is cancelled (see aio.complete).
            released = await complete(
                scripts.run_async(self.client, RELEASE, self._key_tuple, self._release_args(token)),
                _RELEASE_TIMEOUT,
            )
        except asyncio.TimeoutError as exc:
            raise RedisUnavailable(f"release of {self.name!r} did not finish in time") from exc
        finally:
            self._forget()
            self._task = None
            if self._gate is not None and self._gate.locked():
                self._gate.release()
        if not released:
            self._mark_lost("the permit was gone at release (expired, cleared or lost by Redis)")
        if self.lost:
            raise LockLost(f"permit of semaphore {self.name!r} was lost before it was released")
        self.observer.released(self, held)

    async def refresh(self, ttl: float | None = None) -> None:
        """Reset this permit to ``ttl`` seconds (default: the handle's) from now."""
        token = self._check_owner("refresh")
        if self.lost:
            raise LockLost(f"permit of semaphore {self.name!r} was already lost")
        ttl_ms = self._ttl_ms(ttl)
        sent = time.monotonic()
        ok = await scripts.run_async(
            self.client, REFRESH, self._key_tuple, (token, ttl_ms, STATE_KEEP_MS)
        )
        if not ok:
            self._mark_lost("the permit was gone at refresh (expired, cleared or lost by Redis)")
            raise LockLost(f"permit of semaphore {self.name!r} was lost before it was refreshed")
        if self.token == token:
            self._valid_until = self._validity(sent, ttl_ms)

    extend = refresh

    async def owned(self) -> bool:
        """Ask Redis whether this handle still holds its permit (one round trip)."""
        token = self.token
        if token is None or not self.held:
            return False
        try:
            score = await self.client.zscore(self.keys.lease, token)
        except Exception as exc:
            raise RedisUnavailable(f"could not check semaphore {self.name!r}: {exc}") from exc
        return score is not None and self.held

    async def __aenter__(self) -> AsyncSemaphore:
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


async def clear_semaphore_async(
    client: Any, keyspace: KeySpace, name: str, token: str | None = None
) -> int:
    """``clear_semaphore`` for a ``redis.asyncio`` client."""
    keys = keyspace.semaphore(name)
    return int(
        await scripts.run_async(
            client,
            CLEAR,
            (keys.lease, keys.queue, keys.state),
            (int(DEFAULT_GRACE * 1000), token or ""),
        )
    )
