"""Semaphore and AsyncSemaphore: counting, expiry on the server clock, fair admission.

A scenario that takes ``drive`` runs on both drivers (tests/drive.py).
What every kind of lock does alike is in tests/test_kinds.py.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import threading
import time

import pytest
import redis

from django_redislock.core.drivers.semaphore import Semaphore
from django_redislock.core.drivers.semaphore_async import AsyncSemaphore
from django_redislock.core.engine.keys import KeySpace
from django_redislock.core.exceptions import LockError, LockLost, LockNotOwned
from tests.drive import Drive
from tests.servers import RedisServer

KS = KeySpace()


def keys(name: str):  # noqa: ANN201
    return KS.semaphore(name)


def holders(r: redis.Redis, name: str) -> list[bytes]:
    return list(r.zrange(keys(name).lease, 0, -1))


class Oracle:
    """Counts holders inside the critical section, independently of Redis."""

    def __init__(self) -> None:
        self.inside = 0
        self.max = 0
        self.lock = threading.Lock()

    def enter(self) -> None:
        with self.lock:
            self.inside += 1
            self.max = max(self.max, self.inside)

    def leave(self) -> None:
        with self.lock:
            self.inside -= 1


async def test_acquire_release_and_key_layout(drive: Drive, r: redis.Redis) -> None:
    sem = drive.Semaphore(drive.client, "reports", 2, ttl=30, wait=0, label="nightly")
    assert await drive(sem.acquire())
    k = keys("reports")
    assert k.lease.startswith(b"redislock:S:{") and k.state.startswith(b"redislock:SH:{")
    assert holders(r, "reports") == [sem.token.encode()]
    server_ms = int(r.time()[0]) * 1000
    score = r.zscore(k.lease, sem.token)
    assert server_ms + 25_000 < score <= server_ms + 31_000
    state = r.hgetall(k.state)
    assert state[b"n"] == b"reports" and state[b"l"] == b"2"
    owner = json.loads(state[b"o:" + sem.token.encode()])
    assert owner["pid"] == os.getpid() and owner["label"] == "nightly"
    assert set(owner) == {"host", "pid", "thread", "label"}
    assert int(state[b"a:" + sem.token.encode()]) <= server_ms + 1000
    for key in (k.lease, k.state):
        assert r.pttl(key) > 0
    assert sem.held and await drive(sem.owned()) and sem.fence is None
    await drive(sem.release())
    assert holders(r, "reports") == []
    assert not any(f.startswith((b"o:", b"a:", b"s:")) for f in r.hgetall(k.state))
    assert not sem.held


async def test_limit_is_enforced(drive: Drive, r: redis.Redis) -> None:
    sems = [drive.Semaphore(drive.client, "s", 3, wait=0) for _ in range(4)]
    assert [await drive(s.acquire()) for s in sems] == [True, True, True, False]
    assert sems[3].retry_after is not None and sems[3].retry_after > 0
    await drive(sems[0].release())
    assert await drive(sems[3].acquire())
    assert len(holders(r, "s")) == 3


async def test_one_round_trip_each_when_uncontended(drive: Drive, r: redis.Redis) -> None:
    warm = drive.Semaphore(drive.client, "warm", 1, wait=5)
    assert await drive(warm.acquire())
    await drive(warm.release())  # scripts are cached now
    sem = drive.Semaphore(drive.client, "rt", 1, wait=5)
    r.config_resetstat()
    assert await drive(sem.acquire())
    stats = r.info("commandstats")
    # The INFO call itself is not counted until it finishes.
    assert stats["cmdstat_evalsha"]["calls"] == 1
    assert "cmdstat_eval" not in stats
    r.config_resetstat()
    await drive(sem.release())
    stats = r.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == 1


async def test_crashed_holder_permit_expires_on_server_clock(drive: Drive, r: redis.Redis) -> None:
    crashed = drive.Semaphore(drive.client, "c", 1, ttl=0.3, wait=0)
    assert await drive(crashed.acquire())
    other = drive.Semaphore(drive.client, "c", 1, wait=10)
    assert await drive(other.acquire(wait=0)) is False
    # The waiter's fallback timer is the permit's expiry: no release needed.
    assert await drive(other.acquire())
    assert holders(r, "c") == [other.token.encode()]
    with pytest.raises(LockLost):
        await drive(crashed.release())
    await drive(other.release())


async def test_release_wakes_waiter_by_notification(drive: Drive, r: redis.Redis) -> None:
    # The holders' permits last 60 s and the waiter waits 10 s: only the
    # wake-up published at release can get the waiter in.
    held = [drive.Semaphore(drive.client, "n", 2, ttl=60, wait=0) for _ in range(2)]
    assert [await drive(s.acquire()) for s in held] == [True, True]
    assert await drive(drive.Semaphore(drive.client, "n", 2, wait=0).acquire()) is False
    waiter = drive.Semaphore(drive.client, "n", 2, wait=10)
    party = drive.spawn(lambda: drive(waiter.acquire()))
    await drive.until(lambda: r.llen(keys("n").queue) == 1)
    await drive(held[0].release())
    assert await drive.join(party, timeout=15) == [True]
    assert sorted(holders(r, "n")) == sorted([held[1].token.encode(), waiter.token.encode()])


async def test_waiters_are_admitted_in_arrival_order(drive: Drive, r: redis.Redis) -> None:
    holder = drive.Semaphore(drive.client, "fifo", 1, ttl=60, wait=0)
    assert await drive(holder.acquire())
    order: list[int] = []
    parties = []
    for i in range(5):
        sem = drive.Semaphore(drive.client, "fifo", 1, wait=20)

        async def run(sem: AsyncSemaphore = sem, i: int = i) -> None:
            assert await drive(sem.acquire())
            order.append(i)
            await drive(sem.release())

        parties.append(drive.spawn(run))
        # Each waiter is in the queue before the next one arrives.
        await drive.until(lambda i=i: r.llen(keys("fifo").queue) == i + 1)
    await drive(holder.release())
    await drive.join(*parties)
    assert order == [0, 1, 2, 3, 4]


async def test_several_waiters_woken_when_several_permits_free(
    drive: Drive, r: redis.Redis
) -> None:
    held = [drive.Semaphore(drive.client, "multi", 3, ttl=60, wait=0) for _ in range(3)]
    assert [await drive(s.acquire()) for s in held] == [True] * 3
    inside = [drive.event(), drive.event()]
    done = drive.event()
    waiters = [drive.Semaphore(drive.client, "multi", 3, wait=15) for _ in range(2)]

    async def run(i: int) -> None:
        assert await drive(waiters[i].acquire())
        inside[i].set()
        await inside[1 - i].wait(15)  # both inside together
        await done.wait(15)
        await drive(waiters[i].release())

    parties = [drive.spawn(lambda i=i: run(i)) for i in range(2)]
    await drive.until(lambda: r.llen(keys("multi").queue) == 2)
    await drive(held[0].release())
    await drive(held[1].release())
    for event in inside:
        await event.wait(15)
    assert len(holders(r, "multi")) == 3
    done.set()
    await drive.join(*parties, timeout=15)
    await drive(held[2].release())


async def test_newcomer_cannot_barge_past_queue(drive: Drive, r: redis.Redis) -> None:
    k = keys("barge")
    holder = drive.Semaphore(drive.client, "barge", 1, ttl=60, wait=0)
    assert await drive(holder.acquire())
    # A queued waiter with no channel: its wake-up goes nowhere, so the permit
    # freed below stays reserved for it for the grace period.
    r.rpush(k.queue, "w1")
    r.hset(k.state, "w:w1", f"{int(r.time()[0]) * 1000 + 30_000}|-")
    await drive(holder.release())
    assert holders(r, "barge") == [b"w1"] and r.hget(k.state, "r:w1") == b"1"
    newcomer = drive.Semaphore(drive.client, "barge", 1, wait=0)
    assert await drive(newcomer.acquire()) is False
    # Once the reservation runs out unclaimed, the permit is free again.
    late = drive.Semaphore(drive.client, "barge", 1, wait=10)
    assert await drive(late.acquire())
    assert holders(r, "barge") == [late.token.encode()]


async def test_callers_never_exceed_limit(drive: Drive, r: redis.Redis) -> None:
    # 20 threads or tasks on 6 pooled connections, 5 rounds each, limit 3.
    oracle = Oracle()
    limit, workers, rounds = 3, 20, 5
    start = drive.event()
    async with drive.pooled(6) as client:

        async def run() -> None:
            sem = drive.Semaphore(client, "threads", limit, ttl=30, wait=30)
            await start.wait(15)
            for _ in range(rounds):
                async with drive.holding(sem):
                    oracle.enter()
                    await drive.sleep(0.005)
                    oracle.leave()

        parties = [drive.spawn(run) for _ in range(workers)]
        start.set()
        await drive.join(*parties, timeout=60)
    assert 1 <= oracle.max <= limit
    assert holders(r, "threads") == []


async def test_hundreds_of_waiters_share_few_connections(drive: Drive, r: redis.Redis) -> None:
    # 200 waiting threads or tasks, 4 pooled connections: waiters must not sit
    # on a connection, or the holder could never release.
    count = 200
    oracle = Oracle()
    finished: list[bool] = []
    async with drive.pooled(4) as client:
        holder = drive.Semaphore(client, "many", 2, ttl=60, wait=0)
        assert await drive(holder.acquire())

        async def run() -> None:
            sem = drive.Semaphore(client, "many", 2, ttl=30, wait=60)
            ok = await drive(sem.acquire())
            if ok:
                oracle.enter()
                await drive.sleep(0)
                oracle.leave()
                await drive(sem.release())
            finished.append(ok)

        parties = [drive.spawn(run) for _ in range(count)]
        await drive.until(lambda: r.llen(keys("many").queue) + len(finished) >= count - 10, 30)
        await drive(holder.release())
        await drive.join(*parties, timeout=60)
    assert len(finished) == count and all(finished)
    assert oracle.max <= 2


def _worker(path: str, start_at: float, rounds: int, q: multiprocessing.Queue) -> None:
    client = redis.Redis(unix_socket_path=path, socket_timeout=5)
    sem = Semaphore(client, "procs", 2, ttl=30, wait=30)
    time.sleep(max(0.0, start_at - time.time()))
    ok = 0
    for _ in range(rounds):
        with sem:
            inside = client.incr("oracle:inside")
            client.eval(
                "if tonumber(ARGV[1]) > tonumber(redis.call('GET', KEYS[1]) or '0') then "
                "redis.call('SET', KEYS[1], ARGV[1]) end",
                1,
                "oracle:max",
                inside,
            )
            time.sleep(0.002)
            client.decr("oracle:inside")
            ok += 1
    q.put(ok)


def test_processes_never_exceed_limit(r: redis.Redis) -> None:
    path = r.connection_pool.connection_kwargs["path"]
    ctx = multiprocessing.get_context("fork")
    q: multiprocessing.Queue = ctx.Queue()
    start_at = time.time() + 0.5
    procs = [ctx.Process(target=_worker, args=(path, start_at, 6, q)) for _ in range(5)]
    for p in procs:
        p.start()
    counts = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    assert counts == [6] * 5
    assert 1 <= int(r.get("oracle:max")) <= 2
    assert holders(r, "procs") == []


async def test_lower_limit_admits_nobody_until_holders_drop_below_it(
    drive: Drive, r: redis.Redis
) -> None:
    old = [drive.Semaphore(drive.client, "shrink", 3, ttl=60, wait=0) for _ in range(3)]
    assert [await drive(s.acquire()) for s in old] == [True] * 3
    new = drive.Semaphore(drive.client, "shrink", 1, wait=0)
    assert await drive(new.acquire()) is False
    assert r.hget(keys("shrink").state, "l") == b"1"
    await drive(old[0].release())
    assert await drive(new.acquire()) is False  # 2 holders, limit 1
    await drive(old[1].release())
    assert await drive(new.acquire()) is False  # 1 holder, limit 1
    await drive(old[2].release())
    assert await drive(new.acquire()) is True
    assert len(holders(r, "shrink")) == 1


async def test_lowered_limit_does_not_wake_waiters_into_overfill(
    drive: Drive, r: redis.Redis
) -> None:
    old = [drive.Semaphore(drive.client, "shrink2", 3, ttl=60, wait=0) for _ in range(3)]
    assert [await drive(s.acquire()) for s in old] == [True] * 3
    waiter = drive.Semaphore(drive.client, "shrink2", 1, wait=15)
    party = drive.spawn(lambda: drive(waiter.acquire()))
    await drive.until(lambda: r.llen(keys("shrink2").queue) == 1)
    await drive(old[0].release())
    await drive(old[1].release())
    # Still one holder, limit 1: nobody admitted.
    assert r.llen(keys("shrink2").queue) == 1 and not party.done()
    assert len(holders(r, "shrink2")) == 1
    await drive(old[2].release())
    assert await drive.join(party, timeout=15) == [True]
    assert holders(r, "shrink2") == [waiter.token.encode()]


def test_reservation_given_back_when_limit_drops_before_claim(r: redis.Redis) -> None:
    k = keys("claim")
    a = Semaphore(r, "claim", 2, ttl=60, wait=0)
    b = Semaphore(r, "claim", 2, ttl=60, wait=0)
    assert a.acquire() and b.acquire()
    # A waiter queued under limit 2 (by hand, so its claim can be timed).
    r.rpush(k.queue, "w1")
    server_ms = int(r.time()[0]) * 1000
    r.hset(k.state, "w:w1", f"{server_ms + 30_000}|-")
    a.release()  # reserves the freed permit for w1
    assert r.hget(k.state, "r:w1") == b"1" and len(holders(r, "claim")) == 2
    # Before w1 claims, a newcomer lowers the limit to 1.
    low = Semaphore(r, "claim", 1, wait=0)
    assert low.acquire() is False
    from django_redislock.core.drivers.semaphore import ACQUIRE
    from django_redislock.core.io import calls

    granted, _ = calls.run(
        r,
        ACQUIRE,
        (k.lease, k.queue, k.state),
        ("w1", 1000, b"claim", "{}", 5000, b"-", 2000, 60000, 2),
    )
    # w1 states limit 2 but the zset holds b and w1's reservation: 2 <= 2, so
    # it may claim. Now lower again and let another reservation be revoked.
    assert granted == 1
    assert len(holders(r, "claim")) == 2
    r.rpush(k.queue, "w2")
    r.hset(k.state, "w:w2", f"{server_ms + 30_000}|-")
    b.release()  # current limit is 2 (w1's), one permit free: reserved for w2
    assert r.hget(k.state, "r:w2") == b"1"
    granted, _ = calls.run(
        r,
        ACQUIRE,
        (k.lease, k.queue, k.state),
        ("w2", 1000, b"claim", "{}", 5000, b"-", 2000, 60000, 1),
    )
    # Limit 1 with w1 holding: claiming would make 2. Given back, first in line.
    assert granted == 0
    assert holders(r, "claim") == [b"w1"]
    assert r.lindex(k.queue, 0) == b"w2"


async def test_refresh_extends_only_own_live_permit(drive: Drive, r: redis.Redis) -> None:
    sem = drive.Semaphore(drive.client, "ref", 1, ttl=5, wait=0)
    assert await drive(sem.acquire())
    before = r.zscore(keys("ref").lease, sem.token)
    await drive(sem.refresh(ttl=50))
    assert r.zscore(keys("ref").lease, sem.token) > before + 40_000
    assert sem.remaining > 40
    assert await drive(drive.clear_semaphore(drive.client, KS, "ref")) == 1
    with pytest.raises(LockLost):
        await drive(sem.refresh())
    with pytest.raises(LockLost):
        await drive(sem.release())


async def test_only_the_acquiring_thread_or_task_releases(drive: Drive) -> None:
    sem = drive.Semaphore(drive.client, "own", 1, wait=0)
    with pytest.raises(LockNotOwned):
        await drive(sem.release())
    assert await drive(sem.acquire())
    with pytest.raises(LockNotOwned):
        await drive.join(drive.spawn(lambda: drive(sem.release())), timeout=5)
    with pytest.raises(LockError):
        await drive(sem.acquire())  # already held by this thread or task
    await drive(sem.release())


async def test_clear_one_and_all_wakes_waiters(drive: Drive, r: redis.Redis) -> None:
    clear = drive.clear_semaphore
    sems = [drive.Semaphore(drive.client, "clr", 2, ttl=60, wait=0) for _ in range(2)]
    assert [await drive(s.acquire()) for s in sems] == [True, True]
    waiter = drive.Semaphore(drive.client, "clr", 2, wait=10)
    party = drive.spawn(lambda: drive(waiter.acquire()))
    await drive.until(lambda: r.llen(keys("clr").queue) == 1)
    assert await drive(clear(drive.client, KS, "clr", sems[0].token)) == 1
    assert await drive.join(party, timeout=10) == [True]
    state = r.hgetall(keys("clr").state)
    assert b"o:" + sems[0].token.encode() not in state
    assert await drive(clear(drive.client, KS, "clr", "no-such-token")) == 0
    assert await drive(clear(drive.client, KS, "clr")) == 2
    assert holders(r, "clr") == []
    assert not any(f.startswith((b"o:", b"a:", b"r:", b"s:")) for f in r.hgetall(keys("clr").state))
    with pytest.raises(LockLost):
        await drive(sems[1].release())


async def test_cancelled_acquire_leaves_nothing(adrive: Drive, r: redis.Redis) -> None:
    holder = AsyncSemaphore(adrive.client, "cancel", 1, ttl=60, wait=0)
    assert await holder.acquire()
    waiter = AsyncSemaphore(adrive.client, "cancel", 1, wait=30)
    task = asyncio.create_task(waiter.acquire())
    await adrive.until(lambda: r.llen(keys("cancel").queue))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    k = keys("cancel")
    assert r.llen(k.queue) == 0
    assert not any(f.startswith(b"w:") for f in r.hgetall(k.state))
    await holder.release()
    assert r.zcard(k.lease) == 0


@pytest.mark.parametrize(
    ("limit", "error"),
    [(0, ValueError), (-1, ValueError), ("3", TypeError), (True, TypeError), (2.5, TypeError)],
)
async def test_bad_limit(drive: Drive, limit: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="limit"):
        drive.Semaphore(drive.client, "bad", limit)


async def test_bad_ttl_and_wait(drive: Drive) -> None:
    with pytest.raises(ValueError, match="ttl"):
        drive.Semaphore(drive.client, "bad", 1, ttl=0)
    with pytest.raises(ValueError, match="wait"):
        drive.Semaphore(drive.client, "bad", 1, wait=-1)


async def test_redis_down_is_not_busy(drive: Drive, redis_factory: type[RedisServer]) -> None:
    from django_redislock.core.exceptions import RedisUnavailable
    from tests.servers import free_port

    server = redis_factory(port=free_port(), unix=False).start()
    async with drive.connect(server.url, socket_timeout=1, socket_connect_timeout=1) as client:
        sem = drive.Semaphore(client, "down", 1, wait=0)
        server.stop()
        with pytest.raises(RedisUnavailable):
            await drive(sem.acquire())


async def test_every_key_has_a_ttl(drive: Drive, r: redis.Redis) -> None:
    holder = drive.Semaphore(drive.client, "ttl", 1, ttl=5, wait=0)
    assert await drive(holder.acquire())
    waiter = drive.Semaphore(drive.client, "ttl", 1, wait=10)
    party = drive.spawn(lambda: drive(waiter.acquire()))
    await drive.until(lambda: r.llen(keys("ttl").queue) == 1)
    for key in r.scan_iter(match=b"redislock:S*"):
        assert r.pttl(key) > 0, key
    await drive(holder.release())
    await drive.join(party, timeout=10)
    assert len(holders(r, "ttl")) == 1
    for key in r.scan_iter(match=b"redislock:S*"):
        assert r.pttl(key) > 0, key


async def test_waiter_nobody_listens_for_is_skipped(drive: Drive, r: redis.Redis) -> None:
    k = keys("deaf")
    holder = drive.Semaphore(drive.client, "deaf", 1, ttl=60, wait=0)
    assert await drive(holder.acquire())
    # A waiter of a process that died: its channel has no subscriber.
    r.rpush(k.queue, "gone")
    r.hset(k.state, "w:gone", f"{int(r.time()[0]) * 1000 + 30_000}|predislock:N:dead")
    await drive(holder.release())
    assert holders(r, "deaf") == [] and r.llen(k.queue) == 0
    assert await drive(drive.Semaphore(drive.client, "deaf", 1, wait=0).acquire())
