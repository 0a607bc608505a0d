"""``MultiLock`` and ``AsyncMultiLock`` against a real Redis: all names or none,
never waiting while holding, no deadlock whatever order callers list names in."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis
import redis.asyncio

from django_redislock.core import (
    AsyncLock,
    AsyncMultiLock,
    Lock,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    MultiLock,
    RedisUnavailable,
)
from django_redislock.core.drivers.base import Observer
from tests.helpers_oracles import audit_keyspace, plant_sentinel, wait_until
from tests.servers import free_port


class Recorder(Observer):
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def acquired(self, lock: Any, waited: float) -> None:
        self.events.append(("acquired", lock.name))

    def busy(self, lock: Any, waited: float) -> None:
        self.events.append(("busy", lock.name))

    def released(self, lock: Any, held: float) -> None:
        self.events.append(("released", lock.name))

    def lost(self, lock: Any, reason: str) -> None:
        self.events.append(("lost", lock.name))


def _free(r: redis.Redis, name: str) -> bool:
    """Whether ``name`` can be taken right now (taken and given back if so)."""
    probe = Lock(r, name, ttl=5, wait=0)
    if not probe.acquire():
        return False
    probe.release()
    return True


def _queued(r: redis.Redis, name: str) -> int:
    return int(r.llen(Lock(r, name).keys.queue))


# -- basics ------------------------------------------------------------------------------
def test_takes_every_name_with_its_own_fence(r: redis.Redis) -> None:
    plant_sentinel(r)
    earlier = Lock(r, "cart:b", ttl=5, wait=0)
    assert earlier.acquire()
    earlier.release()
    observer = Recorder()
    multi = MultiLock(
        r, ["cart:c", "cart:a", "cart:b", "cart:a"], ttl=10, wait=0, observer=observer
    )
    assert multi.names == ("cart:a", "cart:b", "cart:c")  # distinct, sorted
    assert multi.acquire()
    assert multi.held and 0 < multi.remaining <= 10
    fences = multi.fences
    assert set(fences) == {"cart:a", "cart:b", "cart:c"}
    assert all(isinstance(f, int) for f in fences.values())
    assert fences["cart:b"] > (earlier.fence or 0)  # each name counts its own
    assert multi.fence_of("cart:b") == fences["cart:b"] and multi.fence is None
    for name in multi.names:
        assert not _free(r, name)
    multi.release()
    assert not multi.held
    assert all(_free(r, name) for name in multi.names)
    assert observer.events == [
        ("acquired", "cart:a"),
        ("acquired", "cart:b"),
        ("acquired", "cart:c"),
        ("released", "cart:c"),
        ("released", "cart:b"),
        ("released", "cart:a"),
    ]
    audit_keyspace(r)


def test_bad_names_fail_at_once(r: redis.Redis) -> None:
    with pytest.raises(TypeError, match="single name 'cart:1'.*wrap it in a list"):
        MultiLock(r, "cart:1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one name"):
        MultiLock(r, [])
    with pytest.raises(TypeError, match="must be str, got int"):
        MultiLock(r, ["cart:1", 2])  # type: ignore[list-item]
    multi = MultiLock(r, ["a", "b"], wait=0)
    with pytest.raises(KeyError, match="'c' is not one of this lock's names"):
        multi.fence_of("c")
    with pytest.raises(LockNotOwned):
        multi.release()


def test_a_busy_name_leaves_none_held(r: redis.Redis) -> None:
    holder = Lock(r, "m:b", ttl=10, wait=0)
    assert holder.acquire()
    observer = Recorder()
    multi = MultiLock(r, ["m:c", "m:b", "m:a"], ttl=10, wait=0, observer=observer)
    assert not multi.acquire()
    assert not multi.held
    assert multi.retry_after is not None and 0 < multi.retry_after <= 10
    assert _free(r, "m:a") and _free(r, "m:c")  # a was taken and given back
    assert observer.events == [("busy", "m:b")]  # tries and give-backs are not reported
    with pytest.raises(LockNotAcquired, match="m:a, m:b, m:c"), multi:
        pass
    holder.release()
    with multi:
        assert multi.held


def test_waits_for_a_busy_name_holding_nothing(r: redis.Redis) -> None:
    holder = Lock(r, "w:b", ttl=10, wait=0)
    assert holder.acquire()
    multi = MultiLock(r, ["w:a", "w:b", "w:c"], ttl=10, wait=10)
    result: dict[str, Any] = {}

    def take() -> None:
        result["ok"] = multi.acquire()
        result["held"] = multi.held
        multi.release()

    thread = threading.Thread(target=take)
    thread.start()
    try:
        wait_until(lambda: _queued(r, "w:b") == 1, 10)
        # While it waits its turn on b, a and c are free for anyone.
        assert _free(r, "w:a") and _free(r, "w:c")
    finally:
        holder.release()
        thread.join(10)
    assert not thread.is_alive()
    assert result == {"ok": True, "held": True}
    assert not multi.held


def test_loss_of_one_name_is_reported_and_the_others_released(r: redis.Redis) -> None:
    observer = Recorder()
    multi = MultiLock(r, ["l:a", "l:b"], ttl=10, wait=0, observer=observer)
    assert multi.acquire()
    r.delete(multi.locks["l:a"].keys.lease)  # as if it had expired
    with pytest.raises(LockLost, match="l:a, l:b"):
        multi.release()
    assert ("lost", "l:a") in observer.events and ("released", "l:b") in observer.events
    assert multi.lost
    assert _free(r, "l:b")


def test_redis_down_raises_and_holds_nothing() -> None:
    client = redis.Redis(port=free_port(), socket_timeout=1, socket_connect_timeout=1)
    multi = MultiLock(client, ["d:a", "d:b"], ttl=5, wait=0)
    with pytest.raises(RedisUnavailable):
        multi.acquire()
    assert not multi.held


def test_extend_renews_every_lease(r: redis.Redis) -> None:
    multi = MultiLock(r, ["e:a", "e:b"], ttl=2, wait=0)
    assert multi.acquire()
    multi.extend(20)
    for lock in multi:
        assert r.pttl(lock.keys.lease) > 10_000
    multi.release()


def _scripts_run(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{n}", {}).get("calls", 0)) for n in ("eval", "evalsha"))


def test_uncontended_costs_one_script_per_name(r: redis.Redis) -> None:
    """What docs/locks.rst says: k names cost k round trips, like k locks."""
    multi = MultiLock(r, [f"rt:{i}" for i in range(5)], ttl=10, wait=0)
    assert multi.acquire()  # loads the scripts
    multi.release()
    before = _scripts_run(r)
    assert multi.acquire()
    taken = _scripts_run(r)
    multi.release()
    assert (taken - before, _scripts_run(r) - taken) == (5, 5)


def test_each_name_is_a_row_of_its_own_for_operators(r: redis.Redis) -> None:
    from django_redislock.core.engine.keys import KeySpace
    from django_redislock.core.ops.inspection import list_locks

    with MultiLock(r, ["row:b", "row:a"], ttl=10, wait=0, label="checkout") as multi:
        rows = list_locks(r, KeySpace.default(), "row:*")
        assert [(row.name, row.label, row.fence) for row in rows] == [
            ("row:a", "checkout", multi.fence_of("row:a")),
            ("row:b", "checkout", multi.fence_of("row:b")),
        ]


# -- under load --------------------------------------------------------------------------
class _NoLock:
    """The control: the same callers with no lock at all."""

    def __init__(self, client: Any, names: list[str], **options: Any) -> None:
        pass

    def acquire(self) -> bool:
        return True

    def release(self) -> None:
        pass


def _carts(r: redis.Redis, make: Any, callers: int = 8, rounds: int = 40) -> dict[str, Any]:
    """Callers lock random overlapping sets of names, each listed in random
    order, and count who is inside each name."""
    names = [f"load:{i}" for i in range(5)]
    inside: Counter[str] = Counter()
    guard = threading.Lock()
    overlaps: list[str] = []
    failures: list[BaseException] = []
    calls = Counter[str]()
    start = threading.Event()

    def caller(seed: int) -> None:
        rng = random.Random(seed)
        try:
            start.wait(10)
            for _ in range(rounds):
                mine = rng.sample(names, rng.randint(2, 4))
                rng.shuffle(mine)
                lock = make(r, mine, ttl=10, wait=20)
                assert lock.acquire(), f"{mine} not acquired within its wait"
                with guard:
                    for name in mine:
                        inside[name] += 1
                        overlaps.extend([name] if inside[name] > 1 else [])
                time.sleep(0.0005)  # the work: lets the others run
                with guard:
                    for name in mine:
                        inside[name] -= 1
                lock.release()
                with guard:
                    calls["done"] += 1
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=caller, args=(seed,)) for seed in range(callers)]
    for t in threads:
        t.start()
    start.set()
    for t in threads:
        t.join(60)
    return {
        "stuck": sum(t.is_alive() for t in threads),
        "failures": failures,
        "overlaps": len(overlaps),
        "done": calls["done"],
        "names": names,
    }


def test_opposite_orders_under_load_never_deadlock_nor_overlap(r: redis.Redis) -> None:
    """Every acquire succeeds within its wait; no name ever has two holders."""
    plant_sentinel(r)
    result = _carts(r, MultiLock)
    assert result["stuck"] == 0, "a caller never finished: deadlock"
    assert result["failures"] == []
    assert result["overlaps"] == 0
    assert result["done"] == 8 * 40
    assert all(_free(r, name) for name in result["names"])
    audit_keyspace(r)


def test_the_oracle_sees_overlap_without_the_lock(r: redis.Redis) -> None:
    result = _carts(r, _NoLock)
    assert result["stuck"] == 0 and result["failures"] == []
    assert result["overlaps"] > 0


# -- asyncio -----------------------------------------------------------------------------
@pytest.fixture
async def ar(redis_server: Any) -> Any:
    client = redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=5)
    yield client
    await client.aclose()


async def test_async_takes_and_releases_every_name(ar: Any, r: redis.Redis) -> None:
    multi = AsyncMultiLock(ar, ["x:b", "x:a"], ttl=10, wait=0)
    assert await multi.acquire()
    assert multi.held and set(multi.fences) == {"x:a", "x:b"}
    assert not _free(r, "x:a") and not _free(r, "x:b")
    await multi.release()
    assert _free(r, "x:a") and _free(r, "x:b")
    async with multi:
        assert multi.held
    assert not multi.held


async def test_async_busy_and_wait(ar: Any, r: redis.Redis) -> None:
    holder = AsyncLock(ar, "y:b", ttl=10, wait=0)
    assert await holder.acquire()
    multi = AsyncMultiLock(ar, ["y:a", "y:b"], ttl=10, wait=0)
    assert not await multi.acquire()
    assert _free(r, "y:a")

    async def take() -> bool:
        ok = await multi.acquire(10)
        await multi.release()
        return ok

    waiting = asyncio.ensure_future(take())
    deadline = time.monotonic() + 10
    while _queued(r, "y:b") != 1:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)
    assert _free(r, "y:a")
    await holder.release()
    assert await asyncio.wait_for(waiting, 10)


async def test_async_cancelled_while_waiting_leaves_nothing_behind(ar: Any, r: redis.Redis) -> None:
    holder = AsyncLock(ar, "z:b", ttl=10, wait=0)
    assert await holder.acquire()
    multi = AsyncMultiLock(ar, ["z:a", "z:b", "z:c"], ttl=10, wait=10)
    waiting = asyncio.ensure_future(multi.acquire())
    deadline = time.monotonic() + 10
    while _queued(r, "z:b") != 1:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not multi.held
    assert _queued(r, "z:b") == 0
    assert _free(r, "z:a") and _free(r, "z:c")
    await holder.release()
    assert _free(r, "z:b")


async def test_async_release_cancelled_midway_still_gives_every_name_back(
    ar: Any, r: redis.Redis
) -> None:
    multi = AsyncMultiLock(ar, ["c:a", "c:b", "c:c"], ttl=30, wait=0)

    async def take_and_release() -> None:
        assert await multi.acquire()
        taken.set()
        await go.wait()
        await multi.release()

    taken, go = asyncio.Event(), asyncio.Event()
    task = asyncio.ensure_future(take_and_release())
    await asyncio.wait_for(taken.wait(), 10)
    go.set()
    await asyncio.sleep(0)  # the task resumes, into its first release
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert all(_free(r, name) for name in ("c:a", "c:b", "c:c"))


async def test_async_give_back_cancelled_midway_leaves_nothing_held(
    ar: Any, r: redis.Redis
) -> None:
    """Cancelled while it gives back what it took on the way to a busy name."""
    holder = AsyncLock(ar, "g:d", ttl=30, wait=0)
    assert await holder.acquire()
    multi = AsyncMultiLock(ar, ["g:a", "g:b", "g:c", "g:d"], ttl=30, wait=0)
    for steps in range(20):  # cancel at a different point each time
        task = asyncio.ensure_future(multi.acquire())
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            assert await task is False
        assert all(_free(r, name) for name in ("g:a", "g:b", "g:c"))
    await holder.release()
