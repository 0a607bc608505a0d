"""AsyncReadWriteLock: the same protocol as ReadWriteLock, over redis.asyncio."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
import redis.asyncio

from django_redislock.core import AsyncReadWriteLock, KeySpace
from django_redislock.core.drivers.rwlock_async import clear_rw_lock_async
from django_redislock.core.exceptions import LockLost, LockNotOwned
from tests.helpers_oracles import audit_keyspace, plant_sentinel
from tests.servers import RedisServer

KS = KeySpace()


@pytest.fixture
async def ar(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=5)
    yield client
    await client.aclose()


async def wait_until(predicate, timeout: float = 10.0) -> bool:  # noqa: ANN001
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.005)
    return bool(await predicate())


def rw(client: Any, mode: str, name: str = "doc", **kw: Any) -> AsyncReadWriteLock:
    kw.setdefault("ttl", 30)
    kw.setdefault("wait", 0)
    return AsyncReadWriteLock(client, name, mode, **kw)  # type: ignore[arg-type]


def left_behind(r: redis.Redis, name: str = "doc") -> tuple[int, int, list[bytes]]:
    """Holders, queue entries and per-token state fields still in Redis."""
    k = KS.rwlock(name)
    fields = [f for f in r.hgetall(k.state) if f[:2] in (b"o:", b"a:", b"m:", b"r:", b"w:", b"s:")]
    return r.zcard(k.lease), r.llen(k.queue), fields


async def test_readers_share_writer_alone_and_fences(
    ar: redis.asyncio.Redis, r: redis.Redis
) -> None:
    a, b, w = rw(ar, "read"), rw(ar, "read"), rw(ar, "write")
    assert await a.acquire() and await b.acquire()
    assert not await w.acquire()
    await a.release()
    await b.release()
    async with w:
        assert w.fence is not None and await w.owned()
        assert not await a.acquire()
    async with a:
        assert a.write_fence == w.fence and a.fence is None
    assert left_behind(r) == (0, 0, [])


async def test_tasks_oracle_readers_overlap_writers_alone(
    ar: redis.asyncio.Redis, r: redis.Redis
) -> None:
    plant_sentinel(r)
    readers = writers = violations = most = 0

    async def reader() -> None:
        nonlocal readers, most, violations
        async with rw(ar, "read", wait=30):
            readers += 1
            most = max(most, readers)
            violations += writers > 0
            for _ in range(20):  # stay a moment for another reader to join
                if readers > 1:
                    break
                await asyncio.sleep(0.001)
            readers -= 1

    async def writer() -> None:
        nonlocal writers, violations
        async with rw(ar, "write", wait=30):
            writers += 1
            violations += writers > 1 or readers > 0
            await asyncio.sleep(0.001)
            writers -= 1

    jobs = [writer() if i % 4 == 0 else reader() for i in range(60)]
    await asyncio.wait_for(asyncio.gather(*jobs), 120)
    assert violations == 0 and most > 1
    audit_keyspace(r)


async def test_waiting_writer_stops_new_readers(ar: redis.asyncio.Redis, r: redis.Redis) -> None:
    first = rw(ar, "read")
    assert await first.acquire()
    writer_in = asyncio.Event()
    leave = asyncio.Event()
    reader_in = asyncio.Event()

    async def writer() -> None:
        async with rw(ar, "write", wait=20):
            writer_in.set()
            await asyncio.wait_for(leave.wait(), 20)

    async def late_reader() -> None:
        async with rw(ar, "read", wait=20):
            reader_in.set()

    tw = asyncio.create_task(writer())
    assert await wait_until(lambda: ar.llen(KS.rwlock("doc").queue))
    assert not await rw(ar, "read").acquire()
    tr = asyncio.create_task(late_reader())
    assert await wait_until(lambda: _eq(ar.llen(KS.rwlock("doc").queue), 2))
    await first.release()
    await asyncio.wait_for(writer_in.wait(), 10)
    assert not reader_in.is_set()
    leave.set()
    await asyncio.wait_for(reader_in.wait(), 10)
    await asyncio.wait_for(asyncio.gather(tw, tr), 10)


async def _eq(awaitable: Any, value: int) -> bool:
    return bool(await awaitable == value)


async def test_cancelled_waiting_writer_lets_readers_behind_it_in(
    ar: redis.asyncio.Redis, r: redis.Redis
) -> None:
    holder = rw(ar, "read", ttl=60)
    assert await holder.acquire()
    writer = asyncio.create_task(rw(ar, "write", wait=30).acquire())
    assert await wait_until(lambda: ar.llen(KS.rwlock("doc").queue))
    reader_in = asyncio.Event()

    async def reader() -> None:
        async with rw(ar, "read", wait=30):
            reader_in.set()

    tr = asyncio.create_task(reader())
    assert await wait_until(lambda: _eq(ar.llen(KS.rwlock("doc").queue), 2))
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writer
    # The reader behind it shares with the holder now: nobody waits ahead.
    await asyncio.wait_for(reader_in.wait(), 10)
    await tr
    await holder.release()
    assert left_behind(r) == (0, 0, [])


@pytest.mark.parametrize("mode", ["read", "write"])
async def test_cancellation_at_any_point_leaves_nothing(
    ar: redis.asyncio.Redis, r: redis.Redis, mode: str
) -> None:
    other = "write" if mode == "read" else "read"
    for steps in range(0, 40, 2):
        for contended in (False, True):
            blocker = rw(ar, other, ttl=60)
            if contended:
                assert await blocker.acquire()
            lock = rw(ar, mode, wait=30)

            async def attempt(lock: AsyncReadWriteLock = lock) -> None:
                if await lock.acquire():
                    try:
                        await asyncio.sleep(3600)
                    finally:
                        await lock.release()

            task = asyncio.create_task(attempt())
            for _ in range(steps):
                await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            if contended:
                await blocker.release()
            assert await wait_until(lambda: _nothing_left(r)), (steps, contended)


async def _nothing_left(r: redis.Redis) -> bool:
    return left_behind(r) == (0, 0, [])


async def test_only_the_acquiring_task_releases_and_loss(
    ar: redis.asyncio.Redis, r: redis.Redis
) -> None:
    w = rw(ar, "write")
    assert await w.acquire()
    with pytest.raises(LockNotOwned):
        await asyncio.create_task(w.release())
    await w.extend(60)
    assert await clear_rw_lock_async(ar, KS, "doc") == 1
    with pytest.raises(LockLost):
        await w.extend()
    with pytest.raises(LockLost):
        await w.release()
    renewing = rw(ar, "read", ttl=0.3, renew=True)
    assert await renewing.acquire()
    assert not await rw(ar, "write", wait=0.6).acquire()  # held past its TTL by renewal
    assert renewing.held
    await renewing.release()
