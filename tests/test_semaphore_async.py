"""AsyncSemaphore: the same protocol as Semaphore, over redis.asyncio."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio

from django_redislock.core.drivers.semaphore_async import AsyncSemaphore, clear_semaphore_async
from django_redislock.core.engine.keys import KeySpace
from django_redislock.core.exceptions import LockLost, LockNotAcquired, LockNotOwned
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


async def test_acquire_release_layout(ar: redis.asyncio.Redis, r: redis.Redis) -> None:
    sem = AsyncSemaphore(ar, "a", 2, ttl=30, wait=0, label="x")
    assert await sem.acquire()
    k = KS.semaphore("a")
    assert r.zrange(k.lease, 0, -1) == [sem.token.encode()]
    assert r.hget(k.state, "l") == b"2" and r.hget(k.state, "n") == b"a"
    assert await sem.owned()
    await sem.release()
    assert r.zcard(k.lease) == 0


async def test_limit_and_notification(ar: redis.asyncio.Redis, r: redis.Redis) -> None:
    held = [AsyncSemaphore(ar, "n", 2, ttl=60, wait=0) for _ in range(2)]
    assert all([await s.acquire() for s in held])
    assert await AsyncSemaphore(ar, "n", 2, wait=0).acquire() is False
    waiter = AsyncSemaphore(ar, "n", 2, wait=10)
    task = asyncio.create_task(waiter.acquire())
    assert await wait_until(lambda: ar.llen(KS.semaphore("n").queue))
    await held[0].release()
    # A 60 s permit and a 10 s wait: only the published wake-up gets it in.
    assert await asyncio.wait_for(task, 15) is True
    assert r.zcard(KS.semaphore("n").lease) == 2


async def test_tasks_never_exceed_limit(ar: redis.asyncio.Redis) -> None:
    inside = 0
    peak = 0

    async def run() -> None:
        nonlocal inside, peak
        sem = AsyncSemaphore(ar, "tasks", 3, ttl=30, wait=30)
        for _ in range(4):
            async with sem:
                inside += 1
                peak = max(peak, inside)
                await asyncio.sleep(0.002)
                inside -= 1

    await asyncio.wait_for(asyncio.gather(*(run() for _ in range(20))), 60)
    assert 1 <= peak <= 3


async def test_hundreds_of_waiting_tasks_share_few_connections(r: redis.Redis) -> None:
    path = r.connection_pool.connection_kwargs["path"]
    pool = redis.asyncio.BlockingConnectionPool(
        connection_class=redis.asyncio.UnixDomainSocketConnection,
        path=path,
        max_connections=4,
        timeout=30,
        socket_timeout=5,
    )
    client = redis.asyncio.Redis(connection_pool=pool)
    holder = AsyncSemaphore(client, "many", 2, ttl=60, wait=0)
    assert await holder.acquire()
    inside = 0
    peak = 0

    async def run() -> bool:
        nonlocal inside, peak
        sem = AsyncSemaphore(client, "many", 2, ttl=30, wait=60)
        if not await sem.acquire():
            return False
        inside += 1
        peak = max(peak, inside)
        await asyncio.sleep(0)
        inside -= 1
        await sem.release()
        return True

    tasks = [asyncio.create_task(run()) for _ in range(200)]
    assert await wait_until(lambda: client.llen(KS.semaphore("many").queue), 30)
    await holder.release()
    results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
    await client.aclose()
    assert all(results) and peak <= 2


async def test_cancelled_acquire_leaves_nothing(ar: redis.asyncio.Redis, r: redis.Redis) -> None:
    holder = AsyncSemaphore(ar, "cancel", 1, ttl=60, wait=0)
    assert await holder.acquire()
    waiter = AsyncSemaphore(ar, "cancel", 1, wait=30)
    task = asyncio.create_task(waiter.acquire())
    assert await wait_until(lambda: ar.llen(KS.semaphore("cancel").queue))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    k = KS.semaphore("cancel")
    assert r.llen(k.queue) == 0
    assert not any(f.startswith(b"w:") for f in r.hgetall(k.state))
    await holder.release()
    assert r.zcard(k.lease) == 0


async def test_only_acquiring_task_releases(ar: redis.asyncio.Redis) -> None:
    sem = AsyncSemaphore(ar, "own", 1, wait=0)
    assert await sem.acquire()
    with pytest.raises(LockNotOwned):
        await asyncio.create_task(sem.release())
    await sem.release()


async def test_expiry_refresh_and_clear(ar: redis.asyncio.Redis, r: redis.Redis) -> None:
    crashed = AsyncSemaphore(ar, "exp", 1, ttl=0.3, wait=0)
    assert await crashed.acquire()
    other = AsyncSemaphore(ar, "exp", 1, ttl=5, wait=10)
    assert await other.acquire()
    with pytest.raises(LockLost):
        await crashed.release()
    await other.refresh(ttl=50)
    assert r.zscore(KS.semaphore("exp").lease, other.token) > int(r.time()[0]) * 1000 + 40_000
    assert await clear_semaphore_async(ar, KS, "exp") == 1
    with pytest.raises(LockLost):
        await other.release()


async def test_context_manager_busy(ar: redis.asyncio.Redis) -> None:
    async with AsyncSemaphore(ar, "ctx", 1, ttl=20, wait=0):
        with pytest.raises(LockNotAcquired) as info:
            async with AsyncSemaphore(ar, "ctx", 1, wait=0):
                pass  # pragma: no cover
        assert info.value.retry_after is not None and info.value.retry_after > 0


async def test_replicas_unacknowledged_permit_is_given_back(
    ar: redis.asyncio.Redis, r: redis.Redis
) -> None:
    from django_redislock.core.exceptions import ReplicationTimeout

    sem = AsyncSemaphore(ar, "unreplicated", 1, ttl=30, wait=0, replicas=1, replicas_timeout=0.05)
    with pytest.raises(ReplicationTimeout):
        await sem.acquire()
    assert not sem.held and r.zcard(KS.semaphore("unreplicated").lease) == 0
