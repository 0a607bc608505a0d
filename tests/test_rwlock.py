"""ReadWriteLock (sync core): many readers or one writer, FIFO with writer preference."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis

from django_redislock.core import KeySpace, ReadWriteLock
from django_redislock.core.drivers.rwlock import check_mode, clear_rw_lock
from django_redislock.core.exceptions import LockError, LockLost, LockNotAcquired, LockNotOwned
from tests.helpers_oracles import audit_keyspace, plant_sentinel, wait_until
from tests.servers import RedisServer

KS = KeySpace()


class RWOccupancy:
    """Who is inside, counted in shared memory apart from the lock under test.

    ``violations`` counts every entry that found a writer inside with anyone
    else; ``most_readers`` is the most readers seen inside at once. Works for
    threads and forked processes.
    """

    def __init__(self, ctx: Any = None) -> None:
        ctx = ctx or multiprocessing.get_context("fork")
        self._mutex = ctx.Lock()
        self.readers = ctx.Value("i", 0, lock=False)
        self.writers = ctx.Value("i", 0, lock=False)
        self.violations = ctx.Value("i", 0, lock=False)
        self.most_readers = ctx.Value("i", 0, lock=False)
        self.entries = ctx.Value("i", 0, lock=False)
        self.written = ctx.Value("q", 0, lock=False)

    def _check(self) -> None:
        if self.writers.value > 1 or (self.writers.value and self.readers.value):
            self.violations.value += 1

    @contextmanager
    def reading(self, linger: float = 0.0) -> Iterator[None]:
        with self._mutex:
            self.readers.value += 1
            self.entries.value += 1
            self.most_readers.value = max(self.most_readers.value, self.readers.value)
            self._check()
        try:
            # Stay a moment for another reader to join (bounded): readers that
            # can overlap must be seen to.
            end = time.monotonic() + linger
            while time.monotonic() < end and self.readers.value < 2:
                time.sleep(0.001)
            yield
        finally:
            with self._mutex:
                self.readers.value -= 1

    @contextmanager
    def writing(self) -> Iterator[None]:
        with self._mutex:
            self.writers.value += 1
            self.entries.value += 1
            self._check()
        try:
            # A read-pause-write counter: an overlapping writer loses an update.
            value = self.written.value
            time.sleep(0.0005)
            self.written.value = value + 1
            yield
        finally:
            with self._mutex:
                self.writers.value -= 1


def rw(client: Any, mode: str, name: str = "doc", **kw: Any) -> ReadWriteLock:
    kw.setdefault("ttl", 30)
    kw.setdefault("wait", 0)
    return ReadWriteLock(client, name, mode, **kw)  # type: ignore[arg-type]


def queued(client: redis.Redis, name: str = "doc") -> int:
    return int(client.llen(KS.rwlock(name).queue))


def test_layout_readers_share_a_writer_is_alone(r: redis.Redis) -> None:
    plant_sentinel(r)
    a, b = rw(r, "read", label="report"), rw(r, "read")
    w = rw(r, "write")
    assert a.acquire() and b.acquire()
    k = KS.rwlock("doc")
    assert k.lease.startswith(b"redislock:RW:{") and k.queue.startswith(b"redislock:RQ:{")
    assert k.state.startswith(b"redislock:RH:{") and k.tag in k.lease
    assert set(r.zrange(k.lease, 0, -1)) == {a.token.encode(), b.token.encode()}
    state = r.hgetall(k.state)
    assert state[b"n"] == b"doc" and state[b"m:" + a.token.encode()] == b"r"
    assert json.loads(state[b"o:" + a.token.encode()])["label"] == "report"
    assert a.fence is None and a.write_fence is None and a.owned()
    assert not w.acquire()
    a.release()
    assert not w.acquire()
    b.release()
    assert w.acquire()
    assert w.fence is not None and w.write_fence == w.fence and w.owned()
    assert r.hget(k.state, "x") == w.token.encode()
    assert not a.acquire() and not rw(r, "write").acquire()
    w.release()
    assert a.acquire()
    assert a.fence is None and a.write_fence == w.fence
    a.release()
    audit_keyspace(r)
    assert r.zcard(k.lease) == 0


def test_writer_fences_strictly_increase(r: redis.Redis) -> None:
    fences = []
    for _ in range(20):
        with rw(r, "write") as w:
            fences.append(w.fence)
        with rw(r, "read") as reader:
            assert reader.write_fence == fences[-1]
    assert fences == sorted(set(fences))


def test_invalid_mode_says_what_to_use(r: redis.Redis) -> None:
    for bad in ("READ", "shared", None, 1):
        with pytest.raises(ValueError, match="mode must be 'read' or 'write'"):
            ReadWriteLock(r, "doc", bad)  # type: ignore[arg-type]
    assert check_mode("read") == "read"
    assert ReadWriteLock(r, "doc").mode == "write"


def test_busy_context_manager_carries_retry_after(r: redis.Redis) -> None:
    holder = rw(r, "write", ttl=20)
    assert holder.acquire()
    with pytest.raises(LockNotAcquired) as info, rw(r, "read"):
        pass
    assert info.value.retry_after is not None and 0 < info.value.retry_after <= 20
    holder.release()


def test_readers_really_overlap(r: redis.Redis) -> None:
    # Each reader waits inside for the others: only if all are in at once
    # does the barrier open.
    barrier = threading.Barrier(4, timeout=10)
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            with rw(r, "read", wait=10):
                barrier.wait()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors


def test_waiting_writer_stops_new_readers(r: redis.Redis) -> None:
    first = rw(r, "read")
    assert first.acquire()
    writer_in = threading.Event()
    writer_may_leave = threading.Event()
    late_reader_in = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            with rw(r, "write", wait=20):
                writer_in.set()
                assert writer_may_leave.wait(20)
        except BaseException as exc:
            errors.append(exc)

    def late_reader() -> None:
        try:
            with rw(r, "read", wait=20):
                late_reader_in.set()
        except BaseException as exc:
            errors.append(exc)

    tw = threading.Thread(target=writer)
    tw.start()
    wait_until(lambda: queued(r) == 1)
    # A reader could share with `first`, but a writer waits: it must not pass.
    assert not rw(r, "read").acquire()
    tr = threading.Thread(target=late_reader)
    tr.start()
    wait_until(lambda: queued(r) == 2)
    assert not writer_in.is_set() and not late_reader_in.is_set()
    first.release()
    assert writer_in.wait(10)
    assert not late_reader_in.is_set()
    writer_may_leave.set()
    assert late_reader_in.wait(10)
    tw.join(10)
    tr.join(10)
    assert not errors


def test_readers_at_the_head_are_admitted_together(r: redis.Redis) -> None:
    w = rw(r, "write")
    assert w.acquire()
    barrier = threading.Barrier(3, timeout=10)
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            with rw(r, "read", wait=20):
                barrier.wait()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    wait_until(lambda: queued(r) == 3)
    w.release()
    for t in threads:
        t.join(20)
    assert not errors


def test_expired_holder_is_lost_and_frees_the_name(r: redis.Redis) -> None:
    lost: list[Any] = []
    reader = rw(r, "read", ttl=0.2, on_lost=lost.append)
    assert reader.acquire()
    w = rw(r, "write", wait=10)
    assert w.acquire()  # within the reader's TTL and the writer's wait
    with pytest.raises(LockLost):
        reader.release()
    assert lost == [reader]
    w.release()


def test_extend_renew_and_repeatable_release(r: redis.Redis) -> None:
    reader = rw(r, "read", ttl=5)
    assert reader.acquire()
    k = KS.rwlock("doc")
    reader.extend(60)
    assert r.zscore(k.lease, reader.token) > int(r.time()[0]) * 1000 + 50_000
    args = reader._release_args(reader.token)
    reader.release()
    from django_redislock.core.drivers.rwlock import RELEASE
    from django_redislock.core.engine import scripts

    # A retried release (its reply lost) still reports success.
    assert scripts.run(r, RELEASE, (k.lease, k.queue, k.state), args) == 1
    renewing = rw(r, "write", ttl=0.3, renew=True)
    assert renewing.acquire()
    wait_until(lambda: r.zscore(k.lease, renewing.token) is not None and renewing.held, 2)
    assert not rw(r, "read", wait=0.6).acquire()  # outlived its TTL by renewal
    assert renewing.held
    renewing.release()


def test_clear_and_only_the_owner_releases(r: redis.Redis) -> None:
    w = rw(r, "write")
    assert w.acquire()
    errors: list[BaseException] = []

    def other() -> None:
        try:
            w.release()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join(10)
    assert isinstance(errors[0], LockNotOwned)
    with pytest.raises(LockError):
        w.acquire()
    assert clear_rw_lock(r, KS, "doc") == 1
    assert not w.owned()
    with pytest.raises(LockLost):
        w.release()
    assert rw(r, "write").acquire()


def _thread_worker(client: Any, occ: RWOccupancy, rounds: int, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(rounds):
        if rng.random() < 0.3:
            with rw(client, "write", ttl=10, wait=30), occ.writing():
                pass
        else:
            with rw(client, "read", ttl=10, wait=30), occ.reading(linger=0.02):
                pass


def test_oracle_threads(r: redis.Redis) -> None:
    plant_sentinel(r)
    occ = RWOccupancy(multiprocessing.get_context("fork"))
    errors: list[BaseException] = []

    def run(seed: int) -> None:
        try:
            _thread_worker(r, occ, 15, seed)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert occ.entries.value == 120
    assert occ.violations.value == 0
    assert occ.most_readers.value > 1
    audit_keyspace(r)


def _process_worker(url: str, occ: RWOccupancy, start: float, seed: int) -> None:
    client = redis.Redis.from_url(url, socket_timeout=5)
    time.sleep(max(0.0, start - time.time()))
    try:
        _thread_worker(client, occ, 10, seed)
    except BaseException:
        os._exit(1)
    os._exit(0)


def test_oracle_processes(r: redis.Redis, redis_server: RedisServer) -> None:
    ctx = multiprocessing.get_context("fork")
    occ = RWOccupancy(ctx)
    start = time.time() + 0.5
    procs = [
        ctx.Process(target=_process_worker, args=(redis_server.url, occ, start, seed))
        for seed in range(6)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 6
    assert occ.entries.value == 60
    assert occ.violations.value == 0
    assert occ.most_readers.value > 1


def _hold_then_hang(url: str, mode: str, ready: Any) -> None:
    client = redis.Redis.from_url(url, socket_timeout=5)
    lock = ReadWriteLock(client, "doc", mode, ttl=1, wait=0)  # type: ignore[arg-type]
    if lock.acquire():
        ready.set()
    time.sleep(60)
    os._exit(0)


@pytest.mark.parametrize(("dead", "next_mode"), [("read", "write"), ("write", "read")])
def test_killed_holder_frees_within_its_lease(
    r: redis.Redis, redis_server: RedisServer, dead: str, next_mode: str
) -> None:
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    proc = ctx.Process(target=_hold_then_hang, args=(redis_server.url, dead, ready))
    proc.start()
    try:
        assert ready.wait(10)
        os.kill(proc.pid or 0, signal.SIGKILL)
        proc.join(10)
        # Queued behind the dead holder; its turn expires after its 1 s lease.
        assert rw(r, next_mode, wait=10).acquire()
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(10)


def test_a_woken_waiter_that_died_costs_the_next_only_the_grace(r: redis.Redis) -> None:
    from django_redislock.core.drivers.rwlock import ACQUIRE
    from django_redislock.core.engine import scripts

    holder = rw(r, "write", ttl=60, grace=0.3)
    assert holder.acquire()
    k = KS.rwlock("doc")
    # A waiter of a process that then died: queued, it never claims its turn.
    dead = "00000000deadbeef"
    args = (dead, 60_000, b"doc", "{}", 60_000, b"-", 300, 10_000, b"w")
    assert list(scripts.run(r, ACQUIRE, (k.lease, k.queue, k.state), args))[0] == 0
    got: list[tuple[bool, float]] = []

    def wait_in_line() -> None:
        started = time.monotonic()
        lock = rw(r, "read", wait=10)
        got.append((lock.acquire(), time.monotonic() - started))

    waiter = threading.Thread(target=wait_in_line)
    waiter.start()
    wait_until(lambda: queued(r) == 2)
    holder.release()  # the turn is reserved for the dead waiter for 0.3 s
    # Told of the reservation, the live waiter takes its end (not the 60 s
    # lease, nor its own 10 s deadline) as its timer: it gets in long before
    # its wait is over (a bound twenty times the grace, not a measurement).
    waiter.join(15)
    assert got[0][0] and got[0][1] < 6


@pytest.mark.parametrize("mode", ["read", "write"])
def test_a_turn_is_handed_between_handles_by_its_token(r: redis.Redis, mode: str) -> None:
    """``detach`` / ``adopt`` (unique tasks' hand-over) work on either turn."""
    first = ReadWriteLock(r, "handover", mode, ttl=10, wait=0)
    assert first.acquire()
    fence, write_fence = first.fence, first.write_fence
    token = first.detach(ttl=10)
    assert not first.held
    assert not ReadWriteLock(r, "handover", "write", ttl=10, wait=0).acquire()  # still taken
    second = ReadWriteLock(r, "handover", mode, ttl=10, wait=0)
    assert second.adopt(token, write_fence or 0)
    assert second.held and second.owned()
    assert (second.fence, second.write_fence) == (fence, write_fence)
    second.release()
    assert not second.adopt(token, write_fence or 0)  # released: nothing to adopt
    assert ReadWriteLock(r, "handover", "write", ttl=10, wait=0).acquire()
