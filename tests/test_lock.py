"""``Lock`` and ``AsyncLock`` against a real Redis: basics, ownership, loss, fencing, waiting.

A scenario that takes ``drive`` runs on both drivers (tests/drive.py).
What every kind of lock does alike is in tests/test_kinds.py.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio

from django_redislock.core import (
    AsyncLock,
    KeySpace,
    Lock,
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    RedisUnavailable,
)
from django_redislock.core.engine import scripts
from django_redislock.core.io import calls, calls_async
from tests.drive import Drive
from tests.helpers_oracles import audit_keyspace, plant_sentinel, wait_until
from tests.servers import free_port


# -- basics ------------------------------------------------------------------------------
async def test_acquire_release_and_state(drive: Drive, r: redis.Redis) -> None:
    plant_sentinel(r)
    lock = drive.Lock(drive.client, "basic", ttl=10, wait=0)
    assert not lock.held and lock.remaining == 0 and not await drive(lock.owned())
    assert await drive(lock.acquire())
    assert lock.held and await drive(lock.owned())
    assert 0 < lock.remaining <= 10
    assert lock.token is not None and lock.fence is not None
    lease = r.hgetall(lock.keys.lease)
    assert lease[b"t"] == lock.token.encode()
    assert int(lease[b"f"]) == lock.fence
    assert b"n" not in lease  # the key shows a short name; only long ones are stored
    assert 0 < r.pttl(lock.keys.lease) <= 10_000
    audit_keyspace(r)
    await drive(lock.release())
    assert not lock.held and not await drive(lock.owned()) and lock.remaining == 0
    assert not r.exists(lock.keys.lease)
    with pytest.raises(LockNotOwned):
        await drive(lock.release())
    # Reusable after release.
    assert await drive(lock.acquire())
    await drive(lock.release())
    audit_keyspace(r)


async def test_extend_resets_ttl(drive: Drive, r: redis.Redis) -> None:
    lock = drive.Lock(drive.client, "extend", ttl=2, wait=0)
    assert await drive(lock.acquire())
    assert r.pttl(lock.keys.lease) <= 2000
    await drive(lock.extend(20))
    assert r.pttl(lock.keys.lease) > 2000
    assert lock.remaining > 2
    await drive(lock.extend())
    assert r.pttl(lock.keys.lease) <= 2000
    await drive(lock.release())


async def test_acquire_ttl_override(drive: Drive, r: redis.Redis) -> None:
    lock = drive.Lock(drive.client, "ttl-override", ttl=1, wait=0)
    assert await drive(lock.acquire(ttl=30))
    assert r.pttl(lock.keys.lease) > 1000
    await drive(lock.release())


async def test_wait_zero_tries_once_and_does_not_queue(drive: Drive, r: redis.Redis) -> None:
    holder = drive.Lock(drive.client, "once", ttl=20, wait=0)
    other = drive.Lock(drive.client, "once", ttl=20, wait=0)
    assert await drive(holder.acquire())
    started = time.monotonic()
    assert not await drive(other.acquire())
    assert not await drive(other.acquire(wait=0))
    assert time.monotonic() - started < 10  # far from the holder's 20 s: it did not wait
    assert other.retry_after is not None and 10 < other.retry_after <= 20
    assert r.llen(holder.keys.queue) == 0
    assert not other.held and other.token is None
    await drive(holder.release())
    assert await drive(other.acquire())
    await drive(other.release())


async def test_context_manager(drive: Drive, r: redis.Redis) -> None:
    plant_sentinel(r)
    async with drive.holding(drive.Lock(drive.client, "ctx", ttl=10, wait=0)) as lock:
        assert await drive(lock.owned())
        with pytest.raises(LockNotAcquired) as info:
            async with drive.holding(drive.Lock(drive.client, "ctx", ttl=10, wait=0)):
                pass  # pragma: no cover
        assert info.value.name == "ctx"
        assert info.value.retry_after is not None and 0 < info.value.retry_after <= 10
    assert not r.exists(lock.keys.lease)
    # The body's exception passes through, and the lock is released.
    with pytest.raises(KeyError):
        async with drive.holding(drive.Lock(drive.client, "ctx", ttl=10, wait=0)):
            raise KeyError("body")
    assert not r.exists(lock.keys.lease)
    audit_keyspace(r)


async def test_wait_times_out_returns_false(drive: Drive, r: redis.Redis) -> None:
    holder = drive.Lock(drive.client, "timeout", ttl=20, wait=0)
    assert await drive(holder.acquire())
    waiter = drive.Lock(drive.client, "timeout", ttl=20)
    started = time.monotonic()
    assert not await drive(waiter.acquire(wait=0.3))
    assert 0.25 < time.monotonic() - started < 5
    # It left the queue behind it.
    assert r.llen(holder.keys.queue) == 0
    assert r.hget(holder.keys.state, waiter.token or "") is None
    await drive(holder.release())


@pytest.mark.parametrize("bad", [-1, -0.001, math.inf, -math.inf, math.nan])
async def test_bad_durations_are_value_errors(drive: Drive, r: redis.Redis, bad: float) -> None:
    with pytest.raises(ValueError, match="ttl must be a finite number"):
        drive.Lock(drive.client, "args", ttl=bad)
    with pytest.raises(ValueError, match="wait must be a finite number"):
        drive.Lock(drive.client, "args", wait=bad)
    with pytest.raises(ValueError, match="renew_max"):
        drive.Lock(drive.client, "args", renew_max=bad)
    lock = drive.Lock(drive.client, "args")
    with pytest.raises(ValueError, match="wait"):
        await drive(lock.acquire(wait=bad))
    with pytest.raises(ValueError, match="ttl"):
        await drive(lock.acquire(ttl=bad))
    assert not r.exists(lock.keys.lease)


@pytest.mark.parametrize("bad", [True, False, "1", None, b"1", [1]])
async def test_non_numbers_are_type_errors(drive: Drive, bad: object) -> None:
    with pytest.raises(TypeError, match="ttl must be a number of seconds"):
        drive.Lock(drive.client, "args", ttl=bad)
    if bad is not None:
        with pytest.raises(TypeError, match="wait must be a number of seconds"):
            drive.Lock(drive.client, "args", wait=bad)
        with pytest.raises(TypeError, match="wait"):
            await drive(drive.Lock(drive.client, "args").acquire(wait=bad))


async def test_zero_ttl_is_rejected_zero_wait_is_not(drive: Drive) -> None:
    with pytest.raises(ValueError, match="more than 0"):
        drive.Lock(drive.client, "args", ttl=0)
    drive.Lock(drive.client, "args", wait=0)
    with pytest.raises(ValueError, match="drift_factor"):
        drive.Lock(drive.client, "args", drift_factor=0.7)


@pytest.mark.parametrize(
    ("option", "bad", "error"),
    [
        ("grace", None, TypeError),
        ("grace", 0, ValueError),
        ("grace", math.nan, ValueError),
        ("replicas", False, TypeError),
        ("replicas", 0.0, TypeError),
        ("replicas", -1, ValueError),
        ("replicas_timeout", None, TypeError),
        ("replicas_timeout", math.inf, ValueError),
        ("fair", 1, TypeError),
        ("fair", None, TypeError),
        ("drift_factor", -0.01, ValueError),
    ],
)
async def test_options_a_handle_seldom_changes_are_checked_all_the_same(
    drive: Drive, option: str, bad: object, error: type[Exception]
) -> None:
    # A handle keeps these only when they differ from their defaults: a value
    # equal to none of them is checked as before.
    with pytest.raises(error, match=option):
        drive.Lock(drive.client, "args", **{option: bad})


async def test_a_handle_with_default_options_stays_compact(drive: Drive) -> None:
    # Fewer than the 30 attributes CPython keeps in a shared key table, after
    # a whole cycle: a handle made per call costs less to build and to read.
    lock = drive.Lock(drive.client, "compact", ttl=10, wait=0)
    assert await drive(lock.acquire())
    await drive(lock.release())
    assert len(vars(lock)) < 30
    # Options given are the handle's own; those left out read as documented.
    chosen = drive.Lock(
        drive.client,
        "compact",
        label="nightly",
        grace=3,
        drift_factor=0.02,
        replicas=1,
        replicas_timeout=0.5,
        fair=False,
        renew_max=60,
    )
    assert (chosen.label, chosen._grace_ms, chosen.drift_factor) == ("nightly", 3000, 0.02)
    assert (chosen.replicas, chosen.replicas_timeout, chosen.fair) == (1, 0.5, False)
    assert chosen.renew_max == 60
    assert (lock.label, lock._grace_ms, lock.drift_factor) == ("", 2000, 0.01)
    assert (lock.replicas, lock.replicas_timeout, lock.fair, lock.renew_max) == (0, 0.1, True, None)


async def test_not_reentrant(drive: Drive) -> None:
    lock = drive.Lock(drive.client, "reentrant", ttl=10, wait=5)
    assert await drive(lock.acquire())
    with pytest.raises(LockError, match="not reentrant"):
        await drive(lock.acquire())
    with pytest.raises(LockError, match="not reentrant"):
        await drive(lock.acquire(wait=0))
    assert await drive(lock.owned())
    await drive(lock.release())


# -- ownership -----------------------------------------------------------------------------
async def test_other_handle_cannot_release_or_extend(drive: Drive, r: redis.Redis) -> None:
    a = drive.Lock(drive.client, "owner", ttl=10, wait=0)
    b = drive.Lock(drive.client, "owner", ttl=10, wait=0)
    assert await drive(a.acquire())
    assert not await drive(b.acquire())
    assert b.retry_after is not None and 0 < b.retry_after <= 10
    with pytest.raises(LockNotOwned):
        await drive(b.release())
    with pytest.raises(LockNotOwned):
        await drive(b.extend())
    assert not await drive(b.owned())
    assert await drive(a.owned())
    assert r.hget(a.keys.lease, "t") == a.token.encode()
    await drive(a.release())


async def test_another_thread_or_task_cannot_release_or_extend_same_handle(
    drive: Drive, r: redis.Redis
) -> None:
    lock = drive.Lock(drive.client, "thread-owner", ttl=10, wait=0)
    assert await drive(lock.acquire())

    async def elsewhere(call: Any) -> Any:
        return await drive.join(drive.spawn(lambda: drive(call())), timeout=10)

    with pytest.raises(LockNotOwned, match=f"another {drive.party}"):
        await elsewhere(lock.release)
    with pytest.raises(LockNotOwned, match=f"another {drive.party}"):
        await elsewhere(lock.extend)
    assert await drive(lock.owned())
    # A second thread or task on the same handle waits, like threading.Lock.
    assert await elsewhere(lambda: lock.acquire(wait=0)) == [False]
    assert await elsewhere(lambda: lock.acquire(wait=0.2)) == [False]
    # It waits until the first releases.
    got = drive.event()

    async def second() -> None:
        assert await drive(lock.acquire(wait=5))
        got.set()

    party = drive.spawn(second)
    with pytest.raises(TimeoutError):
        await got.wait(0.2)
    assert await drive(lock.owned())
    await drive(lock.release())
    await drive.join(party, timeout=5)
    assert got.is_set() and r.exists(lock.keys.lease)
    with pytest.raises(LockNotOwned):
        await drive(lock.release())


async def test_released_handle_cannot_release_or_extend(drive: Drive) -> None:
    a = drive.Lock(drive.client, "released", ttl=10, wait=0)
    assert await drive(a.acquire())
    await drive(a.release())
    b = drive.Lock(drive.client, "released", ttl=10, wait=0)
    assert await drive(b.acquire())
    with pytest.raises(LockNotOwned):
        await drive(a.release())
    with pytest.raises(LockNotOwned):
        await drive(a.extend())
    assert await drive(b.owned())
    await drive(b.release())
    never = drive.Lock(drive.client, "released")
    with pytest.raises(LockNotOwned):
        await drive(never.release())


@pytest.mark.parametrize("how", ["clear", "del"])
async def test_lost_lease_is_reported(drive: Drive, r: redis.Redis, how: str) -> None:
    plant_sentinel(r)
    lost: list[Any] = []
    a = drive.Lock(drive.client, "lost", ttl=10, wait=0, on_lost=lost.append)
    b = drive.Lock(drive.client, "lost", ttl=10, wait=0)
    assert await drive(a.acquire())
    fence_a = a.fence
    if how == "clear":
        assert calls.run(r, scripts.CLEAR, a._key_tuple, (2000, "")) == 1
    else:
        r.delete(a.keys.lease)
    assert not await drive(a.owned())
    with pytest.raises(LockLost):
        await drive(a.extend())
    assert lost == [a]
    assert await drive(b.acquire())
    assert b.fence is not None and fence_a is not None and b.fence > fence_a
    # The old holder's release must not touch the new holder's lease.
    with pytest.raises(LockLost):
        await drive(a.release())
    assert lost == [a]
    assert await drive(b.owned())
    assert r.hget(b.keys.lease, "t") == b.token.encode()
    await drive(b.release())
    audit_keyspace(r)


async def test_lost_at_release_calls_on_lost(drive: Drive, r: redis.Redis) -> None:
    lost: list[Any] = []
    a = drive.Lock(drive.client, "lost2", ttl=10, wait=0, on_lost=lost.append)
    assert await drive(a.acquire())
    r.delete(a.keys.lease)
    b = drive.Lock(drive.client, "lost2", ttl=10, wait=0)
    assert await drive(b.acquire())
    assert b.fence > a.fence
    with pytest.raises(LockLost):
        await drive(a.release())
    assert lost == [a] and a.lost
    assert await drive(b.owned())
    # The handle is usable again, and the lost flag is cleared by the new lease.
    await drive(b.release())
    assert await drive(a.acquire())
    assert not a.lost
    await drive(a.release())


async def test_lost_in_context_manager_raises(drive: Drive, r: redis.Redis) -> None:
    with pytest.raises(LockLost):
        async with drive.holding(drive.Lock(drive.client, "lost3", ttl=10, wait=0)) as lock:
            r.delete(lock.keys.lease)


async def test_clear_with_wrong_token_does_nothing(drive: Drive, r: redis.Redis) -> None:
    a = drive.Lock(drive.client, "clear", ttl=10, wait=0)
    assert await drive(a.acquire())
    assert calls.run(r, scripts.CLEAR, a._key_tuple, (2000, "someone-else")) == 0
    assert await drive(a.owned())
    await drive(a.release())


# -- fencing ---------------------------------------------------------------------------------
async def test_fences_strictly_increase(drive: Drive, r: redis.Redis) -> None:
    a = drive.Lock(drive.client, "fence", ttl=10, wait=0)
    b = drive.Lock(drive.client, "fence", ttl=10, wait=0)
    other = drive.Lock(drive.client, "fence-other", ttl=10, wait=0)
    fences = []
    for i in range(200):
        lock = a if i % 2 else b
        assert await drive(lock.acquire())
        assert int(r.hget(lock.keys.lease, "f")) == lock.fence
        fences.append(lock.fence)
        if i % 10 == 0:
            assert await drive(other.acquire())
            await drive(other.release())
        await drive(lock.release())
    assert all(x < y for x, y in itertools.pairwise(fences)), fences


async def test_fences_increase_across_expiry_and_state_loss(drive: Drive, r: redis.Redis) -> None:
    plant_sentinel(r)
    lock = drive.Lock(drive.client, "fence-expiry", ttl=0.05, wait=0)
    assert await drive(lock.acquire())
    first = lock.fence
    await drive.until(lambda: not r.exists(lock.keys.lease), timeout=5)
    audit_keyspace(r)
    r.delete(lock.keys.state)
    with pytest.raises(LockLost):
        await drive(lock.release())
    assert await drive(lock.acquire())
    assert lock.fence is not None and first is not None and lock.fence > first
    second = lock.fence
    await drive(lock.release())
    # And with every key of the lock gone.
    r.delete(lock.keys.state, lock.keys.lease, lock.keys.queue)
    assert await drive(lock.acquire())
    assert lock.fence > second
    await drive(lock.release())


async def test_fences_stay_above_the_last_one_when_the_server_clock_is_behind(
    drive: Drive, r: redis.Redis
) -> None:
    # A fence is the server clock in microseconds unless the last fence of the
    # name is not below it (a clock stepped back): then it is the last plus one.
    lock = drive.Lock(drive.client, "fence-floor", ttl=10, wait=0)
    assert await drive(lock.acquire())
    now_us = lock.fence
    await drive(lock.release())
    assert now_us is not None
    ahead = now_us + 10**12  # the last fence, 11 days ahead of the clock
    r.hset(lock.keys.state, "f", str(ahead))
    fences = []
    for _ in range(3):
        assert await drive(lock.acquire())
        fences.append(lock.fence)
        await drive(lock.release())
    assert fences == [ahead + 1, ahead + 2, ahead + 3]
    # A floor with fewer digits than the clock never wins.
    r.hset(lock.keys.state, "f", "999")
    assert await drive(lock.acquire())
    assert lock.fence is not None and now_us < lock.fence < ahead
    await drive(lock.release())


async def test_fences_increase_across_restart_without_persistence(
    drive: Drive, redis_factory: Any
) -> None:
    server = redis_factory(port=free_port(), unix=False, persistence=False).start()
    look = server.client(socket_timeout=5, socket_connect_timeout=5)
    async with drive.connect(server.url, socket_timeout=5, socket_connect_timeout=5) as client:
        lock = drive.Lock(client, "fence-restart", ttl=30, wait=0)
        fences = []
        for _ in range(3):
            assert await drive(lock.acquire())
            fences.append(lock.fence)
            server.restart()  # SIGKILL, no persistence: every key is gone
            assert look.dbsize() == 0
            with pytest.raises(LockLost):
                await drive(lock.release())
        assert await drive(lock.acquire())
        fences.append(lock.fence)
        assert int(look.hget(lock.keys.lease, "f")) == lock.fence
        await drive(lock.release())
        assert all(x < y for x, y in itertools.pairwise(fences)), fences
    look.close()


# -- waiting -----------------------------------------------------------------------------------
async def test_release_hands_over_by_notification(drive: Drive, r: redis.Redis) -> None:
    plant_sentinel(r)
    holder = drive.Lock(drive.client, "handoff", ttl=30, wait=0)
    assert await drive(holder.acquire())
    got = drive.event()
    holder_released = drive.event()
    waiter = drive.Lock(drive.client, "handoff", ttl=30, wait=15)

    async def wait_for_it() -> bool:
        ok = await drive(waiter.acquire())
        got.set()
        await holder_released.wait(10)
        return ok

    party = drive.spawn(wait_for_it)
    try:
        await drive.until(lambda: r.llen(holder.keys.queue) == 1)
        await drive(holder.release())
        # The holder's lease had 30 s left and the waiter waits 15 s: without
        # the notification it would have given up before its fallback timer.
        await got.wait(10)
    finally:
        holder_released.set()
    assert await drive.join(party, timeout=10) == [True]
    assert r.llen(holder.keys.queue) == 0
    assert r.hget(waiter.keys.lease, "t") == waiter.token.encode()
    # The waiter ended without releasing: the lease stays until its TTL.
    audit_keyspace(r)


async def test_waiters_are_served_in_fifo_order(drive: Drive, r: redis.Redis) -> None:
    plant_sentinel(r)
    n = 8
    holder = drive.Lock(drive.client, "fifo", ttl=30, wait=0)
    assert await drive(holder.acquire())
    order: list[int] = []

    async def waiter(k: int) -> None:
        lock = drive.Lock(drive.client, "fifo", ttl=30, wait=30)
        if await drive(lock.acquire()):
            order.append(k)
            await drive(lock.release())

    parties = []
    for k in range(n):
        parties.append(drive.spawn(lambda k=k: waiter(k)))
        # Start the next waiter only once this one is in the queue.
        await drive.until(lambda k=k: r.llen(holder.keys.queue) == k + 1)
    await drive(holder.release())
    await drive.join(*parties, timeout=30)
    assert order == list(range(n))
    audit_keyspace(r)


async def test_hundreds_of_waiters_do_not_exhaust_the_pool(drive: Drive, r: redis.Redis) -> None:
    plant_sentinel(r)
    n = 200
    got: list[int] = []
    async with drive.pooled(8, timeout=5) as client:
        holder = drive.Lock(client, "crowd", ttl=60, wait=0)
        assert await drive(holder.acquire())

        async def waiter(k: int) -> None:
            lock = drive.Lock(client, "crowd", ttl=60, wait=90)
            if await drive(lock.acquire()):
                got.append(k)
                await drive(lock.release())

        parties = [drive.spawn(lambda k=k: waiter(k)) for k in range(n)]
        await drive.until(lambda: r.llen(holder.keys.queue) == n, timeout=60, interval=0.05)
        # Not starved of a connection by the waiters: with every pooled
        # connection held by one, the release would fail after the pool's 5 s.
        await drive(holder.release())
        await drive.join(*parties, timeout=90)
    assert sorted(got) == list(range(n))
    assert r.llen(holder.keys.queue) == 0
    audit_keyspace(r)


async def test_many_callers_never_overlap(drive: Drive, r: redis.Redis) -> None:
    plant_sentinel(r)
    parties_n, rounds = 40, 5
    inside = 0
    violations = 0
    unsafe = 0
    start = drive.event()

    async def contender() -> None:
        nonlocal inside, violations, unsafe
        lock = drive.Lock(drive.client, "a-crowd", ttl=20, wait=60)
        await start.wait()
        for _ in range(rounds):
            assert await drive(lock.acquire())
            inside += 1
            if inside != 1:
                violations += 1
            value = unsafe  # read-pause-write: an overlap loses an update
            await drive.sleep(0.001)
            unsafe = value + 1
            inside -= 1
            await drive(lock.release())

    parties = [drive.spawn(contender) for _ in range(parties_n)]
    start.set()
    await drive.join(*parties, timeout=60)
    assert violations == 0
    assert unsafe == parties_n * rounds
    assert r.llen(Lock(r, "a-crowd").keys.queue) == 0
    audit_keyspace(r)


def test_a_waiter_that_gives_up_hands_the_channel_to_the_next(r: redis.Redis) -> None:
    # Waiters read the wake-up channel themselves, one at a time. When the one
    # reading gives up, another must take over: otherwise the next wake-up
    # would wait for nobody, and its waiter would sleep out the holder's
    # whole 30 s lease.
    from django_redislock.core.io.wakeups import get_notifier

    holder = Lock(r, "relay", ttl=30, wait=0)
    assert holder.acquire()
    notifier = get_notifier(r, holder.keyspace)
    impatient = Lock(r, "relay", ttl=30, wait=1.5)
    patient = Lock(r, "relay", ttl=30, wait=20)
    results: dict[str, Any] = {}

    def run(name: str, lock: Lock) -> None:
        results[name] = lock.acquire()
        results[name + "_at"] = time.monotonic()
        if results[name]:
            lock.release()

    first = threading.Thread(target=run, args=("impatient", impatient))
    first.start()
    second = threading.Thread(target=run, args=("patient", patient))
    try:
        wait_until(lambda: r.llen(holder.keys.queue) == 1 and notifier._leading)
        second.start()
        wait_until(lambda: r.llen(holder.keys.queue) == 2)
        first.join(10)  # gave up after its 1.5 s, while reading for both
        assert results["impatient"] is False
        released_at = time.monotonic()
        holder.release()
        second.join(10)
        assert results["patient"] is True
        assert results["patient_at"] - released_at < 2
    finally:
        first.join(10)
        second.join(25)


def test_a_waiter_queued_while_the_channel_was_down_queues_again_with_it(r: redis.Redis) -> None:
    # The channel could not be subscribed in time (here: backing off for 3 s,
    # longer than the 2 s the first contention waits for it), so the waiter
    # queued without it. Once the channel is up it must queue again with it:
    # otherwise a lease handed over would go unnoticed until the holder's
    # whole 30 s lease had run out.
    from django_redislock.core.io.wakeups import get_notifier

    holder = Lock(r, "channel-late", ttl=30, wait=0)
    assert holder.acquire()
    notifier = get_notifier(r, holder.keyspace)
    assert notifier._pubsub is None  # this test's own pool: not subscribed yet
    notifier._retry_at = time.monotonic() + 3.0
    waiter = Lock(r, "channel-late", ttl=30, wait=20)
    result: dict[str, Any] = {}

    def run() -> None:
        result["ok"] = waiter.acquire()
        result["at"] = time.monotonic()
        if result["ok"]:
            waiter.release()

    t = threading.Thread(target=run)
    t.start()
    try:
        wait_until(lambda: notifier._pubsub is not None, timeout=10)
        # Queued again, with the channel in its place in the queue.
        # The waiter's entry is its queue element (the first-come order).
        wait_until(
            lambda: any(notifier.channel in v for v in r.lrange(holder.keys.queue, 0, -1)), 5
        )
        released_at = time.monotonic()
        holder.release()
        t.join(10)
        assert result.get("ok") is True
        assert result["at"] - released_at < 2
    finally:
        t.join(25)


def test_a_short_sleeper_leaves_a_slow_subscribe_for_the_next(redis_factory: Any) -> None:
    # A waiter about to sleep for a few milliseconds cannot wait for the
    # SUBSCRIBE confirmation over a slow link (50 ms each way here): that is
    # not a failure (no back-off, no warning); the subscription stays pending
    # and the next waiter finishes it.
    from django_redislock.core.io.wakeups import Notifier, Wakeup
    from tests.faults.proxy import FaultProxy

    server = redis_factory(port=free_port(), unix=False).start()
    proxy = FaultProxy(("127.0.0.1", server.port))
    client = redis.Redis.from_url(proxy.url, socket_timeout=5, socket_connect_timeout=5)
    try:
        notifier = Notifier(client, KeySpace("short-sleeper"))
        with proxy.fault(latency=0.05):
            assert notifier.wait(Wakeup(), 0.005) is None
            assert notifier._channel.reconnect.failures == 0 and notifier._retry_at == 0.0
            assert notifier._pending is not None
            assert notifier.wait_ready(2.0)
        assert notifier._channel.reconnect.failures == 0 and notifier._pending is None
    finally:
        client.close()
        proxy.close()


def test_a_waiters_event_wakes_its_one_sleeper() -> None:
    # The notifier's event (one lock, not an Event's condition): set from
    # another thread wakes the sleeper at once; it stays set until cleared;
    # set twice is set once; taking the turn clears it.
    from django_redislock.core.engine.wakeup_message import Handed
    from django_redislock.core.io.wakeups import Wakeup

    event = Wakeup()
    assert not event.is_set() and event.wait(0) is False and event.wait(0.01) is False
    woke = threading.Event()
    sleeper = threading.Thread(target=lambda: event.wait(30) and woke.set())
    sleeper.start()
    try:
        event.set()
        event.set()
        assert woke.wait(10)
    finally:
        sleeper.join(10)
    assert event.is_set() and event.wait(0) and event.wait(5)
    event.handed = Handed(7, 1)
    event.fired = event.promoted = True
    assert event.take_turn() == Handed(7, 1)
    assert not (event.is_set() or event.fired or event.promoted) and event.handed is None
    assert event.wait(0) is False
    event.clear()
    assert not event.is_set()
    event.set()
    assert event.wait(0)


# -- invariant 6 and Redis failures ---------------------------------------------------------------
async def test_late_acquire_reply_is_not_an_acquisition(drive: Drive, redis_factory: Any) -> None:
    server = redis_factory(port=free_port(), unix=False).start()
    look = server.client(socket_timeout=5)
    plant_sentinel(look)
    async with drive.connect(server.url, socket_timeout=10, socket_connect_timeout=5) as client:
        await drive(client.ping())  # the connection exists before the pause
        lock = drive.Lock(client, "late", ttl=0.05, wait=0)
        server.pause()
        timer = threading.Timer(0.3, server.resume)
        timer.start()
        try:
            assert await drive(lock.acquire()) is False
        finally:
            timer.join(5)
            server.resume()
        assert not lock.held and lock.token is None
        assert not await drive(client.exists(lock.keys.lease))
        # Nothing prevents a normal acquire afterwards.
        assert await drive(lock.acquire(ttl=5))
        await drive(lock.release())
    audit_keyspace(look)
    look.close()


@pytest.mark.parametrize("wait", [0, 5])
async def test_redis_down_is_unavailable_not_busy(
    drive: Drive, redis_factory: Any, wait: float
) -> None:
    server = redis_factory(port=free_port(), unix=False).start()
    async with drive.connect(server.url, socket_timeout=1, socket_connect_timeout=1) as client:
        lock = drive.Lock(client, "down", ttl=5, wait=wait)
        assert await drive(lock.acquire())
        server.stop()
        started = time.monotonic()
        with pytest.raises(RedisUnavailable):
            await drive(lock.release())
        other = drive.Lock(client, "down", ttl=5, wait=wait)
        with pytest.raises(RedisUnavailable):
            await drive(other.acquire())
        with pytest.raises(RedisUnavailable):
            async with drive.holding(drive.Lock(client, "down", ttl=5, wait=wait)):
                pass  # pragma: no cover
        assert time.monotonic() - started < 5
        # Released state stays coherent: the handle no longer thinks it holds it.
        assert not lock.held


async def test_redis_error_reply_is_unavailable(drive: Drive, r: redis.Redis) -> None:
    lock = drive.Lock(drive.client, "wrongtype", ttl=5, wait=0)
    r.set(lock.keys.lease, "not a hash")
    with pytest.raises(RedisUnavailable, match="error"):
        await drive(lock.acquire())


async def test_keyspace_prefix_is_used(drive: Drive, r: redis.Redis) -> None:
    plant_sentinel(r)
    ks = KeySpace("other:app")
    lock = drive.Lock(drive.client, "pfx", ttl=5, wait=0, keyspace=ks)
    assert await drive(lock.acquire())
    assert lock.keys.lease.startswith(b"other:app:L:")
    assert r.exists(lock.keys.lease)
    # Other namespace, other lock.
    assert await drive(drive.Lock(drive.client, "pfx", ttl=5, wait=0).acquire())
    audit_keyspace(r, "other:app")
    await drive(lock.release())


async def test_lost_wakeup_is_recovered_when_the_channel_reconnects(
    drive: Drive, r: redis.Redis
) -> None:
    holder = drive.Lock(drive.client, "lost-wakeup", ttl=30, wait=0)
    assert await drive(holder.acquire())
    waiter = drive.Lock(drive.client, "lost-wakeup", ttl=30, wait=20)
    result: dict[str, Any] = {}
    done = drive.event()

    async def wait_for_it() -> None:
        result["ok"] = await drive(waiter.acquire())
        result["at"] = time.monotonic()
        await done.wait(10)
        if result["ok"]:
            await drive(waiter.release())

    party = drive.spawn(wait_for_it)
    try:
        await drive.until(lambda: r.llen(holder.keys.queue) == 1)
        # Drop every wake-up channel, then release at once: the wake-up is
        # published to nobody. The listener's reconnect must make up for it,
        # long before the holder's 30 s lease would have run out.
        assert r.client_kill_filter(_type="pubsub") >= 1
        released_at = time.monotonic()
        await drive(holder.release())
        await drive.until(lambda: "ok" in result, timeout=15)
        assert result["ok"] is True
        assert result["at"] - released_at < 5
    finally:
        done.set()
    await drive.join(party, timeout=10)


async def test_a_repeated_release_reports_success_never_a_new_holders_lease(
    drive: Drive, r: redis.Redis
) -> None:
    # A release whose reply was lost may be sent again (a client retry): the
    # second run must say "released" whatever happened to the lease after
    # (invariant 14), and must never free a later holder.
    lock = drive.Lock(drive.client, "repeat", ttl=5, wait=0)
    assert await drive(lock.acquire())
    keys, args = lock._key_tuple, lock._release_args(lock.token)
    assert calls.run(r, scripts.RELEASE, keys, args) == 1
    assert calls.run(r, scripts.RELEASE, keys, args) == 1
    other = drive.Lock(drive.client, "repeat", ttl=5, wait=0)
    assert await drive(other.acquire())
    assert calls.run(r, scripts.RELEASE, keys, args) == 1
    assert await drive(other.owned())
    await drive(other.release())
    assert calls.run(r, scripts.RELEASE, keys, args) == 1


async def test_a_repeated_release_after_the_lease_went_to_a_waiter_is_no_loss(
    drive: Drive, r: redis.Redis
) -> None:
    # The first release handed the lease straight to a queued waiter; the
    # retry of that release (its reply was lost) used to find another holder
    # and report a false LockLost.
    lock = drive.Lock(drive.client, "repeat-handed", ttl=5, wait=0)
    assert await drive(lock.acquire())
    keys, args = lock._key_tuple, lock._release_args(lock.token)
    waiter = drive.Lock(drive.client, "repeat-handed", ttl=5, wait=10)
    got = drive.event()
    checked = drive.event()

    async def wait_for_it() -> None:
        if await drive(waiter.acquire()):
            got.set()
            await checked.wait(10)
            await drive(waiter.release())

    party = drive.spawn(wait_for_it)
    try:
        await drive.until(lambda: r.llen(lock.keys.queue) == 1, timeout=10)
        assert calls.run(r, scripts.RELEASE, keys, args) == 1  # handed to the waiter
        await got.wait(10)
        assert calls.run(r, scripts.RELEASE, keys, args) == 1  # the retry
        assert await drive(waiter.owned())
    finally:
        checked.set()
    await drive.join(party, timeout=10)


async def test_owned_works_with_a_decoding_client(drive: Drive, redis_server: Any) -> None:
    async with drive.connect(redis_server.url, decode_responses=True, socket_timeout=5) as client:
        lock = drive.Lock(client, "decoded", ttl=5, wait=0)
        assert await drive(lock.acquire())
        assert await drive(lock.owned())
        await drive(lock.release())
        assert not await drive(lock.owned())


async def test_renewal_keeps_the_lease_and_reports_its_loss(drive: Drive, r: redis.Redis) -> None:
    lost: list[Any] = []
    # Renewed past twice its TTL. A 0.6 s lease once ran out under CI's six
    # workers on two cores (an asyncio renewal that missed its window):
    # the TTL leaves a loaded host room, the test asks the same.
    lock = drive.Lock(drive.client, "a-renew", ttl=1.5, wait=0, renew=True, on_lost=lost.append)
    assert await drive(lock.acquire())
    await drive.sleep(3.5)
    assert await drive(lock.owned())
    r.delete(lock.keys.lease)
    await drive.until(lambda: lost, 5)
    with pytest.raises(LockLost):
        await drive(lock.release())
    assert lost == [lock]


# -- what only tasks can do: be cancelled ----------------------------------------------------
async def _state_clean(r: redis.Redis, lock: AsyncLock) -> None:
    assert r.llen(lock.keys.queue) == 0
    fields = set(r.hkeys(lock.keys.state))
    # Only bookkeeping may remain (last fence, queue hint, name, tokens given
    # back, the memory of losses): no waiter entries.
    assert fields <= {b"f", b"q", b"d", b"n", b"e", b"h", b"u"}, fields


async def test_cancel_waiting_acquire_leaves_nothing(
    ar: redis.asyncio.Redis, r: redis.Redis, adrive: Drive
) -> None:
    plant_sentinel(r)
    holder = AsyncLock(ar, "a-cancel", ttl=30, wait=0)
    assert await holder.acquire()
    waiter = AsyncLock(ar, "a-cancel", ttl=30, wait=20)
    task = asyncio.create_task(waiter.acquire())

    async def queued() -> bool:
        return bool(r.llen(holder.keys.queue) == 1)

    await adrive.until(queued)
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
            assert calls.run(r, scripts.CLEAR, lock._key_tuple, (2000, lock.token)) == 1
        await _state_clean(r, holder)
        if contended:
            assert r.hget(holder.keys.lease, "t") == holder.token.encode()  # type: ignore[union-attr]
    assert "cancelled" in outcomes
    if contended:
        await holder.release()
    audit_keyspace(r)


def _slow_script(monkeypatch: pytest.MonkeyPatch, which: Any, delay: float) -> None:
    """Stretch one script's round trip, to cancel a task in the middle of it."""
    original = calls_async.run_async

    async def slow(client: Any, script: Any, keys: Any, args: Any) -> Any:
        if script is which:
            await asyncio.sleep(delay)
        return await original(client, script, keys, args)

    monkeypatch.setattr(calls_async, "run_async", slow)


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
    redis_factory: Any, adrive: Drive
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
            # The waiter's entry is its queue element (the first-come order).
            queued = direct.lrange(holder.keys.queue, 0, -1)
            return any(b"|p" in v for v in queued)  # type: ignore[union-attr]

        got: list[float] = []

        async def take() -> bool:
            if not await waiter.acquire():
                return False
            got.append(time.monotonic())
            await waiter.release()
            return True

        with proxy.fault(latency=1.1):
            task = asyncio.create_task(take())
            await adrive.until(queued_with_channel, timeout=18)
            released_at = time.monotonic()
            holder.release()
            assert await asyncio.wait_for(task, 10)
            assert got[0] - released_at < 5
    finally:
        await slow.aclose()
        direct.close()
        proxy.close()
