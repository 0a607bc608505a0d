"""``redis_locked`` and ``redis_lock`` in asyncio code: coroutines, tasks, ``async with``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from django.test import override_settings

from django_redislock import (
    LockNotAcquired,
    RedisUnavailable,
    current_lock,
    get_async_lock,
    redis_lock,
    redis_locked,
)
from django_redislock.signals import redis_unavailable
from tests.helpers_oracles import signal_sent
from tests.test_decorators import close_async_clients, dead_redis  # noqa: F401


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    yield
    await close_async_clients()


async def is_free(name: str) -> bool:
    lock = get_async_lock(name, wait=0)
    if await lock.acquire():
        await lock.release()
        return True
    return False


async def test_coroutine_runs_under_its_lock() -> None:
    @redis_locked("job:{n}", wait=0)
    async def job(n: int) -> str | None:
        lock = current_lock()
        assert lock is not None
        assert not await is_free(f"job:{n}")
        return lock.name

    assert await job(3) == "job:3"
    assert await is_free("job:3")
    assert current_lock() is None


async def test_busy_raise_skip_and_callable() -> None:
    holder = get_async_lock("job:1", timeout=20, wait=0)
    assert await holder.acquire()
    try:

        @redis_locked("job:{n}", wait=0)
        async def raising(n: int) -> str:
            return "ran"

        @redis_locked("job:{n}", wait=0, on_busy="skip")
        async def skipping(n: int) -> str:
            return "ran"

        async def later(n: int) -> str:
            return f"later {n}"

        @redis_locked("job:{n}", wait=0, on_busy=later)
        async def deferring(n: int) -> str:
            return "ran"

        @redis_locked("job:{n}", wait=0, on_busy=lambda n: f"sync {n}")
        async def sync_fallback(n: int) -> str:
            return "ran"

        with pytest.raises(LockNotAcquired) as info:
            await raising(1)
        assert info.value.retry_after is not None and 0 < info.value.retry_after <= 20
        assert await skipping(1) is None
        assert await deferring(1) == "later 1"
        assert await sync_fallback(1) == "sync 1"
    finally:
        await holder.release()


async def test_waits_for_the_holder_then_runs() -> None:
    inside = asyncio.Event()
    go = asyncio.Event()
    order = []

    @redis_locked("seq", wait=10)
    async def work(tag: str) -> None:
        order.append(f"{tag}-in")
        if tag == "first":
            inside.set()
            await go.wait()
        order.append(f"{tag}-out")

    first = asyncio.create_task(work("first"))
    await asyncio.wait_for(inside.wait(), 10)
    second = asyncio.create_task(work("second"))
    await asyncio.sleep(0)
    go.set()
    await asyncio.wait_for(asyncio.gather(first, second), 20)
    assert order == ["first-in", "first-out", "second-in", "second-out"]


async def test_current_lock_is_per_task_and_innermost() -> None:
    both = asyncio.Barrier(2) if hasattr(asyncio, "Barrier") else None
    seen: dict[str, list[str | None]] = {}

    @redis_locked("inner:{tag}", wait=0)
    async def inner(tag: str) -> None:
        lock = current_lock()
        seen[tag].append(lock.name if lock else None)

    @redis_locked("outer:{tag}", wait=0)
    async def outer(tag: str) -> None:
        seen[tag] = []
        if both is not None:
            await asyncio.wait_for(both.wait(), 10)  # both tasks hold their lock now
        lock = current_lock()
        seen[tag].append(lock.name if lock else None)
        await inner(tag)
        lock = current_lock()
        seen[tag].append(lock.name if lock else None)

    await asyncio.wait_for(asyncio.gather(outer("a"), outer("b")), 10)
    assert seen == {
        "a": ["outer:a", "inner:a", "outer:a"],
        "b": ["outer:b", "inner:b", "outer:b"],
    }


async def test_reentry_is_per_task_not_inherited_by_child_tasks() -> None:
    results = []

    @redis_locked("shared", wait=0, on_busy="skip")
    async def locked(tag: str) -> str:
        results.append(tag)
        return tag

    @redis_locked("shared", wait=0)
    async def parent() -> list[Any]:
        own = await locked("nested")  # same task: re-entered
        # A child task copies the context but is someone else: it must not
        # slip into the parent's lock.
        child = await asyncio.create_task(locked("child"))
        return [own, child]

    assert await parent() == ["nested", None]
    assert results == ["nested"]


async def test_exception_passes_and_releases() -> None:
    @redis_locked("fails", wait=0)
    async def fails() -> None:
        raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        await fails()
    assert await is_free("fails")


async def test_cancelled_call_releases() -> None:
    started = asyncio.Event()

    @redis_locked("cancel-me", wait=0)
    async def slow() -> None:
        started.set()
        await asyncio.sleep(60)

    task = asyncio.create_task(slow())
    await asyncio.wait_for(started.wait(), 10)
    assert not await is_free("cancel-me")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await is_free("cancel-me")


async def test_redis_down(dead_redis: None) -> None:  # noqa: F811
    @redis_locked("x", wait=0)
    async def closed() -> str:
        return "ran"

    @redis_locked("x", wait=0, fail_open=True)
    async def opened() -> Any:
        return current_lock()

    with signal_sent(redis_unavailable) as sent:
        with pytest.raises(RedisUnavailable):
            await closed()
        assert await opened() is None
    # As for sync callables (test_redis_down_raises_for_functions): one signal each, saying which.
    assert [fields["fail_open"] for fields in sent] == [False, True]


async def test_disabled() -> None:
    @redis_locked("x", wait=0)
    async def f() -> Any:
        return current_lock()

    with override_settings(REDISLOCK={"ENABLED": False}):
        assert await f() is None


async def test_async_with_redis_lock() -> None:
    async with redis_lock("cm:a", wait=0) as lock:
        assert lock is not None
        assert lock.name == "cm:a"
        assert isinstance(lock.fence, int)
        assert current_lock() is lock
        # The same task re-enters what it holds; another task finds it busy.
        async with redis_lock("cm:a", wait=0) as again:
            assert again is lock

        async def other() -> None:
            async with redis_lock("cm:a", wait=0):
                pass

        with pytest.raises(LockNotAcquired):
            await asyncio.create_task(other())
        assert lock.held
    assert await is_free("cm:a")
    assert current_lock() is None


async def test_async_with_shared_object_between_tasks() -> None:
    guard = redis_lock("cm:shared", wait=10)
    active: list[object] = []
    overlap: list[int] = []

    async def work() -> None:
        for _ in range(5):
            async with guard as lock:
                active.append(lock)
                if len(active) > 1:
                    overlap.append(1)
                await asyncio.sleep(0)
                active.remove(lock)

    await asyncio.wait_for(asyncio.gather(*(work() for _ in range(4))), 30)
    assert overlap == []
    assert await is_free("cm:shared")
