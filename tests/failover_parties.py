"""The waiters of the failover scenarios (Sentinel and Cluster), once.

A scenario queues threads (sync ``Lock``) and tasks (``AsyncLock``) behind a
holder, fails the lock's server over, and reads what they record of
themselves: one inside at a time, strictly increasing fences, when each got in.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from django_redislock.core import AsyncLock, KeySpace, Lock, RedisUnavailable
from tests.helpers_oracles import lock_waiters

KS = KeySpace("redislock")
# Each waiter's wait: far longer than a failover takes, so that each is served.
WAIT = 40.0
# How long a holder stays inside: long enough that two holders of one
# release would be seen inside together.
HOLD = 0.2


class Sections:
    """What the holders record of themselves: who is inside, their fences, when."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.inside = 0
        self.most = 0
        self.fences: list[int] = []
        self.entered: list[float] = []

    def enter(self, fence: int) -> None:
        with self.mutex:
            self.inside += 1
            self.most = max(self.most, self.inside)
            self.fences.append(fence)
            self.entered.append(time.monotonic())

    def leave(self) -> None:
        with self.mutex:
            self.inside -= 1


def sync_waiter(client: Any, name: str, sections: Sections, outcomes: list[Any]) -> None:
    """A thread's turn: wait for ``name``, hold it for HOLD, record what came of it."""
    lock = Lock(client, name, ttl=10, wait=WAIT)
    try:
        acquired = lock.acquire()
    except RedisUnavailable as exc:
        outcomes.append(exc)
        return
    outcomes.append(acquired)
    if acquired:
        sections.enter(lock.fence or 0)
        time.sleep(HOLD)
        sections.leave()
        lock.release()


async def async_waiters(
    client: Any, name: str, sections: Sections, outcomes: list[Any], count: int
) -> None:
    """``count`` tasks' turns on one asyncio client, as ``sync_waiter``'s."""

    async def wait_once() -> None:
        lock = AsyncLock(client, name, ttl=10, wait=WAIT)
        try:
            acquired = await lock.acquire()
        except RedisUnavailable as exc:
            outcomes.append(exc)
            return
        outcomes.append(acquired)
        if acquired:
            sections.enter(lock.fence or 0)
            await asyncio.sleep(HOLD)
            sections.leave()
            await lock.release()

    await asyncio.gather(*(wait_once() for _ in range(count)))


def queued_with_a_channel(client: Any, name: str) -> int:
    """How many waiters of ``name`` are queued with a wake-up channel."""
    entries = lock_waiters(client, KS.lock(name)).values()
    return sum(1 for entry in entries if entry.split(b"|")[1][:1] != b"-")
