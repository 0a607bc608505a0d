"""``MultiLock`` and ``AsyncMultiLock`` against a real Redis: all names or none,
never waiting while holding, no deadlock whatever order callers list names in.

A scenario that takes ``drive`` runs on both drivers (tests/drive.py).
What every kind of lock does alike is in tests/test_kinds.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections import Counter
from typing import Any

import pytest
import redis

from django_redislock.core import (
    AsyncLock,
    AsyncMultiLock,
    Lock,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    RedisUnavailable,
)
from django_redislock.core.drivers.base import Observer
from tests.drive import Drive, run_to_end
from tests.helpers_oracles import audit_keyspace, plant_sentinel
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
async def test_takes_every_name_with_its_own_fence(drive: Drive, r: redis.Redis) -> None:
    plant_sentinel(r)
    earlier = drive.Lock(drive.client, "cart:b", ttl=5, wait=0)
    assert await drive(earlier.acquire())
    await drive(earlier.release())
    observer = Recorder()
    multi = drive.MultiLock(
        drive.client, ["cart:c", "cart:a", "cart:b", "cart:a"], ttl=10, wait=0, observer=observer
    )
    assert multi.names == ("cart:a", "cart:b", "cart:c")  # distinct, sorted
    assert await drive(multi.acquire())
    assert multi.held and 0 < multi.remaining <= 10
    fences = multi.fences
    assert set(fences) == {"cart:a", "cart:b", "cart:c"}
    assert all(isinstance(f, int) for f in fences.values())
    assert fences["cart:b"] > (earlier.fence or 0)  # each name counts its own
    assert multi.fence_of("cart:b") == fences["cart:b"] and multi.fence is None
    for name in multi.names:
        assert not _free(r, name)
    await drive(multi.release())
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
    async with drive.holding(multi):
        assert multi.held and not _free(r, "cart:a")
    assert not multi.held and all(_free(r, name) for name in multi.names)
    audit_keyspace(r)


async def test_bad_names_fail_at_once(drive: Drive) -> None:
    with pytest.raises(TypeError, match="single name 'cart:1'.*wrap it in a list"):
        drive.MultiLock(drive.client, "cart:1")
    with pytest.raises(ValueError, match="at least one name"):
        drive.MultiLock(drive.client, [])
    with pytest.raises(TypeError, match="must be str, got int"):
        drive.MultiLock(drive.client, ["cart:1", 2])
    multi = drive.MultiLock(drive.client, ["a", "b"], wait=0)
    with pytest.raises(KeyError, match="'c' is not one of this lock's names"):
        multi.fence_of("c")
    with pytest.raises(LockNotOwned):
        await drive(multi.release())


async def test_a_busy_name_leaves_none_held(drive: Drive, r: redis.Redis) -> None:
    holder = drive.Lock(drive.client, "m:b", ttl=10, wait=0)
    assert await drive(holder.acquire())
    observer = Recorder()
    multi = drive.MultiLock(drive.client, ["m:c", "m:b", "m:a"], ttl=10, wait=0, observer=observer)
    assert not await drive(multi.acquire())
    assert not multi.held
    assert multi.retry_after is not None and 0 < multi.retry_after <= 10
    assert _free(r, "m:a") and _free(r, "m:c")  # a was taken and given back
    # Tries and give-backs are not reported; staying busy is, once per name,
    # as taking them all is (a lock on several names counts once per name).
    assert observer.events == [("busy", "m:a"), ("busy", "m:b"), ("busy", "m:c")]
    with pytest.raises(LockNotAcquired, match="m:a, m:b, m:c"):
        async with drive.holding(multi):
            pass  # pragma: no cover
    await drive(holder.release())
    async with drive.holding(multi):
        assert multi.held


async def test_waits_for_a_busy_name_holding_nothing(drive: Drive, r: redis.Redis) -> None:
    holder = drive.Lock(drive.client, "w:b", ttl=10, wait=0)
    assert await drive(holder.acquire())
    multi = drive.MultiLock(drive.client, ["w:a", "w:b", "w:c"], ttl=10, wait=10)

    async def take() -> dict[str, Any]:
        result = {"ok": await drive(multi.acquire()), "held": multi.held}
        await drive(multi.release())
        return result

    party = drive.spawn(take)
    try:
        await drive.until(lambda: _queued(r, "w:b") == 1, 10)
        # While it waits its turn on b, a and c are free for anyone.
        assert _free(r, "w:a") and _free(r, "w:c")
    finally:
        await drive(holder.release())
    assert await drive.join(party, timeout=10) == [{"ok": True, "held": True}]
    assert not multi.held


async def test_loss_of_one_name_is_reported_and_the_others_released(
    drive: Drive, r: redis.Redis
) -> None:
    observer = Recorder()
    multi = drive.MultiLock(drive.client, ["l:a", "l:b"], ttl=10, wait=0, observer=observer)
    assert await drive(multi.acquire())
    r.delete(multi.locks["l:a"].keys.lease)  # as if it had expired
    with pytest.raises(LockLost, match="l:a, l:b"):
        await drive(multi.release())
    assert ("lost", "l:a") in observer.events and ("released", "l:b") in observer.events
    assert multi.lost
    assert _free(r, "l:b")


async def test_redis_down_raises_and_holds_nothing(drive: Drive) -> None:
    url = f"redis://127.0.0.1:{free_port()}"
    async with drive.connect(url, socket_timeout=1, socket_connect_timeout=1) as client:
        multi = drive.MultiLock(client, ["d:a", "d:b"], ttl=5, wait=0)
        with pytest.raises(RedisUnavailable):
            await drive(multi.acquire())
        assert not multi.held


async def test_extend_renews_every_lease(drive: Drive, r: redis.Redis) -> None:
    multi = drive.MultiLock(drive.client, ["e:a", "e:b"], ttl=2, wait=0)
    assert await drive(multi.acquire())
    await drive(multi.extend(20))
    for lock in multi:
        assert r.pttl(lock.keys.lease) > 10_000
    await drive(multi.release())


def _scripts_run(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{n}", {}).get("calls", 0)) for n in ("eval", "evalsha"))


async def test_uncontended_costs_one_script_per_name(drive: Drive, r: redis.Redis) -> None:
    """What docs/locks.rst says: k names cost k round trips, like k locks."""
    multi = drive.MultiLock(drive.client, [f"rt:{i}" for i in range(5)], ttl=10, wait=0)
    assert await drive(multi.acquire())  # loads the scripts
    await drive(multi.release())
    before = _scripts_run(r)
    assert await drive(multi.acquire())
    taken = _scripts_run(r)
    await drive(multi.release())
    assert (taken - before, _scripts_run(r) - taken) == (5, 5)


async def test_each_name_is_a_row_of_its_own_for_operators(drive: Drive, r: redis.Redis) -> None:
    from django_redislock.core.engine.keys import KeySpace
    from django_redislock.core.ops.inspection import list_locks

    multi = drive.MultiLock(drive.client, ["row:b", "row:a"], ttl=10, wait=0, label="checkout")
    async with drive.holding(multi):
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


async def _carts(drive: Drive, make: Any, callers: int = 8, rounds: int = 40) -> dict[str, Any]:
    """Callers lock random overlapping sets of names, each listed in random
    order, and count who is inside each name."""
    names = [f"load:{i}" for i in range(5)]
    inside: Counter[str] = Counter()
    guard = threading.Lock()
    overlaps: list[str] = []
    failures: list[BaseException] = []
    calls = Counter[str]()
    start = drive.event()

    async def caller(seed: int) -> None:
        rng = random.Random(seed)
        try:
            await start.wait(10)
            for _ in range(rounds):
                mine = rng.sample(names, rng.randint(2, 4))
                rng.shuffle(mine)
                # The wait bounds a slow turn, not a deadlock (which never ends and
                # is caught below): on a host loaded as CI's six workers load two
                # cores, eight callers of 2 to 4 names each took more than 20 s.
                lock = make(drive.client, mine, ttl=10, wait=45)
                assert await drive(lock.acquire()), f"{mine} not acquired within its wait"
                with guard:
                    for name in mine:
                        inside[name] += 1
                        overlaps.extend([name] if inside[name] > 1 else [])
                await drive.sleep(0.0005)  # the work: lets the others run
                with guard:
                    for name in mine:
                        inside[name] -= 1
                await drive(lock.release())
                with guard:
                    calls["done"] += 1
        except Exception as exc:
            failures.append(exc)

    parties = [drive.spawn(lambda seed=seed: caller(seed)) for seed in range(callers)]
    start.set()
    stuck = False
    try:
        await drive.join(*parties, timeout=100)
    except (AssertionError, TimeoutError):
        stuck = True
    return {
        "stuck": stuck,
        "failures": failures,
        "overlaps": len(overlaps),
        "done": calls["done"],
        "names": names,
    }


async def test_opposite_orders_under_load_never_deadlock_nor_overlap(
    drive: Drive, r: redis.Redis
) -> None:
    """Every acquire succeeds within its wait; no name ever has two holders."""
    plant_sentinel(r)
    result = await _carts(drive, drive.MultiLock)
    assert not result["stuck"], "a caller never finished: deadlock"
    assert result["failures"] == []
    assert result["overlaps"] == 0
    assert result["done"] == 8 * 40
    assert all(_free(r, name) for name in result["names"])
    audit_keyspace(r)


def test_the_oracle_sees_overlap_without_the_lock(r: redis.Redis) -> None:
    result = run_to_end(_carts(Drive("sync", r, r), _NoLock))
    assert not result["stuck"] and result["failures"] == []
    assert result["overlaps"] > 0


# -- what only tasks can do: be cancelled ----------------------------------------------------
async def test_cancelled_while_waiting_leaves_nothing_behind(
    ar: Any, r: redis.Redis, adrive: Drive
) -> None:
    holder = AsyncLock(ar, "z:b", ttl=10, wait=0)
    assert await holder.acquire()
    multi = AsyncMultiLock(ar, ["z:a", "z:b", "z:c"], ttl=10, wait=10)
    waiting = asyncio.ensure_future(multi.acquire())
    await adrive.until(lambda: _queued(r, "z:b") == 1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not multi.held
    assert _queued(r, "z:b") == 0
    assert _free(r, "z:a") and _free(r, "z:c")
    await holder.release()
    assert _free(r, "z:b")


async def test_a_release_cancelled_midway_still_gives_every_name_back(
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


async def test_a_give_back_cancelled_midway_leaves_nothing_held(ar: Any, r: redis.Redis) -> None:
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
