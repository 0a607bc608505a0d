"""``AsyncLock`` against a real Redis: basics, task ownership, cancellation, contention."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
import redis.asyncio

from django_redislock.core import (
    AsyncLock,
    Lock,
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
)
from django_redislock.core.engine import scripts
from tests.helpers_oracles import audit_keyspace, plant_sentinel


@pytest.fixture
async def ar(redis_server: Any) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=5)
    yield client
    await client.aclose()


async def _until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def test_basics(ar: redis.asyncio.Redis, r: redis.Redis) -> None:
    plant_sentinel(r)
    lock = AsyncLock(ar, "a-basic", ttl=10, wait=0)
    assert not lock.held and not await lock.owned()
    assert await lock.acquire()
    assert lock.held and await lock.owned()
    assert 0 < lock.remaining <= 10
    assert int(r.hget(lock.keys.lease, "f")) == lock.fence  # type: ignore[arg-type]
    with pytest.raises(LockError, match="not reentrant"):
        await lock.acquire()
    other = AsyncLock(ar, "a-basic", ttl=10, wait=0)
    assert not await other.acquire()
    assert other.retry_after is not None and 0 < other.retry_after <= 10
    with pytest.raises(LockNotOwned):
        await other.release()
    with pytest.raises(LockNotOwned):
        await other.extend()
    await lock.extend(30)
    assert r.pttl(lock.keys.lease) > 10_000
    await lock.release()
    assert not lock.held and not r.exists(lock.keys.lease)
    with pytest.raises(LockNotOwned):
        await lock.release()
    audit_keyspace(r)


async def test_context_manager_and_busy(ar: redis.asyncio.Redis, r: redis.Redis) -> None:
    async with AsyncLock(ar, "a-ctx", ttl=10, wait=0) as lock:
        assert await lock.owned()
        with pytest.raises(LockNotAcquired) as info:
            async with AsyncLock(ar, "a-ctx", ttl=10, wait=0):
                pass  # pragma: no cover
        assert info.value.retry_after is not None
    assert not r.exists(lock.keys.lease)
    with pytest.raises(LockLost):
        async with AsyncLock(ar, "a-ctx", ttl=10, wait=0) as lock:
            r.delete(lock.keys.lease)


async def test_lost_and_new_holder_untouched(ar: redis.asyncio.Redis, r: redis.Redis) -> None:
    lost: list[AsyncLock] = []
    a = AsyncLock(ar, "a-lost", ttl=10, wait=0, on_lost=lost.append)
    b = AsyncLock(ar, "a-lost", ttl=10, wait=0)
    assert await a.acquire()
    r.delete(a.keys.lease)
    assert await b.acquire()
    assert b.fence > a.fence  # type: ignore[operator]
    with pytest.raises(LockLost):
        await a.release()
    assert lost == [a]
    assert await b.owned()
    await b.release()


async def test_shared_by_two_tasks(ar: redis.asyncio.Redis, r: redis.Redis) -> None:
    lock = AsyncLock(ar, "a-shared", ttl=10, wait=5)
    assert await lock.acquire()

    async def intruder() -> str:
        try:
            await lock.release()
        except LockNotOwned:
            pass
        else:
            return "released"
        try:
            await lock.extend()
        except LockNotOwned:
            return "refused"
        return "extended"

    assert await asyncio.create_task(intruder()) == "refused"
    assert await lock.owned()
    assert await asyncio.create_task(lock.acquire(wait=0)) is False
    # A second task waits until the first releases.
    second_got = asyncio.Event()

    async def second() -> None:
        assert await lock.acquire()
        second_got.set()
        await lock.release()

    task = asyncio.create_task(second())
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.shield(second_got.wait()), 0.2)
    assert await lock.owned()
    await lock.release()
    await asyncio.wait_for(task, 5)
    assert second_got.is_set()
    assert not r.exists(lock.keys.lease)


async def _state_clean(r: redis.Redis, lock: AsyncLock) -> None:
    assert r.llen(lock.keys.queue) == 0
    fields = set(r.hkeys(lock.keys.state))
    # Only bookkeeping may remain (last fence, queue hint, name, tokens given
    # back, the memory of losses): no waiter entries.
    assert fields <= {b"f", b"q", b"d", b"n", b"e", b"h", b"u"}, fields


async def test_cancel_waiting_acquire_leaves_nothing(
    ar: redis.asyncio.Redis, r: redis.Redis
) -> None:
    plant_sentinel(r)
    holder = AsyncLock(ar, "a-cancel", ttl=30, wait=0)
    assert await holder.acquire()
    waiter = AsyncLock(ar, "a-cancel", ttl=30, wait=20)
    task = asyncio.create_task(waiter.acquire())

    async def queued() -> bool:
        return bool(r.llen(holder.keys.queue) == 1)

    await _until(queued)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _state_clean(r, holder)
    assert waiter.token is None
    await holder.release()
    assert not r.exists(holder.keys.lease)
    await _state_clean(r, holder)
    # The gate was given back: the handle works again.
    assert await waiter.acquire(wait=0)
    await waiter.release()
    audit_keyspace(r)


@pytest.mark.parametrize("contended", [False, True])
async def test_cancel_at_every_await_leaves_nothing(
    ar: redis.asyncio.Redis, r: redis.Redis, contended: bool
) -> None:
    plant_sentinel(r)
    holder = AsyncLock(ar, "a-cancel-early", ttl=30, wait=0)
    if contended:
        assert await holder.acquire()
    outcomes = set()
    for steps in range(12):
        lock = AsyncLock(ar, "a-cancel-early", ttl=30, wait=5)
        task = asyncio.create_task(lock.acquire())
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        try:
            result = await task
        except asyncio.CancelledError:
            outcomes.add("cancelled")
            assert lock.token is None
            if not contended:
                assert not r.exists(lock.keys.lease)
        else:
            # The acquire finished before the cancellation could land (or
            # Python 3.11's wait_for swallowed it): a real, reported lease.
            outcomes.add(result)
            assert result is True and not contended
            assert r.hget(lock.keys.lease, "t") == lock.token.encode()  # type: ignore[union-attr]
            assert scripts.run(r, scripts.CLEAR, lock._key_tuple, (2000, lock.token)) == 1
        await _state_clean(r, holder)
        if contended:
            assert r.hget(holder.keys.lease, "t") == holder.token.encode()  # type: ignore[union-attr]
    assert "cancelled" in outcomes
    if contended:
        await holder.release()
    audit_keyspace(r)


async def test_many_tasks_never_overlap(ar: redis.asyncio.Redis, r: redis.Redis) -> None:
    plant_sentinel(r)
    tasks_n, rounds = 40, 5
    inside = 0
    violations = 0
    unsafe = 0
    start = asyncio.Event()

    async def contender() -> None:
        nonlocal inside, violations, unsafe
        lock = AsyncLock(ar, "a-crowd", ttl=20, wait=60)
        await start.wait()
        for _ in range(rounds):
            assert await lock.acquire()
            inside += 1
            if inside != 1:
                violations += 1
            value = unsafe
            await asyncio.sleep(0.001)
            unsafe = value + 1
            inside -= 1
            await lock.release()

    tasks = [asyncio.create_task(contender()) for _ in range(tasks_n)]
    await asyncio.sleep(0)
    start.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert violations == 0
    assert unsafe == tasks_n * rounds
    assert r.llen(AsyncLock(ar, "a-crowd").keys.queue) == 0
    audit_keyspace(r)


async def test_handoff_by_notification(ar: redis.asyncio.Redis, r: redis.Redis) -> None:
    holder = AsyncLock(ar, "a-handoff", ttl=30, wait=0)
    assert await holder.acquire()
    waiter = AsyncLock(ar, "a-handoff", ttl=30, wait=15)

    async def wait_for_it() -> tuple[bool, float]:
        ok = await waiter.acquire()
        at = time.monotonic()
        if ok:
            await waiter.release()
        return ok, at

    task = asyncio.create_task(wait_for_it())

    async def queued() -> bool:
        return bool(r.llen(holder.keys.queue) == 1)

    await _until(queued)
    released_at = time.monotonic()
    await holder.release()
    ok, at = await asyncio.wait_for(task, 10)
    assert ok is True
    # The holder's lease had 30 s left: only the notification explains this.
    assert at - released_at < 2
    assert not r.exists(holder.keys.lease)


async def test_late_acquire_reply_is_not_an_acquisition(redis_factory: Any) -> None:
    from tests.servers import free_port

    server = redis_factory(port=free_port(), unix=False).start()
    client = redis.asyncio.Redis.from_url(server.url, socket_timeout=10)
    try:
        await client.ping()
        lock = AsyncLock(client, "a-late", ttl=0.05, wait=0)
        server.pause()
        resume = asyncio.get_running_loop().call_later(0.3, server.resume)
        try:
            assert await lock.acquire() is False
        finally:
            resume.cancel()
            server.resume()
        assert not lock.held and lock.token is None
        assert not await client.exists(lock.keys.lease)
        assert await lock.acquire(ttl=5)
        await lock.release()
    finally:
        await client.aclose()


async def test_renewal_async(ar: redis.asyncio.Redis, r: redis.Redis) -> None:
    lost: list[AsyncLock] = []
    lock = AsyncLock(ar, "a-renew", ttl=0.6, wait=0, renew=True, on_lost=lost.append)
    assert await lock.acquire()
    await asyncio.sleep(1.5)
    assert await lock.owned()
    r.delete(lock.keys.lease)

    async def noticed() -> bool:
        return bool(lost)

    await _until(noticed, 5)
    with pytest.raises(LockLost):
        await lock.release()
    assert lost == [lock]


def _slow_script(monkeypatch: pytest.MonkeyPatch, which: Any, delay: float) -> None:
    """Stretch one script's round trip, to cancel a task in the middle of it."""
    original = scripts.run_async

    async def slow(client: Any, script: Any, keys: Any, args: Any) -> Any:
        if script is which:
            await asyncio.sleep(delay)
        return await original(client, script, keys, args)

    monkeypatch.setattr(scripts, "run_async", slow)


async def test_a_release_cut_by_cancellation_still_frees_the_lock(
    ar: redis.asyncio.Redis, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = AsyncLock(ar, "cut-release", ttl=30, wait=0)
    releasing = asyncio.Event()

    async def hold() -> None:
        async with lock:
            releasing.set()

    _slow_script(monkeypatch, scripts.RELEASE, 0.2)
    task = asyncio.create_task(hold())
    await releasing.wait()
    await asyncio.sleep(0.05)  # inside __aexit__, in the stretched release
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert r.exists(lock.keys.lease) == 0  # not held for its 30 s TTL


async def test_a_cancellation_during_the_final_cancel_is_not_swallowed(
    ar: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = AsyncLock(ar, "cut-cancel", ttl=30, wait=0)
    assert await holder.acquire()
    waiter = AsyncLock(ar, "cut-cancel", ttl=30, wait=0.2)
    _slow_script(monkeypatch, scripts.CANCEL, 0.3)
    task = asyncio.create_task(waiter.acquire())
    await asyncio.sleep(0.3)  # its wait is over: the stretched CANCEL runs
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await holder.release()


async def test_a_task_queued_while_the_channel_was_down_queues_again_with_it(
    redis_factory: Any,
) -> None:
    # Over a slow link (1.1 s each way) a SUBSCRIBE is not confirmed within
    # the 2 s a first contention waits for it, so the task queues without the
    # channel. Once the channel is up it must queue again with it: otherwise a
    # lease handed over would go unnoticed until the task's own 25 s wait ran
    # out.
    from tests.faults.proxy import FaultProxy
    from tests.servers import free_port

    server = redis_factory(port=free_port(), unix=False).start()
    direct = server.client(socket_timeout=5, socket_connect_timeout=5)
    proxy = FaultProxy(("127.0.0.1", server.port))
    slow = redis.asyncio.Redis.from_url(proxy.url, socket_timeout=10, socket_connect_timeout=10)
    holder = Lock(direct, "late", ttl=30, wait=0)
    try:
        assert holder.acquire()
        waiter = AsyncLock(slow, "late", ttl=30, wait=25)
        # Two pooled connections (commands, pub/sub) made before the link slows.
        await asyncio.gather(slow.ping(), slow.ping())

        async def queued_with_channel() -> bool:
            return any(b"|p" in v for v in direct.hvals(holder.keys.state))  # type: ignore[union-attr]

        got: list[float] = []

        async def take() -> bool:
            if not await waiter.acquire():
                return False
            got.append(time.monotonic())
            await waiter.release()
            return True

        with proxy.fault(latency=1.1):
            task = asyncio.create_task(take())
            await _until(queued_with_channel, timeout=18)
            released_at = time.monotonic()
            holder.release()
            assert await asyncio.wait_for(task, 10)
            assert got[0] - released_at < 5
    finally:
        await slow.aclose()
        direct.close()
        proxy.close()
