"""Wake-ups for asyncio waiters: one pub/sub reader task per event loop and pool.

The asyncio counterpart of ``wakeups.py``: hundreds of waiting tasks cost one
connection. The reader sets the event of the task whose turn came (with the
lease, when it was handed over) and, when the channel comes back after an
outage, wakes every task to look again. Through Sentinel it follows the
primary as ``wakeups.py`` describes: while anyone waits, a task asks the
sentinels once a second where the primary is.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
import weakref
from typing import Any

from ..clients import AsyncRedisClient
from ..engine.keys import KeySpace
from ..engine.wakeup_message import Handed, parse_wakeup
from . import breaker
from .aio_calls import wait_for
from .wakeups_base import (
    FOLLOW_INTERVAL,
    IDLE_TIMEOUT,
    AsyncWakeup,
    Liveness,
    PlainChannel,
    moved_from,
    opened_for,
    plain_address,
    registered,
)
from .wakeups_sharded_async import AsyncShardedNotifier

__all__ = ["AsyncNotifier", "get_async_notifier"]


class AsyncNotifier:
    """The wake-up channel of this process for one event loop and pool."""

    def __init__(self, client: AsyncRedisClient, keyspace: KeySpace) -> None:
        self._client = client
        self.channel = keyspace.channel(secrets.token_hex(8))
        self.address = plain_address(client, self.channel)
        self._channel = PlainChannel(client)
        self._slots: dict[str, AsyncWakeup] = {}
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._idle_since = time.monotonic()
        self._loop = asyncio.get_running_loop()
        breaker.on_open(self._on_breaker_open)

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

    def register_if_ready(self, token: str, tag: bytes = b"") -> AsyncWakeup | None:
        """Register ``token`` if the channel is subscribed, else None."""
        return self.register(token, tag) if self.is_ready(tag) else None

    async def wait(self, event: AsyncWakeup, timeout: float) -> Handed | None:
        """Sleep until ``event`` fires or ``timeout`` passes; the fence of a
        lease handed over (with the attempt it answers), else None."""
        return await event.take(timeout)

    def unregister(self, token: str) -> None:
        self._slots.pop(token, None)
        if not self._slots:
            self._idle_since = time.monotonic()

    async def wait_ready(self, timeout: float, tag: bytes = b"") -> bool:
        with contextlib.suppress(asyncio.TimeoutError):
            await wait_for(self._ready.wait(), timeout)
        return self._ready.is_set()

    def _wake_all(self) -> None:
        for event in list(self._slots.values()):
            event.set()

    def _on_breaker_open(self, opened: breaker.Breaker) -> None:
        # A call to this Redis timed out: the waiting tasks look again now,
        # and fail fast. Called from whichever thread saw the timeout.
        if opened_for(self._client, opened):
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self._loop.call_soon_threadsafe(self._wake_all)

    def _idle(self) -> bool:
        return not self._slots and time.monotonic() - self._idle_since > IDLE_TIMEOUT

    async def _run(self) -> None:
        while True:
            pubsub = self._client.pubsub()
            delay: float | None = None  # set when the connection failed
            follow = False  # the primary moved: subscribe there at once
            try:
                await pubsub.subscribe(self.channel)
                follow = await self._listen(pubsub)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = self._channel.lost(time.monotonic(), exc, bool(self._slots))
            finally:
                self._ready.clear()
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
                # Followed the primary: the confirmation of the next
                # subscription wakes every task.
                if not follow and self._channel.loss_wakes:
                    self._wake_all()
            if follow:
                continue
            if delay is None or self._idle() or not self._slots:
                return
            await asyncio.sleep(delay)

    async def _listen(self, pubsub: Any) -> bool:
        """Read until idle (False) or, through Sentinel, until the primary
        moved elsewhere than ``pubsub``'s server (True)."""
        liveness = Liveness(time.monotonic())
        looking: asyncio.Task[bool] | None = None  # asking the sentinels
        looked_at = time.monotonic()
        try:
            while True:
                if looking is not None and looking.done():
                    if not looking.cancelled() and looking.result():
                        return True
                    looking = None
                if (
                    self._channel.sentinel
                    and looking is None
                    and self._slots
                    and time.monotonic() - looked_at >= FOLLOW_INTERVAL
                ):
                    looked_at = time.monotonic()
                    # A task of its own: a slow sentinel must not hold up the reading.
                    looking = asyncio.get_running_loop().create_task(self._moved(pubsub))
                if await self._listen_once(pubsub, liveness):
                    return False
        finally:
            if looking is not None:
                looking.cancel()

    async def _moved(self, pubsub: Any) -> bool:
        """Whether the sentinels name another primary than ``pubsub``'s server."""
        try:
            primary = await self._client.connection_pool.get_master_address()  # type: ignore[attr-defined]
        except Exception as exc:  # no sentinel answers: the channel stays where it is
            self._channel.unanswered(exc)
            return False
        if moved_from(pubsub.connection, primary):
            self._channel.follows(primary)
            return True
        return False

    async def _listen_once(self, pubsub: Any, liveness: Liveness) -> bool:
        """Read one message (or a second's silence); True when idle."""
        message = await pubsub.get_message(timeout=1.0)
        now = time.monotonic()
        if message is None:
            if liveness.ping_due(now):
                if self._idle():
                    return True
                await pubsub.ping()
                liveness.ping_sent = now
            return False
        liveness.heard(now)
        kind = message["type"]
        if kind == "message":
            token, handed = parse_wakeup(message["data"])
            event = self._slots.get(token)
            if event is not None:
                event.handed = handed
                event.set()
        elif kind == "subscribe":
            self._ready.set()
            for event in self._channel.up(now, self._slots.values()):
                event.set()
        return False


_notifiers: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop,
    dict[tuple[int, str], tuple[Any, AsyncNotifier | AsyncShardedNotifier]],
] = weakref.WeakKeyDictionary()


def get_async_notifier(
    client: AsyncRedisClient, keyspace: KeySpace
) -> AsyncNotifier | AsyncShardedNotifier:
    """The notifier of the running loop for the client's pool and prefix.

    An asyncio ``RedisCluster`` gets an ``AsyncShardedNotifier``.
    """
    per_loop = _notifiers.setdefault(asyncio.get_running_loop(), {})
    return registered(per_loop, client, keyspace, AsyncNotifier, AsyncShardedNotifier)
