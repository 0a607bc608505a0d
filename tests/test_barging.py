"""The barging order, ``Lock(..., fair=False)``, against a real Redis.

A release frees the lease and wakes the oldest waiter to look again; whoever
asks first takes it, until the head of the queue has seen ``BARGE_LIMIT``
others served, when the lease is handed to it as in the default order.

A scenario that takes ``drive`` runs on ``Lock`` and ``AsyncLock`` (tests/drive.py).
What every kind of lock does alike is in tests/test_kinds.py.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from typing import Any

import pytest
import redis

from django_redislock.core import AsyncLock, Lock
from django_redislock.core.engine import scripts
from django_redislock.core.engine.protocol import BARGE_DEFER, BARGE_LIMIT, Acquisition, Move
from django_redislock.core.engine.wakeup_message import NO_CHANNEL, Handed
from django_redislock.core.io import calls
from tests.drive import Drive, run_to_end
from tests.helpers import flowing
from tests.helpers_oracles import Occupancy, audit_keyspace, exit_codes_of_forks, plant_sentinel

# Every wait in these tests is bounded by this; none is expected to come near it.
BOUND = 20.0


def _queue_fake_waiter(r: redis.Redis, lock: Lock, token: str, address: bytes) -> None:
    """Queue ``token`` behind the holder of ``lock``'s name, as a waiter in a
    process that never retries by itself: only a handed lease reaches it."""
    waiter = Lock(r, lock.name, ttl=30, wait=0, fair=False)
    waiter._round = 1
    args = waiter._args_acquire(token, 30_000, "fake", 10_000, address)
    assert calls.run(r, scripts.ACQUIRE_BARGING, waiter._key_tuple, args) > 0  # busy, queued
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
async def test_fair_must_be_a_bool(drive: Drive, bad: Any) -> None:
    with pytest.raises(TypeError, match=r"fair must be True .* or False"):
        drive.Lock(drive.client, "x", fair=bad)


async def test_uncontended_acquire_release_and_fences(drive: Drive, r: redis.Redis) -> None:
    plant_sentinel(r)
    lock = drive.Lock(drive.client, "plain", ttl=10, wait=0, fair=False)
    fences = []
    for _ in range(3):
        async with drive.holding(lock):
            assert await drive(lock.owned())
            fences.append(lock.fence)
            lease = r.hgetall(lock.keys.lease)
            assert lease[b"t"] == lock.token.encode()
            assert b"pid" in lease[b"o"]  # owner metadata, as in the default order
    assert fences == sorted(set(fences))
    assert not r.exists(lock.keys.lease)
    audit_keyspace(r)


# -- barging, and its bound ---------------------------------------------------------------
async def test_a_releaser_takes_the_lock_back_then_hands_it_over_at_the_bound(
    drive: Drive, r: redis.Redis
) -> None:
    plant_sentinel(r)
    holder = drive.Lock(drive.client, "bound", ttl=30, wait=0, fair=False)
    assert await drive(holder.acquire())
    waiter_token = "0123456789abcdef"
    # Without a channel: the waiter is never woken, so every release is a
    # chance for the holder to barge, and only the bound serves the waiter.
    _queue_fake_waiter(r, holder, waiter_token, NO_CHANNEL)
    fences = [holder.fence]
    barges = 0
    for _ in range(BARGE_LIMIT + 2):
        await drive(holder.release())
        if not await drive(holder.acquire(wait=0)):
            break
        barges += 1
        fences.append(holder.fence)
    assert barges == BARGE_LIMIT
    assert fences == sorted(set(fences))  # every grant a new, larger fence
    # The bound was reached: the lease went to the waiter, as a handoff.
    assert r.hget(holder.keys.lease, "t") == waiter_token.encode()
    assert int(r.hget(holder.keys.lease, "f")) > fences[-1]
    assert not r.hexists(holder.keys.state, "b")  # the count starts again
    assert r.llen(holder.keys.queue) == 0
    args = (waiter_token, BARGE_LIMIT)
    assert calls.run(r, scripts.RELEASE_BARGING, holder._key_tuple, args) == 1
    # The queue is empty again: the next acquire is the uncontended one.
    assert await drive(holder.acquire(wait=0))
    await drive(holder.release())
    audit_keyspace(r)


async def test_a_waiter_is_served_within_the_bound_while_the_holder_loops(
    drive: Drive, r: redis.Redis
) -> None:
    holder = drive.Lock(drive.client, "loop", ttl=30, wait=0, fair=False)
    assert await drive(holder.acquire())
    waiter = drive.Lock(drive.client, "loop", ttl=30, wait=BOUND, fair=False)
    got = drive.event()
    done = drive.event()

    async def wait_for_it() -> tuple[bool, int | None]:
        try:
            ok, fence = await drive(waiter.acquire()), waiter.fence
        finally:
            got.set()
        await done.wait(BOUND)
        if ok:
            await drive(waiter.release())
        return ok, fence

    party = drive.spawn(wait_for_it)
    await drive.until(lambda: r.llen(holder.keys.queue) == 1, BOUND)
    barges = 0
    last_fence = holder.fence
    try:
        # The holder takes the lock straight back after each release, as
        # fast as it can: the waiter must still get it, within the bound.
        for _ in range(BARGE_LIMIT + 1):
            await drive(holder.release())
            if not await drive(holder.acquire(wait=0)):
                break
            barges += 1
            last_fence = holder.fence
        assert barges <= BARGE_LIMIT
        await got.wait(BOUND)
        assert not await drive(holder.acquire(wait=0))  # the waiter holds it now
    finally:
        done.set()
        if holder.token is not None:
            await drive(holder.release())
    [(ok, fence)] = await drive.join(party, timeout=BOUND)
    assert ok is True
    assert fence > last_fence
    assert not r.exists(holder.keys.lease)


async def test_a_release_wakes_the_head_when_nobody_barges(drive: Drive, r: redis.Redis) -> None:
    holder = drive.Lock(drive.client, "wake", ttl=30, wait=0, fair=False)
    assert await drive(holder.acquire())
    first = holder.fence
    await drive(holder.release())
    assert await drive(holder.acquire())
    assert holder.fence > first
    waiter = drive.Lock(drive.client, "wake", ttl=30, wait=BOUND, fair=False)

    async def wait_for_it() -> tuple[bool, float, int | None]:
        ok = await drive(waiter.acquire())
        at, fence = time.monotonic(), waiter.fence
        if ok:
            await drive(waiter.release())
        return ok, at, fence

    party = drive.spawn(wait_for_it)
    await drive.until(lambda: r.llen(holder.keys.queue) == 1, BOUND)
    released_at = time.monotonic()
    await drive(holder.release())
    [(ok, at, fence)] = await drive.join(party, timeout=BOUND)
    assert ok is True
    # The holder's lease had 30 s left: only the wake-up explains this.
    assert at - released_at < 5
    assert fence > holder.fence
    assert r.llen(holder.keys.queue) == 0
    assert not r.hexists(holder.keys.state, "q")
    assert not r.exists(holder.keys.lease)


async def test_a_woken_waiter_is_not_woken_again_before_it_looks(
    drive: Drive, r: redis.Redis
) -> None:
    holder = drive.Lock(drive.client, "once", ttl=30, wait=0, fair=False)
    assert await drive(holder.acquire())
    channel = "redislock-test:once"
    pubsub = r.pubsub()
    pubsub.subscribe(channel)
    assert pubsub.get_message(timeout=BOUND)["type"] == "subscribe"  # type: ignore[index]
    token = "0123456789abcdef"
    _queue_fake_waiter(r, holder, token, b"p" + channel.encode())
    await drive(holder.release())  # wakes the waiter
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
        assert await drive(holder.acquire(wait=0))
        await drive(holder.release())
    # The waiter looks again (its attempt 2) and finds the lock taken: queued
    # again, it is woken by the next release.
    assert await drive(holder.acquire(wait=0))
    waiter = Lock(r, "once", ttl=30, wait=0, fair=False)
    waiter._round = 2
    again = waiter._args_acquire(token, 30_000, "fake", 10_000, b"p" + channel.encode())
    assert calls.run(r, scripts.ACQUIRE_BARGING, waiter._key_tuple, again) > 0
    await drive(holder.release())
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
    assert calls.run(r, scripts.CANCEL, waiter._key_tuple, (token,)) == 0
    assert r.llen(holder.keys.queue) == 0


async def test_a_dead_waiter_is_dropped_at_release(drive: Drive, r: redis.Redis) -> None:
    holder = drive.Lock(drive.client, "dead", ttl=30, wait=0, fair=False)
    assert await drive(holder.acquire())
    # A channel nobody listens on: the waiter's process is gone.
    _queue_fake_waiter(r, holder, "fedcba9876543210", b"predislock:nobody-listens")
    await drive(holder.release())
    assert r.llen(holder.keys.queue) == 0
    assert not r.hexists(holder.keys.state, "q")
    assert not r.hexists(holder.keys.state, "fedcba9876543210")
    assert not r.exists(holder.keys.lease)


# -- mutual exclusion under contention ------------------------------------------------------
async def _contend(
    drive: Drive, lock: Any, occupancy: Occupancy, rounds: int, fences: list[int]
) -> None:
    for _ in range(rounds):
        assert await drive(lock.acquire(wait=BOUND))
        fences.append(lock.fence)
        await occupancy.visit(drive)
        await drive(lock.release())


async def test_mutual_exclusion_barging_and_fifo_mixed(drive: Drive, r: redis.Redis) -> None:
    plant_sentinel(r)
    occupancy = Occupancy(multiprocessing.get_context("fork"))
    fences: list[int] = []
    # Mostly barging handles, and two of the default order on the same name.
    parties = [
        drive.spawn(
            lambda i=i: _contend(
                drive, drive.Lock(drive.client, "mx", ttl=10, fair=i < 2), occupancy, 25, fences
            )
        )
        for i in range(8)
    ]
    await drive.join(*parties, timeout=60)
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
        run_to_end(_contend(Drive("sync", client, client), lock, occupancy, rounds, []))
        code = 0
    finally:
        os._exit(code)


def test_mutual_exclusion_processes(r: redis.Redis, redis_server: Any) -> None:
    plant_sentinel(r)
    ctx = multiprocessing.get_context("fork")
    occupancy = Occupancy(ctx)
    start = time.time() + 0.5
    args = (redis_server.socket_path, occupancy, start, 30)
    assert exit_codes_of_forks(_child, [args] * 4, 60) == [0, 0, 0, 0]
    assert occupancy.entries.value == 120
    assert occupancy.violations.value == 0
    assert occupancy.unsafe.value == 120
    audit_keyspace(r)


# -- repeatable release and give-back -----------------------------------------------------------
async def test_release_is_repeatable(drive: Drive, r: redis.Redis) -> None:
    lock = drive.Lock(drive.client, "again", ttl=10, wait=0, fair=False)
    assert await drive(lock.acquire())
    token, fence = lock.token, lock.fence
    await drive(lock.release())
    other = drive.Lock(drive.client, "again", ttl=10, wait=0, fair=False)
    assert await drive(other.acquire())
    # A retry of the first release, whose reply was lost, reports success and
    # leaves the new holder alone.
    args = (token, BARGE_LIMIT, fence)
    assert calls.run(r, scripts.RELEASE_BARGING, lock._key_tuple, args) == 1
    assert await drive(other.owned())
    assert calls.run(r, scripts.RELEASE_BARGING, lock._key_tuple, ("f" * 16, 1, fence)) == 1
    assert calls.run(r, scripts.RELEASE_BARGING, lock._key_tuple, ("f" * 16, 1)) == 0
    await drive(other.release())


async def test_a_given_back_acquire_grants_nothing(drive: Drive, r: redis.Redis) -> None:
    # An acquire whose reply was lost: the caller gave it back (cancel), and
    # the same acquire, arriving late or retried, must grant and queue nothing.
    plant_sentinel(r)
    lock = Lock(r, "late", ttl=30, wait=0, fair=False)
    token = "0123456789abcdef"
    lock._round = 1
    args = lock._args_acquire(token, 30_000, "t", 0, NO_CHANNEL)
    assert int(calls.run(r, scripts.ACQUIRE_BARGING, lock._key_tuple, args)) > 1  # a fence
    assert calls.run(r, scripts.CANCEL, lock._key_tuple, (token,)) == 1
    assert not r.exists(lock.keys.lease)
    assert calls.run(r, scripts.ACQUIRE_BARGING, lock._key_tuple, args) == 0
    assert not r.exists(lock.keys.lease)
    holder = drive.Lock(drive.client, "late", ttl=30, wait=0, fair=False)
    assert await drive(holder.acquire())
    queued = lock._args_acquire(token, 30_000, "t", 5_000, NO_CHANNEL)
    assert calls.run(r, scripts.ACQUIRE_BARGING, lock._key_tuple, queued) == 0
    assert r.llen(lock.keys.queue) == 0, "a given-back token joined the queue"
    await drive(holder.release())
    audit_keyspace(r)


# -- what only tasks can do: be cancelled -------------------------------------------------------
async def test_a_cancelled_waiter_leaves_nothing(adrive: Drive, r: redis.Redis) -> None:
    ar = adrive.client
    plant_sentinel(r)
    holder = AsyncLock(ar, "a-cancel", ttl=30, wait=0, fair=False)
    assert await holder.acquire()
    waiter = AsyncLock(ar, "a-cancel", ttl=30, wait=BOUND, fair=False)
    task = asyncio.create_task(waiter.acquire())
    await adrive.until(lambda: r.llen(holder.keys.queue) == 1)
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

    text = flowing((Path(__file__).resolve().parents[1] / "docs" / "locks.rst").read_text())
    assert BARGE_LIMIT == 64 and "at most 64 other" in text and "at most 65 times" in text
    assert BARGE_DEFER == 0.002 and "pauses 2 ms" in text
    assert "local WAKE_AGAIN = 20\n" in scripts.RELEASE_BARGING.source.decode()
    assert "(or 20 ms passed)" in text
