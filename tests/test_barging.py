"""The barging order, ``Lock(..., fair=False)``, against a real Redis.

A release frees the lease and wakes the oldest waiter to look again; whoever
asks first takes it, until the head of the queue has seen ``BARGE_LIMIT``
others served, when the lease is handed to it as in the default order.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio

from django_redislock.core import AsyncLock, Lock, ReplicationTimeout
from django_redislock.core.engine import scripts
from django_redislock.core.engine.protocol import BARGE_DEFER, BARGE_LIMIT, Acquisition, Move
from django_redislock.core.io.wakeup import NO_CHANNEL, Handed
from tests.helpers_oracles import Occupancy, audit_keyspace, plant_sentinel, wait_until

# Every wait in these tests is bounded by this; none is expected to come near it.
BOUND = 20.0


def _queue_fake_waiter(r: redis.Redis, lock: Lock, token: str, address: bytes) -> None:
    """Queue ``token`` behind the holder of ``lock``'s name, as a waiter in a
    process that never retries by itself: only a handed lease reaches it."""
    waiter = Lock(r, lock.name, ttl=30, wait=0, fair=False)
    waiter._round = 1
    args = waiter._args_acquire(token, 30_000, "fake", 10_000, address)
    assert scripts.run(r, scripts.ACQUIRE_BARGING, waiter._key_tuple, args) > 0  # busy, queued
    assert r.lrange(lock.keys.queue, 0, -1) == [token.encode()]


# -- the option ---------------------------------------------------------------------------
def test_first_come_first_served_stays_the_default(r: redis.Redis) -> None:
    fifo = Lock(r, "order", ttl=5, wait=0)
    assert fifo.fair is True
    assert fifo._acquire_script is scripts.ACQUIRE
    # The default order sends exactly the arguments acquire.lua documents.
    assert len(fifo._args_acquire("t" * 16, 1000, "w", 0, NO_CHANNEL)) == 8
    barging = Lock(r, "order", ttl=5, wait=0, fair=False)
    assert barging._acquire_script is scripts.ACQUIRE_BARGING
    assert len(barging._args_acquire("t" * 16, 1000, "w", 0, NO_CHANNEL)) == 9
    assert AsyncLock(r, "order", fair=False)._acquire_script is scripts.ACQUIRE_BARGING
    # One acquire script for both orders, told apart by the limit (ARGV[9]);
    # the release of the first-come order knows nothing of barging.
    assert scripts.ACQUIRE_BARGING is scripts.ACQUIRE
    assert b"WAKE_AGAIN" not in scripts.RELEASE.source
    assert scripts.RELEASE_BARGING.sha != scripts.RELEASE.sha


@pytest.mark.parametrize("bad", ["fifo", "barging", 0, 1, None])
def test_fair_must_be_a_bool(r: redis.Redis, bad: Any) -> None:
    with pytest.raises(TypeError, match=r"fair must be True .* or False"):
        Lock(r, "x", fair=bad)
    with pytest.raises(TypeError, match=r"fair must be True .* or False"):
        AsyncLock(r, "x", fair=bad)


def test_uncontended_acquire_release_and_fences(r: redis.Redis) -> None:
    plant_sentinel(r)
    lock = Lock(r, "plain", ttl=10, wait=0, fair=False)
    fences = []
    for _ in range(3):
        with lock:
            assert lock.owned()
            fences.append(lock.fence)
            lease = r.hgetall(lock.keys.lease)
            assert lease[b"t"] == lock.token.encode()  # type: ignore[union-attr]
            assert b"pid" in lease[b"o"]  # owner metadata, as in the default order
    assert fences == sorted(set(fences))
    assert not r.exists(lock.keys.lease)
    audit_keyspace(r)


# -- barging, and its bound ---------------------------------------------------------------
def test_a_releaser_takes_the_lock_back_then_hands_it_over_at_the_bound(
    r: redis.Redis,
) -> None:
    plant_sentinel(r)
    holder = Lock(r, "bound", ttl=30, wait=0, fair=False)
    assert holder.acquire()
    waiter_token = "0123456789abcdef"
    # Without a channel: the waiter is never woken, so every release is a
    # chance for the holder to barge, and only the bound serves the waiter.
    _queue_fake_waiter(r, holder, waiter_token, NO_CHANNEL)
    fences = [holder.fence]
    barges = 0
    for _ in range(BARGE_LIMIT + 2):
        holder.release()
        if not holder.acquire(wait=0):
            break
        barges += 1
        fences.append(holder.fence)
    assert barges == BARGE_LIMIT
    assert fences == sorted(set(fences))  # every grant a new, larger fence
    # The bound was reached: the lease went to the waiter, as a handoff.
    assert r.hget(holder.keys.lease, "t") == waiter_token.encode()
    assert int(r.hget(holder.keys.lease, "f")) > fences[-1]  # type: ignore[arg-type]
    assert not r.hexists(holder.keys.state, "b")  # the count starts again
    assert r.llen(holder.keys.queue) == 0
    args = (waiter_token, BARGE_LIMIT)
    assert scripts.run(r, scripts.RELEASE_BARGING, holder._key_tuple, args) == 1
    # The queue is empty again: the next acquire is the uncontended one.
    assert holder.acquire(wait=0)
    holder.release()
    audit_keyspace(r)


def test_a_waiter_is_served_within_the_bound_while_the_holder_loops(r: redis.Redis) -> None:
    holder = Lock(r, "loop", ttl=30, wait=0, fair=False)
    assert holder.acquire()
    waiter = Lock(r, "loop", ttl=30, wait=BOUND, fair=False)
    got = threading.Event()
    done = threading.Event()
    result: dict[str, Any] = {}

    def wait_for_it() -> None:
        try:
            result["ok"] = waiter.acquire()
            result["fence"] = waiter.fence
            got.set()
            done.wait(BOUND)
            if result["ok"]:
                waiter.release()
        except BaseException as exc:
            result["error"] = exc
            got.set()

    thread = threading.Thread(target=wait_for_it)
    thread.start()
    wait_until(lambda: r.llen(holder.keys.queue) == 1, BOUND)
    barges = 0
    last_fence = holder.fence
    try:
        # The holder takes the lock straight back after each release, as
        # fast as it can: the waiter must still get it, within the bound.
        for _ in range(BARGE_LIMIT + 1):
            holder.release()
            if not holder.acquire(wait=0):
                break
            barges += 1
            last_fence = holder.fence
        assert barges <= BARGE_LIMIT
        assert got.wait(BOUND)
        assert "error" not in result, result.get("error")
        assert result["ok"] is True
        assert result["fence"] > last_fence
        assert not holder.acquire(wait=0)  # the waiter holds it now
    finally:
        done.set()
        thread.join(BOUND)
        if holder.token is not None:
            holder.release()
    assert not thread.is_alive()
    assert not r.exists(holder.keys.lease)


def test_a_release_wakes_the_head_when_nobody_barges(r: redis.Redis) -> None:
    holder = Lock(r, "wake", ttl=30, wait=0, fair=False)
    assert holder.acquire()
    waiter = Lock(r, "wake", ttl=30, wait=BOUND, fair=False)
    out: dict[str, Any] = {}

    def wait_for_it() -> None:
        out["ok"] = waiter.acquire()
        out["at"] = time.monotonic()
        if out["ok"]:
            waiter.release()

    thread = threading.Thread(target=wait_for_it)
    thread.start()
    wait_until(lambda: r.llen(holder.keys.queue) == 1, BOUND)
    released_at = time.monotonic()
    holder.release()
    thread.join(BOUND)
    assert out["ok"] is True
    # The holder's lease had 30 s left: only the wake-up explains this.
    assert out["at"] - released_at < 5
    assert r.llen(holder.keys.queue) == 0
    assert not r.hexists(holder.keys.state, "q")


def test_a_woken_waiter_is_not_woken_again_before_it_looks(r: redis.Redis) -> None:
    holder = Lock(r, "once", ttl=30, wait=0, fair=False)
    assert holder.acquire()
    channel = "redislock-test:once"
    pubsub = r.pubsub()
    pubsub.subscribe(channel)
    assert pubsub.get_message(timeout=BOUND)["type"] == "subscribe"  # type: ignore[index]
    token = "0123456789abcdef"
    _queue_fake_waiter(r, holder, token, b"p" + channel.encode())
    holder.release()  # wakes the waiter
    woken = r.hget(holder.keys.state, "w")
    assert woken is not None and woken.startswith(token.encode() + b"|1|")
    # The scripts wake a waiter again once WAKE_AGAIN (20 ms) has passed
    # without it looking: on a loaded host the three rounds below can take
    # longer. Dating the wake-up a minute ahead keeps the test on the rule
    # (no second wake-up while the first is fresh), not on the host's speed.
    seconds, micros = r.time()
    ahead = seconds * 1000 + micros // 1000 + 60_000
    r.hset(holder.keys.state, "w", woken.rsplit(b"|", 1)[0] + b"|" + str(ahead).encode())
    for _ in range(3):  # the holder barges, releases: the waiter is not woken again
        assert holder.acquire(wait=0)
        holder.release()
    # The waiter looks again (its attempt 2) and finds the lock taken: queued
    # again, it is woken by the next release.
    assert holder.acquire(wait=0)
    waiter = Lock(r, "once", ttl=30, wait=0, fair=False)
    waiter._round = 2
    again = waiter._args_acquire(token, 30_000, "fake", 10_000, b"p" + channel.encode())
    assert scripts.run(r, scripts.ACQUIRE_BARGING, waiter._key_tuple, again) > 0
    holder.release()
    assert r.hget(holder.keys.state, "w").startswith(token.encode() + b"|2|")  # type: ignore[union-attr]
    r.publish(channel, "end")
    heard = []
    while True:
        message = pubsub.get_message(timeout=BOUND)
        assert message is not None
        if message["data"] == b"end":
            break
        heard.append(message["data"])
    assert heard == [token.encode(), token.encode()]  # once per look, not per release
    pubsub.close()
    assert scripts.run(r, scripts.CANCEL, waiter._key_tuple, (token,)) == 0
    assert r.llen(holder.keys.queue) == 0


def test_a_dead_waiter_is_dropped_at_release(r: redis.Redis) -> None:
    holder = Lock(r, "dead", ttl=30, wait=0, fair=False)
    assert holder.acquire()
    # A channel nobody listens on: the waiter's process is gone.
    _queue_fake_waiter(r, holder, "fedcba9876543210", b"predislock:nobody-listens")
    holder.release()
    assert r.llen(holder.keys.queue) == 0
    assert not r.hexists(holder.keys.state, "q")
    assert not r.hexists(holder.keys.state, "fedcba9876543210")
    assert not r.exists(holder.keys.lease)


# -- mutual exclusion under contention ------------------------------------------------------
def _contend(lock: Lock, occupancy: Occupancy, rounds: int, fences: list[int]) -> None:
    for _ in range(rounds):
        assert lock.acquire(wait=BOUND)
        with occupancy.section():
            fences.append(lock.fence)  # type: ignore[arg-type]
        lock.release()


def test_mutual_exclusion_threads_barging_and_fifo_mixed(r: redis.Redis) -> None:
    plant_sentinel(r)
    occupancy = Occupancy(multiprocessing.get_context("fork"))
    fences: list[int] = []
    errors: list[BaseException] = []

    def run(fair: bool) -> None:
        try:
            _contend(Lock(r, "mx", ttl=10, fair=fair), occupancy, 25, fences)
        except BaseException as exc:
            errors.append(exc)

    # Mostly barging handles, and two of the default order on the same name.
    threads = [threading.Thread(target=run, args=(i < 2,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert occupancy.entries.value == 200
    assert occupancy.violations.value == 0
    assert occupancy.unsafe.value == 200  # no lost read-modify-write update
    # Entries are serialised by the lock: fences in order of entry only grow.
    assert fences == sorted(set(fences))
    assert r.llen(Lock(r, "mx").keys.queue) == 0
    audit_keyspace(r)


def _child(socket_path: str, occupancy: Occupancy, start: float, rounds: int) -> None:
    code = 1
    try:
        client = redis.Redis(unix_socket_path=socket_path, socket_timeout=5)
        lock = Lock(client, "mx-proc", ttl=10, fair=False)
        time.sleep(max(0.0, start - time.time()))
        _contend(lock, occupancy, rounds, [])
        code = 0
    finally:
        os._exit(code)


def test_mutual_exclusion_processes(r: redis.Redis, redis_server: Any) -> None:
    plant_sentinel(r)
    ctx = multiprocessing.get_context("fork")
    occupancy = Occupancy(ctx)
    start = time.time() + 0.5
    procs = [
        ctx.Process(target=_child, args=(redis_server.socket_path, occupancy, start, 30))
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert occupancy.entries.value == 120
    assert occupancy.violations.value == 0
    assert occupancy.unsafe.value == 120
    audit_keyspace(r)


# -- repeatable release and give-back -----------------------------------------------------------
def test_release_is_repeatable(r: redis.Redis) -> None:
    lock = Lock(r, "again", ttl=10, wait=0, fair=False)
    assert lock.acquire()
    token, fence = lock.token, lock.fence
    lock.release()
    other = Lock(r, "again", ttl=10, wait=0, fair=False)
    assert other.acquire()
    # A retry of the first release, whose reply was lost, reports success and
    # leaves the new holder alone.
    args = (token, BARGE_LIMIT, fence)
    assert scripts.run(r, scripts.RELEASE_BARGING, lock._key_tuple, args) == 1
    assert other.owned()
    assert scripts.run(r, scripts.RELEASE_BARGING, lock._key_tuple, ("f" * 16, 1, fence)) == 1
    assert scripts.run(r, scripts.RELEASE_BARGING, lock._key_tuple, ("f" * 16, 1)) == 0
    other.release()


def test_a_given_back_acquire_grants_nothing(r: redis.Redis) -> None:
    # An acquire whose reply was lost: the caller gave it back (cancel), and
    # the same acquire, arriving late or retried, must grant and queue nothing.
    plant_sentinel(r)
    lock = Lock(r, "late", ttl=30, wait=0, fair=False)
    token = "0123456789abcdef"
    lock._round = 1
    args = lock._args_acquire(token, 30_000, "t", 0, NO_CHANNEL)
    assert int(scripts.run(r, scripts.ACQUIRE_BARGING, lock._key_tuple, args)) > 1  # a fence
    assert scripts.run(r, scripts.CANCEL, lock._key_tuple, (token,)) == 1
    assert not r.exists(lock.keys.lease)
    assert scripts.run(r, scripts.ACQUIRE_BARGING, lock._key_tuple, args) == 0
    assert not r.exists(lock.keys.lease)
    holder = Lock(r, "late", ttl=30, wait=0, fair=False)
    assert holder.acquire()
    queued = lock._args_acquire(token, 30_000, "t", 5_000, NO_CHANNEL)
    assert scripts.run(r, scripts.ACQUIRE_BARGING, lock._key_tuple, queued) == 0
    assert r.llen(lock.keys.queue) == 0, "a given-back token joined the queue"
    holder.release()
    audit_keyspace(r)


def test_a_waiter_that_gives_up_leaves_the_queue(r: redis.Redis) -> None:
    holder = Lock(r, "gives-up", ttl=30, wait=0, fair=False)
    assert holder.acquire()
    waiter = Lock(r, "gives-up", ttl=30, fair=False)
    assert not waiter.acquire(wait=0.3)
    assert r.llen(holder.keys.queue) == 0
    fields = set(r.hkeys(holder.keys.state))
    assert fields <= {b"f", b"q", b"d", b"n", b"b", b"w", b"e", b"h", b"u"}, fields
    holder.release()
    assert not r.hexists(holder.keys.state, "q")


def test_replicas_are_waited_for(r: redis.Redis) -> None:
    lock = Lock(r, "acked", ttl=10, wait=0, fair=False, replicas=1, replicas_timeout=0.05)
    with pytest.raises(ReplicationTimeout):
        lock.acquire()
    # The grant no replica acknowledged was given back.
    assert not r.exists(lock.keys.lease)


# -- asyncio ------------------------------------------------------------------------------------
@pytest.fixture
async def ar(redis_server: Any) -> Any:
    client = redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=5)
    yield client
    await client.aclose()


async def _until(predicate: Any) -> None:
    deadline = time.monotonic() + BOUND
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def test_async_barging_and_wakeup(ar: Any, r: redis.Redis) -> None:
    holder = AsyncLock(ar, "a-barge", ttl=30, wait=0, fair=False)
    assert await holder.acquire()
    first = holder.fence
    await holder.release()
    assert await holder.acquire()
    assert holder.fence > first  # type: ignore[operator]
    waiter = AsyncLock(ar, "a-barge", ttl=30, wait=BOUND, fair=False)

    async def wait_for_it() -> tuple[bool, float, int | None]:
        ok = await waiter.acquire()
        at, fence = time.monotonic(), waiter.fence
        if ok:
            await waiter.release()
        return ok, at, fence

    task = asyncio.create_task(wait_for_it())
    await _until(lambda: r.llen(holder.keys.queue) == 1)
    released_at = time.monotonic()
    await holder.release()
    ok, at, fence = await asyncio.wait_for(task, BOUND)
    assert ok is True
    assert at - released_at < 5  # woken, not its 30 s timer
    assert fence > holder.fence  # type: ignore[operator]
    assert not r.exists(holder.keys.lease)


async def test_async_cancelled_waiter_leaves_nothing(ar: Any, r: redis.Redis) -> None:
    plant_sentinel(r)
    holder = AsyncLock(ar, "a-cancel", ttl=30, wait=0, fair=False)
    assert await holder.acquire()
    waiter = AsyncLock(ar, "a-cancel", ttl=30, wait=BOUND, fair=False)
    task = asyncio.create_task(waiter.acquire())
    await _until(lambda: r.llen(holder.keys.queue) == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert r.llen(holder.keys.queue) == 0
    assert waiter.token is None
    await holder.release()
    assert not r.exists(holder.keys.lease)
    assert await waiter.acquire(wait=0)
    await waiter.release()
    audit_keyspace(r)


async def test_async_tasks_never_overlap(ar: Any, r: redis.Redis) -> None:
    inside = 0
    entries = 0
    fences: list[int] = []

    async def worker() -> None:
        nonlocal inside, entries
        lock = AsyncLock(ar, "a-mx", ttl=10, fair=False)
        for _ in range(15):
            assert await lock.acquire(wait=BOUND)
            inside += 1
            entries += 1
            assert inside == 1
            fences.append(lock.fence)  # type: ignore[arg-type]
            await asyncio.sleep(0)
            inside -= 1
            await lock.release()

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(6))), 60)
    assert entries == 90
    assert fences == sorted(set(fences))


# -- the protocol's part, with plain numbers ------------------------------------------------------
def test_a_woken_waiter_lets_the_releaser_go_first() -> None:
    acq = Acquisition(
        ttl_ms=1000,
        deadline=10.0,
        drift_factor=0.01,
        can_take_handed=True,
        now=0.0,
        defer=BARGE_DEFER,
    )
    acq.listening_on(b"pchan")
    acq.attempt(0.0)
    assert acq.on_reply(0, 500, 0.001).move is Move.SLEEP
    # Woken to look again: first a short pause, then the retry.
    step = acq.on_wakeup(None, 0.002)
    assert step.move is Move.SLEEP and step.timeout == pytest.approx(BARGE_DEFER)
    assert acq.on_wakeup(None, 0.004).move is Move.RETRY
    # A lease handed over (the bound was reached) is taken at once.
    acq.attempt(0.005)
    acq.on_reply(0, 500, 0.006)
    step = acq.on_wakeup(Handed(fence=7, round=2), 0.007)
    assert step.move is Move.ACCEPT and step.fence == 7
    # Never past the deadline.
    late = Acquisition(
        ttl_ms=1000,
        deadline=1.0,
        drift_factor=0.01,
        can_take_handed=True,
        now=0.0,
        defer=BARGE_DEFER,
    )
    late.attempt(0.0)
    assert late.on_wakeup(None, 1.5).move is Move.RETRY


def test_the_default_order_never_pauses() -> None:
    acq = Acquisition(ttl_ms=1000, deadline=10.0, drift_factor=0.01, can_take_handed=True, now=0.0)
    acq.attempt(0.0)
    assert acq.on_wakeup(None, 0.002).move is Move.RETRY


# -- what the documentation says ------------------------------------------------------------------
def test_the_documented_bound_and_pauses() -> None:
    """docs/locks.rst, Barging: "at most 64 other acquisitions", "pauses 2 ms",
    "(or 20 ms passed)"; release_barging.lua's WAKE_AGAIN."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "locks.rst").read_text()
    assert BARGE_LIMIT == 64 and "at most 64 other" in text and "at most 65 times" in text
    assert BARGE_DEFER == 0.002 and "pauses 2 ms" in text
    assert "local WAKE_AGAIN = 20\n" in scripts.RELEASE_BARGING.source.decode()
    assert "(or\n  20 ms passed)" in text
