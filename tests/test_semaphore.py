"""Semaphore (sync core): counting, expiry on the server clock, fair admission."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time

import pytest
import redis

from django_redislock.core.drivers.semaphore import Semaphore, clear_semaphore
from django_redislock.core.engine.keys import KeySpace
from django_redislock.core.exceptions import LockError, LockLost, LockNotAcquired, LockNotOwned
from tests.servers import RedisServer

KS = KeySpace()


def keys(name: str):  # noqa: ANN201
    return KS.semaphore(name)


def holders(r: redis.Redis, name: str) -> list[bytes]:
    return list(r.zrange(keys(name).lease, 0, -1))


def wait_until(predicate, timeout: float = 10.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


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


def test_acquire_release_and_key_layout(r: redis.Redis) -> None:
    sem = Semaphore(r, "reports", 2, ttl=30, wait=0, label="nightly")
    assert sem.acquire()
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
    assert sem.held and sem.owned() and sem.fence is None
    sem.release()
    assert holders(r, "reports") == []
    assert not any(f.startswith((b"o:", b"a:", b"s:")) for f in r.hgetall(k.state))
    assert not sem.held


def test_limit_is_enforced(r: redis.Redis) -> None:
    sems = [Semaphore(r, "s", 3, wait=0) for _ in range(4)]
    assert [s.acquire() for s in sems] == [True, True, True, False]
    assert sems[3].retry_after is not None and sems[3].retry_after > 0
    sems[0].release()
    assert sems[3].acquire()
    assert len(holders(r, "s")) == 3


def test_one_round_trip_each_when_uncontended(r: redis.Redis) -> None:
    warm = Semaphore(r, "warm", 1, wait=5)
    assert warm.acquire()
    warm.release()  # scripts are cached now
    sem = Semaphore(r, "rt", 1, wait=5)
    r.config_resetstat()
    assert sem.acquire()
    stats = r.info("commandstats")
    # The INFO call itself is not counted until it finishes.
    assert stats["cmdstat_evalsha"]["calls"] == 1
    assert "cmdstat_eval" not in stats
    r.config_resetstat()
    sem.release()
    stats = r.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == 1


def test_crashed_holder_permit_expires_on_server_clock(r: redis.Redis) -> None:
    crashed = Semaphore(r, "c", 1, ttl=0.3, wait=0)
    assert crashed.acquire()
    other = Semaphore(r, "c", 1, wait=10)
    assert other.acquire(wait=0) is False
    # The waiter's fallback timer is the permit's expiry: no release needed.
    assert other.acquire()
    assert holders(r, "c") == [other.token.encode()]
    with pytest.raises(LockLost):
        crashed.release()
    other.release()


def test_release_wakes_waiter_by_notification(r: redis.Redis) -> None:
    # The holder's permit lasts 60 s and the waiter waits 10 s: only the
    # wake-up published at release can get the waiter in.
    holder = Semaphore(r, "n", 1, ttl=60, wait=0)
    assert holder.acquire()
    waiter = Semaphore(r, "n", 1, wait=10)
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(waiter.acquire()))
    t.start()
    assert wait_until(lambda: r.llen(keys("n").queue) == 1)
    holder.release()
    t.join(15)
    assert result == [True]
    assert holders(r, "n") == [waiter.token.encode()]


def test_waiters_are_admitted_in_arrival_order(r: redis.Redis) -> None:
    holder = Semaphore(r, "fifo", 1, ttl=60, wait=0)
    assert holder.acquire()
    order: list[int] = []
    threads = []
    for i in range(5):
        sem = Semaphore(r, "fifo", 1, wait=20)

        def run(sem: Semaphore = sem, i: int = i) -> None:
            assert sem.acquire()
            order.append(i)
            sem.release()

        t = threading.Thread(target=run)
        t.start()
        threads.append(t)
        # Each waiter is in the queue before the next one arrives.
        assert wait_until(lambda i=i: r.llen(keys("fifo").queue) == i + 1)
    holder.release()
    for t in threads:
        t.join(20)
    assert order == [0, 1, 2, 3, 4]


def test_several_waiters_woken_when_several_permits_free(r: redis.Redis) -> None:
    held = [Semaphore(r, "multi", 3, ttl=60, wait=0) for _ in range(3)]
    assert all(s.acquire() for s in held)
    got = threading.Barrier(3, timeout=15)
    done = threading.Event()
    waiters = [Semaphore(r, "multi", 3, wait=15) for _ in range(2)]

    def run(sem: Semaphore) -> None:
        assert sem.acquire()
        got.wait()  # both inside together
        done.wait(15)
        sem.release()

    threads = [threading.Thread(target=run, args=(s,)) for s in waiters]
    for t in threads:
        t.start()
    assert wait_until(lambda: r.llen(keys("multi").queue) == 2)
    held[0].release()
    held[1].release()
    got.wait()
    assert len(holders(r, "multi")) == 3
    done.set()
    for t in threads:
        t.join(15)
    held[2].release()


def test_newcomer_cannot_barge_past_queue(r: redis.Redis) -> None:
    k = keys("barge")
    holder = Semaphore(r, "barge", 1, ttl=60, wait=0)
    assert holder.acquire()
    # A queued waiter with no channel: its wake-up goes nowhere, so the permit
    # freed below stays reserved for it for the grace period.
    r.rpush(k.queue, "w1")
    r.hset(k.state, "w:w1", f"{int(r.time()[0]) * 1000 + 30_000}|-")
    holder.release()
    assert holders(r, "barge") == [b"w1"] and r.hget(k.state, "r:w1") == b"1"
    newcomer = Semaphore(r, "barge", 1, wait=0)
    assert newcomer.acquire() is False
    # Once the reservation runs out unclaimed, the permit is free again.
    late = Semaphore(r, "barge", 1, wait=10)
    assert late.acquire()
    assert holders(r, "barge") == [late.token.encode()]


def test_threads_never_exceed_limit(r: redis.Redis) -> None:
    oracle = Oracle()
    limit, workers, rounds = 3, 12, 5
    start = threading.Barrier(workers, timeout=15)
    errors: list[BaseException] = []
    client = redis.Redis(
        connection_pool=redis.BlockingConnectionPool.from_url(
            f"unix://{r.connection_pool.connection_kwargs['path']}",
            max_connections=6,
            timeout=20,
            socket_timeout=5,
        )
    )

    def run() -> None:
        try:
            sem = Semaphore(client, "threads", limit, ttl=30, wait=30)
            start.wait()
            for _ in range(rounds):
                with sem:
                    oracle.enter()
                    time.sleep(0.005)
                    oracle.leave()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    client.close()
    assert errors == []
    assert 1 <= oracle.max <= limit
    assert holders(r, "threads") == []


def test_hundreds_of_waiters_share_few_connections(r: redis.Redis) -> None:
    # 150 waiting threads, 4 pooled connections: waiters must not sit on a
    # connection, or the holder could never release.
    path = r.connection_pool.connection_kwargs["path"]
    client = redis.Redis(
        connection_pool=redis.BlockingConnectionPool.from_url(
            f"unix://{path}", max_connections=4, timeout=30, socket_timeout=5
        )
    )
    holder = Semaphore(client, "many", 2, ttl=60, wait=0)
    assert holder.acquire()
    oracle = Oracle()
    finished: list[bool] = []
    lock = threading.Lock()

    def run() -> None:
        sem = Semaphore(client, "many", 2, ttl=30, wait=60)
        ok = sem.acquire()
        if ok:
            oracle.enter()
            oracle.leave()
            sem.release()
        with lock:
            finished.append(ok)

    threads = [threading.Thread(target=run) for _ in range(150)]
    for t in threads:
        t.start()
    assert wait_until(lambda: r.llen(keys("many").queue) + len(finished) >= 140, 30)
    holder.release()
    for t in threads:
        t.join(60)
    client.close()
    assert len(finished) == 150 and all(finished)
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


def test_lower_limit_admits_nobody_until_holders_drop_below_it(r: redis.Redis) -> None:
    old = [Semaphore(r, "shrink", 3, ttl=60, wait=0) for _ in range(3)]
    assert all(s.acquire() for s in old)
    new = Semaphore(r, "shrink", 1, wait=0)
    assert new.acquire() is False
    assert r.hget(keys("shrink").state, "l") == b"1"
    old[0].release()
    assert new.acquire() is False  # 2 holders, limit 1
    old[1].release()
    assert new.acquire() is False  # 1 holder, limit 1
    old[2].release()
    assert new.acquire() is True
    assert len(holders(r, "shrink")) == 1


def test_lowered_limit_does_not_wake_waiters_into_overfill(r: redis.Redis) -> None:
    old = [Semaphore(r, "shrink2", 3, ttl=60, wait=0) for _ in range(3)]
    assert all(s.acquire() for s in old)
    waiter = Semaphore(r, "shrink2", 1, wait=15)
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(waiter.acquire()))
    t.start()
    assert wait_until(lambda: r.llen(keys("shrink2").queue) == 1)
    old[0].release()
    old[1].release()
    # Still one holder, limit 1: nobody admitted.
    assert r.llen(keys("shrink2").queue) == 1 and result == []
    assert len(holders(r, "shrink2")) == 1
    old[2].release()
    t.join(15)
    assert result == [True]
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
    from django_redislock.core.engine import scripts

    granted, _ = scripts.run(
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
    granted, _ = scripts.run(
        r,
        ACQUIRE,
        (k.lease, k.queue, k.state),
        ("w2", 1000, b"claim", "{}", 5000, b"-", 2000, 60000, 1),
    )
    # Limit 1 with w1 holding: claiming would make 2. Given back, first in line.
    assert granted == 0
    assert holders(r, "claim") == [b"w1"]
    assert r.lindex(k.queue, 0) == b"w2"


def test_refresh_extends_only_own_live_permit(r: redis.Redis) -> None:
    sem = Semaphore(r, "ref", 1, ttl=5, wait=0)
    assert sem.acquire()
    before = r.zscore(keys("ref").lease, sem.token)
    sem.refresh(ttl=50)
    assert r.zscore(keys("ref").lease, sem.token) > before + 40_000
    assert sem.remaining > 40
    clear_semaphore(r, KS, "ref")
    with pytest.raises(LockLost):
        sem.refresh()
    with pytest.raises(LockLost):
        sem.release()


def test_only_acquiring_thread_releases(r: redis.Redis) -> None:
    sem = Semaphore(r, "own", 1, wait=0)
    with pytest.raises(LockNotOwned):
        sem.release()
    assert sem.acquire()
    errors: list[BaseException] = []

    def other() -> None:
        try:
            sem.release()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join(5)
    assert len(errors) == 1 and isinstance(errors[0], LockNotOwned)
    with pytest.raises(LockError):
        sem.acquire()  # already held by this thread
    sem.release()


def test_context_manager_raises_when_busy(r: redis.Redis) -> None:
    first = Semaphore(r, "ctx", 1, ttl=20, wait=0)
    with first:
        with pytest.raises(LockNotAcquired) as info, Semaphore(r, "ctx", 1, wait=0):
            pass  # pragma: no cover
        assert info.value.retry_after is not None and 0 < info.value.retry_after <= 20
    assert holders(r, "ctx") == []


def test_clear_one_and_all_wakes_waiters(r: redis.Redis) -> None:
    sems = [Semaphore(r, "clr", 2, ttl=60, wait=0) for _ in range(2)]
    assert all(s.acquire() for s in sems)
    waiter = Semaphore(r, "clr", 2, wait=10)
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(waiter.acquire()))
    t.start()
    assert wait_until(lambda: r.llen(keys("clr").queue) == 1)
    assert clear_semaphore(r, KS, "clr", sems[0].token) == 1
    t.join(10)
    assert result == [True]
    state = r.hgetall(keys("clr").state)
    assert b"o:" + sems[0].token.encode() not in state
    assert clear_semaphore(r, KS, "clr", "no-such-token") == 0
    assert clear_semaphore(r, KS, "clr") == 2
    assert holders(r, "clr") == []
    assert not any(f.startswith((b"o:", b"a:", b"r:", b"s:")) for f in r.hgetall(keys("clr").state))
    with pytest.raises(LockLost):
        sems[1].release()


def test_waiter_that_gives_up_leaves_the_queue(r: redis.Redis) -> None:
    holder = Semaphore(r, "giveup", 1, ttl=60, wait=0)
    assert holder.acquire()
    waiter = Semaphore(r, "giveup", 1, wait=0.3)
    assert waiter.acquire() is False
    assert r.llen(keys("giveup").queue) == 0
    assert not any(f.startswith(b"w:") for f in r.hgetall(keys("giveup").state))
    holder.release()


@pytest.mark.parametrize(
    ("limit", "error"),
    [(0, ValueError), (-1, ValueError), ("3", TypeError), (True, TypeError), (2.5, TypeError)],
)
def test_bad_limit(r: redis.Redis, limit: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="limit"):
        Semaphore(r, "bad", limit)  # type: ignore[arg-type]


def test_bad_ttl_and_wait(r: redis.Redis) -> None:
    with pytest.raises(ValueError, match="ttl"):
        Semaphore(r, "bad", 1, ttl=0)
    with pytest.raises(ValueError, match="wait"):
        Semaphore(r, "bad", 1, wait=-1)


def test_redis_down_is_not_busy(redis_factory: type[RedisServer]) -> None:
    from django_redislock.core.exceptions import RedisUnavailable
    from tests.servers import free_port

    server = redis_factory(port=free_port(), unix=False).start()
    client = server.client(socket_timeout=1, socket_connect_timeout=1)
    sem = Semaphore(client, "down", 1, wait=0)
    server.stop()
    with pytest.raises(RedisUnavailable):
        sem.acquire()
    client.close()


def test_every_key_has_a_ttl(r: redis.Redis) -> None:
    holder = Semaphore(r, "ttl", 1, ttl=5, wait=0)
    assert holder.acquire()
    waiter = Semaphore(r, "ttl", 1, wait=10)
    t = threading.Thread(target=waiter.acquire)
    t.start()
    assert wait_until(lambda: r.llen(keys("ttl").queue) == 1)
    for key in r.scan_iter(match=b"redislock:S*"):
        assert r.pttl(key) > 0, key
    holder.release()
    t.join(10)
    assert len(holders(r, "ttl")) == 1
    for key in r.scan_iter(match=b"redislock:S*"):
        assert r.pttl(key) > 0, key


def test_waiter_nobody_listens_for_is_skipped(r: redis.Redis) -> None:
    k = keys("deaf")
    holder = Semaphore(r, "deaf", 1, ttl=60, wait=0)
    assert holder.acquire()
    # A waiter of a process that died: its channel has no subscriber.
    r.rpush(k.queue, "gone")
    r.hset(k.state, "w:gone", f"{int(r.time()[0]) * 1000 + 30_000}|predislock:N:dead")
    holder.release()
    assert holders(r, "deaf") == [] and r.llen(k.queue) == 0
    assert Semaphore(r, "deaf", 1, wait=0).acquire()


def test_replicas_unacknowledged_permit_is_given_back(r: redis.Redis) -> None:
    from django_redislock.core.exceptions import ReplicationTimeout

    # The test server has no replica: nobody acknowledges the permit.
    sem = Semaphore(r, "unreplicated", 1, ttl=30, wait=0, replicas=1, replicas_timeout=0.05)
    with pytest.raises(ReplicationTimeout):
        sem.acquire()
    assert not sem.held and holders(r, "unreplicated") == []
    assert Semaphore(r, "unreplicated", 1, wait=0).acquire()
