"""ReadWriteLock and AsyncReadWriteLock: many readers or one writer, FIFO with writer preference.

A scenario that takes ``drive`` runs on both drivers (tests/drive.py).
What every kind of lock does alike is in tests/test_kinds.py.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import random
import signal
import time
from typing import Any

import pytest
import redis

from django_redislock.core import AsyncReadWriteLock, KeySpace, ReadWriteLock
from django_redislock.core.drivers.rwlock import check_mode
from django_redislock.core.exceptions import LockError, LockLost, LockNotOwned
from tests.drive import Drive, run_to_end
from tests.helpers_oracles import audit_keyspace, exit_codes_of_forks, plant_sentinel
from tests.servers import RedisServer

KS = KeySpace()


class RWOccupancy:
    """Who is inside, counted in shared memory apart from the lock under test.

    ``violations`` counts every entry that found a writer inside with anyone
    else; ``most_readers`` is the most readers seen inside at once. Works for
    threads, tasks and forked processes.
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

    def _enter(self, counter: Any) -> None:
        with self._mutex:
            counter.value += 1
            self.entries.value += 1
            self.most_readers.value = max(self.most_readers.value, self.readers.value)
            if self.writers.value > 1 or (self.writers.value and self.readers.value):
                self.violations.value += 1

    def _leave(self, counter: Any) -> None:
        with self._mutex:
            counter.value -= 1

    async def reading(self, drive: Drive, linger: float = 0.0) -> None:
        self._enter(self.readers)
        try:
            # Stay a moment for another reader to join (bounded): readers that
            # can overlap must be seen to.
            end = time.monotonic() + linger
            while time.monotonic() < end and self.readers.value < 2:
                await drive.sleep(0.001)
        finally:
            self._leave(self.readers)

    async def writing(self, drive: Drive) -> None:
        self._enter(self.writers)
        try:
            # A read-pause-write counter: an overlapping writer loses an update.
            value = self.written.value
            await drive.sleep(0.0005)
            self.written.value = value + 1
        finally:
            self._leave(self.writers)


def rw(drive: Drive, mode: str, name: str = "doc", client: Any = None, **kw: Any) -> Any:
    kw.setdefault("ttl", 30)
    kw.setdefault("wait", 0)
    return drive.ReadWriteLock(drive.client if client is None else client, name, mode, **kw)


def queued(client: redis.Redis, name: str = "doc") -> int:
    return int(client.llen(KS.rwlock(name).queue))


def left_behind(r: redis.Redis, name: str = "doc") -> tuple[int, int, list[bytes]]:
    """Holders, queue entries and per-token state fields still in Redis."""
    k = KS.rwlock(name)
    fields = [f for f in r.hgetall(k.state) if f[:2] in (b"o:", b"a:", b"m:", b"r:", b"w:", b"s:")]
    return r.zcard(k.lease), r.llen(k.queue), fields


async def test_layout_readers_share_a_writer_is_alone(drive: Drive, r: redis.Redis) -> None:
    plant_sentinel(r)
    a, b = rw(drive, "read", label="report"), rw(drive, "read")
    w = rw(drive, "write")
    assert await drive(a.acquire()) and await drive(b.acquire())
    k = KS.rwlock("doc")
    assert k.lease.startswith(b"redislock:RW:{") and k.queue.startswith(b"redislock:RQ:{")
    assert k.state.startswith(b"redislock:RH:{") and k.tag in k.lease
    assert set(r.zrange(k.lease, 0, -1)) == {a.token.encode(), b.token.encode()}
    state = r.hgetall(k.state)
    assert state[b"n"] == b"doc" and state[b"m:" + a.token.encode()] == b"r"
    assert json.loads(state[b"o:" + a.token.encode()])["label"] == "report"
    assert a.fence is None and a.write_fence is None and await drive(a.owned())
    assert not await drive(w.acquire())
    await drive(a.release())
    assert not await drive(w.acquire())
    await drive(b.release())
    async with drive.holding(w):
        assert w.fence is not None and w.write_fence == w.fence and await drive(w.owned())
        assert r.hget(k.state, "x") == w.token.encode()
        assert not await drive(a.acquire()) and not await drive(rw(drive, "write").acquire())
    async with drive.holding(a):
        assert a.fence is None and a.write_fence == w.fence
    audit_keyspace(r)
    assert left_behind(r) == (0, 0, [])


async def test_writer_fences_strictly_increase(drive: Drive) -> None:
    fences = []
    for _ in range(20):
        async with drive.holding(rw(drive, "write")) as w:
            fences.append(w.fence)
        async with drive.holding(rw(drive, "read")) as reader:
            assert reader.write_fence == fences[-1]
    assert fences == sorted(set(fences))


async def test_invalid_mode_says_what_to_use(drive: Drive) -> None:
    for bad in ("READ", "shared", None, 1):
        with pytest.raises(ValueError, match="mode must be 'read' or 'write'"):
            drive.ReadWriteLock(drive.client, "doc", bad)
    assert check_mode("read") == "read"
    assert drive.ReadWriteLock(drive.client, "doc").mode == "write"


async def _all_inside_together(drive: Drive, count: int, wait_for: Any = None) -> None:
    # Each reader waits inside for the others: only if all are in at once
    # do they all leave.
    inside = [drive.event() for _ in range(count)]

    async def reader(i: int) -> None:
        async with drive.holding(rw(drive, "read", wait=20)):
            inside[i].set()
            for event in inside:
                await event.wait(10)

    parties = [drive.spawn(lambda i=i: reader(i)) for i in range(count)]
    if wait_for is not None:
        await wait_for()
    await drive.join(*parties)


async def test_readers_really_overlap(drive: Drive) -> None:
    await _all_inside_together(drive, 4)


async def test_readers_at_the_head_are_admitted_together(drive: Drive, r: redis.Redis) -> None:
    w = rw(drive, "write")
    assert await drive(w.acquire())

    async def then_release() -> None:
        await drive.until(lambda: queued(r) == 3)
        await drive(w.release())

    await _all_inside_together(drive, 3, then_release)


async def test_waiting_writer_stops_new_readers(drive: Drive, r: redis.Redis) -> None:
    first = rw(drive, "read")
    assert await drive(first.acquire())
    writer_in = drive.event()
    writer_may_leave = drive.event()
    late_reader_in = drive.event()

    async def writer() -> None:
        async with drive.holding(rw(drive, "write", wait=20)):
            writer_in.set()
            await writer_may_leave.wait(20)

    async def late_reader() -> None:
        async with drive.holding(rw(drive, "read", wait=20)):
            late_reader_in.set()

    tw = drive.spawn(writer)
    await drive.until(lambda: queued(r) == 1)
    # A reader could share with `first`, but a writer waits: it must not pass.
    assert not await drive(rw(drive, "read").acquire())
    tr = drive.spawn(late_reader)
    await drive.until(lambda: queued(r) == 2)
    assert not writer_in.is_set() and not late_reader_in.is_set()
    await drive(first.release())
    await writer_in.wait(10)
    assert not late_reader_in.is_set()
    writer_may_leave.set()
    await late_reader_in.wait(10)
    await drive.join(tw, tr, timeout=10)


async def test_expired_holder_is_lost_and_frees_the_name(drive: Drive) -> None:
    lost: list[Any] = []
    reader = rw(drive, "read", ttl=0.2, on_lost=lost.append)
    assert await drive(reader.acquire())
    w = rw(drive, "write", wait=10)
    assert await drive(w.acquire())  # within the reader's TTL and the writer's wait
    with pytest.raises(LockLost):
        await drive(reader.release())
    assert lost == [reader]
    await drive(w.release())


async def test_extend_renew_and_repeatable_release(drive: Drive, r: redis.Redis) -> None:
    reader = rw(drive, "read", ttl=5)
    assert await drive(reader.acquire())
    k = KS.rwlock("doc")
    await drive(reader.extend(60))
    assert r.zscore(k.lease, reader.token) > int(r.time()[0]) * 1000 + 50_000
    args = reader._release_args(reader.token)
    await drive(reader.release())
    from django_redislock.core.drivers.rwlock import RELEASE
    from django_redislock.core.io import calls

    # A retried release (its reply lost) still reports success.
    assert calls.run(r, RELEASE, (k.lease, k.queue, k.state), args) == 1
    # A TTL long enough that a renewal delayed by a loaded host (it runs every
    # third of it) still comes in time; the reader waits longer than the TTL.
    # 1.5 s leaves a renewal 1 s to come in, as in tests/test_renewal.py.
    renewing = rw(drive, "write", ttl=1.5, renew=True)
    assert await drive(renewing.acquire())
    await drive.until(lambda: r.zscore(k.lease, renewing.token) is not None and renewing.held, 2)
    assert not await drive(rw(drive, "read", wait=2.25).acquire())  # outlived its TTL by renewal
    assert renewing.held
    await drive(renewing.release())


async def test_clear_and_only_the_owner_releases(drive: Drive) -> None:
    w = rw(drive, "write")
    assert await drive(w.acquire())
    with pytest.raises(LockNotOwned):
        await drive.join(drive.spawn(lambda: drive(w.release())), timeout=10)
    with pytest.raises(LockError):
        await drive(w.acquire())
    assert await drive(drive.clear_rw_lock(drive.client, KS, "doc")) == 1
    assert not await drive(w.owned())
    with pytest.raises(LockLost):
        await drive(w.extend())
    with pytest.raises(LockLost):
        await drive(w.release())
    assert await drive(rw(drive, "write").acquire())


async def contend(
    drive: Drive, client: Any, occ: RWOccupancy, rounds: int, seed: int, name: str = "doc"
) -> None:
    """``rounds`` turns on ``name``, three in ten of them as a writer, counted by ``occ``."""
    rng = random.Random(seed)
    for _ in range(rounds):
        if rng.random() < 0.3:
            async with drive.holding(rw(drive, "write", name, client, ttl=10, wait=30)):
                await occ.writing(drive)
        else:
            async with drive.holding(rw(drive, "read", name, client, ttl=10, wait=30)):
                await occ.reading(drive, linger=0.02)


async def test_oracle_threads_or_tasks(drive: Drive, r: redis.Redis) -> None:
    plant_sentinel(r)
    occ = RWOccupancy(multiprocessing.get_context("fork"))
    parties = [
        drive.spawn(lambda seed=seed: contend(drive, drive.client, occ, 15, seed))
        for seed in range(20)
    ]
    await drive.join(*parties, timeout=120)
    assert occ.entries.value == 300
    assert occ.violations.value == 0
    assert occ.most_readers.value > 1
    audit_keyspace(r)


def _process_worker(url: str, occ: RWOccupancy, start: float, seed: int) -> None:
    client = redis.Redis.from_url(url, socket_timeout=5)
    time.sleep(max(0.0, start - time.time()))
    try:
        run_to_end(contend(Drive("sync", client, client), client, occ, 10, seed))
    except BaseException:
        os._exit(1)
    os._exit(0)


def test_oracle_processes(r: redis.Redis, redis_server: RedisServer) -> None:
    ctx = multiprocessing.get_context("fork")
    occ = RWOccupancy(ctx)
    start = time.time() + 0.5
    argses = [(redis_server.url, occ, start, seed) for seed in range(6)]
    assert exit_codes_of_forks(_process_worker, argses, 120) == [0] * 6
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
async def test_killed_holder_frees_within_its_lease(
    drive: Drive, redis_server: RedisServer, dead: str, next_mode: str
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
        assert await drive(rw(drive, next_mode, wait=10).acquire())
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(10)


async def test_a_woken_waiter_that_died_costs_the_next_only_the_grace(
    drive: Drive, r: redis.Redis
) -> None:
    from django_redislock.core.drivers.rwlock import ACQUIRE
    from django_redislock.core.io import calls

    holder = rw(drive, "write", ttl=60, grace=0.3)
    assert await drive(holder.acquire())
    k = KS.rwlock("doc")
    # A waiter of a process that then died: queued, it never claims its turn.
    dead = "00000000deadbeef"
    args = (dead, 60_000, b"doc", "{}", 60_000, b"-", 300, 10_000, b"w")
    assert list(calls.run(r, ACQUIRE, (k.lease, k.queue, k.state), args))[0] == 0

    async def wait_in_line() -> tuple[bool, float]:
        started = time.monotonic()
        lock = rw(drive, "read", wait=10)
        return await drive(lock.acquire()), time.monotonic() - started

    waiter = drive.spawn(wait_in_line)
    await drive.until(lambda: queued(r) == 2)
    await drive(holder.release())  # the turn is reserved for the dead waiter for 0.3 s
    # Told of the reservation, the live waiter takes its end (not the 60 s
    # lease, nor its own 10 s deadline) as its timer: it gets in long before
    # its wait is over (a bound twenty times the grace, not a measurement).
    [(got, waited)] = await drive.join(waiter, timeout=15)
    assert got and waited < 6


@pytest.mark.parametrize("mode", ["read", "write"])
async def test_a_turn_is_handed_between_handles_by_its_token(drive: Drive, mode: str) -> None:
    """``detach`` / ``adopt`` (unique tasks' hand-over) work on either turn."""
    first = rw(drive, mode, "handover", ttl=10)
    assert await drive(first.acquire())
    fence, write_fence = first.fence, first.write_fence
    token = await drive(first.detach(ttl=10))
    assert not first.held
    assert not await drive(rw(drive, "write", "handover", ttl=10).acquire())  # still taken
    second = rw(drive, mode, "handover", ttl=10)
    assert await drive(second.adopt(token, write_fence or 0))
    assert second.held and await drive(second.owned())
    assert (second.fence, second.write_fence) == (fence, write_fence)
    await drive(second.release())
    assert not await drive(second.adopt(token, write_fence or 0))  # released: nothing to adopt
    assert await drive(rw(drive, "write", "handover", ttl=10).acquire())


# -- what only tasks can do: be cancelled ------------------------------------------------


async def test_cancelled_waiting_writer_lets_readers_behind_it_in(
    adrive: Drive, r: redis.Redis
) -> None:
    holder = rw(adrive, "read", ttl=60)
    assert await holder.acquire()
    writer = asyncio.create_task(rw(adrive, "write", wait=30).acquire())
    await adrive.until(lambda: queued(r) == 1)
    reader_in = asyncio.Event()

    async def reader() -> None:
        async with rw(adrive, "read", wait=30):
            reader_in.set()

    tr = asyncio.create_task(reader())
    await adrive.until(lambda: queued(r) == 2)
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
    adrive: Drive, r: redis.Redis, mode: str
) -> None:
    other = "write" if mode == "read" else "read"
    for steps in range(0, 40, 2):
        for contended in (False, True):
            blocker = rw(adrive, other, ttl=60)
            if contended:
                assert await blocker.acquire()
            lock = rw(adrive, mode, wait=30)

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
            assert await adrive.until(lambda: left_behind(r) == (0, 0, [])), (steps, contended)
