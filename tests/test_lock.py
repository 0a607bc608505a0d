"""``Lock`` against a real Redis: basics, ownership, loss, fencing, waiting."""

from __future__ import annotations

import itertools
import math
import threading
import time
from typing import Any

import pytest
import redis

from django_redislock.core import (
    KeySpace,
    Lock,
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    RedisUnavailable,
)
from django_redislock.core.engine import scripts
from tests.helpers_oracles import audit_keyspace, plant_sentinel, wait_until
from tests.servers import free_port


def _run_thread(fn: Any) -> Any:
    """Run ``fn`` in another thread; return its result or re-raise its exception."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:
            out["error"] = exc

    t = threading.Thread(target=target)
    t.start()
    t.join(10)
    assert not t.is_alive()
    if "error" in out:
        raise out["error"]
    return out.get("value")


# -- basics ------------------------------------------------------------------------------
def test_acquire_release_and_state(r: redis.Redis) -> None:
    plant_sentinel(r)
    lock = Lock(r, "basic", ttl=10, wait=0)
    assert not lock.held and lock.remaining == 0 and not lock.owned()
    assert lock.acquire()
    assert lock.held and lock.owned()
    assert 0 < lock.remaining <= 10
    assert lock.token is not None and lock.fence is not None
    lease = r.hgetall(lock.keys.lease)
    assert lease[b"t"] == lock.token.encode()
    assert int(lease[b"f"]) == lock.fence
    assert b"n" not in lease  # the key shows a short name; only long ones are stored
    assert 0 < r.pttl(lock.keys.lease) <= 10_000
    audit_keyspace(r)
    lock.release()
    assert not lock.held and not lock.owned() and lock.remaining == 0
    assert not r.exists(lock.keys.lease)
    # Reusable after release.
    assert lock.acquire()
    lock.release()
    audit_keyspace(r)


def test_extend_resets_ttl(r: redis.Redis) -> None:
    lock = Lock(r, "extend", ttl=2, wait=0)
    assert lock.acquire()
    assert r.pttl(lock.keys.lease) <= 2000
    lock.extend(20)
    assert r.pttl(lock.keys.lease) > 2000
    assert lock.remaining > 2
    lock.extend()
    assert r.pttl(lock.keys.lease) <= 2000
    lock.release()


def test_acquire_ttl_override(r: redis.Redis) -> None:
    lock = Lock(r, "ttl-override", ttl=1, wait=0)
    assert lock.acquire(ttl=30)
    assert r.pttl(lock.keys.lease) > 1000
    lock.release()


def test_wait_zero_tries_once_and_does_not_queue(r: redis.Redis) -> None:
    holder = Lock(r, "once", ttl=20, wait=0)
    other = Lock(r, "once", ttl=20, wait=0)
    assert holder.acquire()
    started = time.monotonic()
    assert not other.acquire()
    assert not other.acquire(wait=0)
    assert time.monotonic() - started < 2
    assert other.retry_after is not None and 10 < other.retry_after <= 20
    assert r.llen(holder.keys.queue) == 0
    assert not other.held and other.token is None
    holder.release()
    assert other.acquire()
    other.release()


def test_context_manager(r: redis.Redis) -> None:
    plant_sentinel(r)
    with Lock(r, "ctx", ttl=10, wait=0) as lock:
        assert lock.owned()
        with pytest.raises(LockNotAcquired) as info, Lock(r, "ctx", ttl=10, wait=0):
            pass  # pragma: no cover
        assert info.value.name == "ctx"
        assert info.value.retry_after is not None and 0 < info.value.retry_after <= 10
    assert not r.exists(lock.keys.lease)
    # The body's exception passes through, and the lock is released.
    with pytest.raises(KeyError), Lock(r, "ctx", ttl=10, wait=0):
        raise KeyError("body")
    assert not r.exists(lock.keys.lease)
    audit_keyspace(r)


def test_wait_times_out_returns_false(r: redis.Redis) -> None:
    holder = Lock(r, "timeout", ttl=20, wait=0)
    assert holder.acquire()
    waiter = Lock(r, "timeout", ttl=20)
    started = time.monotonic()
    assert not waiter.acquire(wait=0.3)
    assert 0.25 < time.monotonic() - started < 5
    # It left the queue behind it.
    assert r.llen(holder.keys.queue) == 0
    assert r.hget(holder.keys.state, waiter.token or "") is None
    holder.release()


@pytest.mark.parametrize("bad", [-1, -0.001, math.inf, -math.inf, math.nan])
def test_bad_durations_are_value_errors(r: redis.Redis, bad: float) -> None:
    with pytest.raises(ValueError, match="ttl must be a finite number"):
        Lock(r, "args", ttl=bad)
    with pytest.raises(ValueError, match="wait must be a finite number"):
        Lock(r, "args", wait=bad)
    with pytest.raises(ValueError, match="renew_max"):
        Lock(r, "args", renew_max=bad)
    lock = Lock(r, "args")
    with pytest.raises(ValueError, match="wait"):
        lock.acquire(wait=bad)
    with pytest.raises(ValueError, match="ttl"):
        lock.acquire(ttl=bad)
    assert not r.exists(lock.keys.lease)


@pytest.mark.parametrize("bad", [True, False, "1", None, b"1", [1]])
def test_non_numbers_are_type_errors(r: redis.Redis, bad: object) -> None:
    with pytest.raises(TypeError, match="ttl must be a number of seconds"):
        Lock(r, "args", ttl=bad)  # type: ignore[arg-type]
    if bad is not None:
        with pytest.raises(TypeError, match="wait must be a number of seconds"):
            Lock(r, "args", wait=bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="wait"):
            Lock(r, "args").acquire(wait=bad)  # type: ignore[arg-type]


def test_zero_ttl_is_rejected_zero_wait_is_not(r: redis.Redis) -> None:
    with pytest.raises(ValueError, match="more than 0"):
        Lock(r, "args", ttl=0)
    Lock(r, "args", wait=0)
    with pytest.raises(ValueError, match="drift_factor"):
        Lock(r, "args", drift_factor=0.7)


def test_not_reentrant(r: redis.Redis) -> None:
    lock = Lock(r, "reentrant", ttl=10, wait=5)
    assert lock.acquire()
    with pytest.raises(LockError, match="not reentrant"):
        lock.acquire()
    with pytest.raises(LockError, match="not reentrant"):
        lock.acquire(wait=0)
    assert lock.owned()
    lock.release()


# -- ownership -----------------------------------------------------------------------------
def test_other_handle_cannot_release_or_extend(r: redis.Redis) -> None:
    a = Lock(r, "owner", ttl=10, wait=0)
    b = Lock(r, "owner", ttl=10, wait=0)
    assert a.acquire()
    with pytest.raises(LockNotOwned):
        b.release()
    with pytest.raises(LockNotOwned):
        b.extend()
    assert not b.owned()
    assert a.owned()
    assert r.hget(a.keys.lease, "t") == a.token.encode()  # type: ignore[union-attr]
    a.release()


def test_other_thread_cannot_release_or_extend_same_handle(r: redis.Redis) -> None:
    lock = Lock(r, "thread-owner", ttl=10, wait=0)
    assert lock.acquire()
    with pytest.raises(LockNotOwned, match="another thread"):
        _run_thread(lock.release)
    with pytest.raises(LockNotOwned, match="another thread"):
        _run_thread(lock.extend)
    assert lock.owned()
    # A second thread on the same handle waits, like threading.Lock.
    assert _run_thread(lambda: lock.acquire(wait=0)) is False
    assert _run_thread(lambda: lock.acquire(wait=0.2)) is False
    lock.release()
    assert _run_thread(lambda: lock.acquire(wait=0)) is True
    assert r.exists(lock.keys.lease)
    with pytest.raises(LockNotOwned):
        lock.release()


def test_released_handle_cannot_release_or_extend(r: redis.Redis) -> None:
    a = Lock(r, "released", ttl=10, wait=0)
    assert a.acquire()
    a.release()
    b = Lock(r, "released", ttl=10, wait=0)
    assert b.acquire()
    with pytest.raises(LockNotOwned):
        a.release()
    with pytest.raises(LockNotOwned):
        a.extend()
    assert b.owned()
    b.release()
    never = Lock(r, "released")
    with pytest.raises(LockNotOwned):
        never.release()


@pytest.mark.parametrize("how", ["clear", "del"])
def test_lost_lease_is_reported(r: redis.Redis, how: str) -> None:
    plant_sentinel(r)
    lost: list[Lock] = []
    a = Lock(r, "lost", ttl=10, wait=0, on_lost=lost.append)
    b = Lock(r, "lost", ttl=10, wait=0)
    assert a.acquire()
    fence_a = a.fence
    if how == "clear":
        assert scripts.run(r, scripts.CLEAR, a._key_tuple, (2000, "")) == 1
    else:
        r.delete(a.keys.lease)
    assert not a.owned()
    with pytest.raises(LockLost):
        a.extend()
    assert lost == [a]
    assert b.acquire()
    assert b.fence is not None and fence_a is not None and b.fence > fence_a
    # The old holder's release must not touch the new holder's lease.
    with pytest.raises(LockLost):
        a.release()
    assert lost == [a]
    assert b.owned()
    assert r.hget(b.keys.lease, "t") == b.token.encode()  # type: ignore[union-attr]
    b.release()
    audit_keyspace(r)


def test_lost_at_release_calls_on_lost(r: redis.Redis) -> None:
    lost: list[Lock] = []
    a = Lock(r, "lost2", ttl=10, wait=0, on_lost=lost.append)
    assert a.acquire()
    r.delete(a.keys.lease)
    b = Lock(r, "lost2", ttl=10, wait=0)
    assert b.acquire()
    with pytest.raises(LockLost):
        a.release()
    assert lost == [a] and a.lost
    assert b.owned()
    # The handle is usable again, and the lost flag is cleared by the new lease.
    b.release()
    assert a.acquire()
    assert not a.lost
    a.release()


def test_lost_in_context_manager_raises(r: redis.Redis) -> None:
    with pytest.raises(LockLost), Lock(r, "lost3", ttl=10, wait=0) as lock:
        r.delete(lock.keys.lease)


def test_clear_with_wrong_token_does_nothing(r: redis.Redis) -> None:
    a = Lock(r, "clear", ttl=10, wait=0)
    assert a.acquire()
    assert scripts.run(r, scripts.CLEAR, a._key_tuple, (2000, "someone-else")) == 0
    assert a.owned()
    a.release()


# -- fencing ---------------------------------------------------------------------------------
def test_fences_strictly_increase(r: redis.Redis) -> None:
    a = Lock(r, "fence", ttl=10, wait=0)
    b = Lock(r, "fence", ttl=10, wait=0)
    other = Lock(r, "fence-other", ttl=10, wait=0)
    fences = []
    for i in range(200):
        lock = a if i % 2 else b
        assert lock.acquire()
        assert int(r.hget(lock.keys.lease, "f")) == lock.fence  # type: ignore[arg-type]
        fences.append(lock.fence)
        if i % 10 == 0:
            assert other.acquire()
            other.release()
        lock.release()
    assert all(x < y for x, y in itertools.pairwise(fences)), fences


def test_fences_increase_across_expiry_and_state_loss(r: redis.Redis) -> None:
    plant_sentinel(r)
    lock = Lock(r, "fence-expiry", ttl=0.05, wait=0)
    assert lock.acquire()
    first = lock.fence
    wait_until(lambda: not r.exists(lock.keys.lease), timeout=5)
    audit_keyspace(r)
    r.delete(lock.keys.state)
    with pytest.raises(LockLost):
        lock.release()
    assert lock.acquire()
    assert lock.fence is not None and first is not None and lock.fence > first
    second = lock.fence
    lock.release()
    # And with every key of the lock gone.
    r.delete(lock.keys.state, lock.keys.lease, lock.keys.queue)
    assert lock.acquire()
    assert lock.fence > second
    lock.release()


def test_fences_stay_above_the_last_one_when_the_server_clock_is_behind(r: redis.Redis) -> None:
    # A fence is the server clock in microseconds unless the last fence of the
    # name is not below it (a clock stepped back): then it is the last plus one.
    lock = Lock(r, "fence-floor", ttl=10, wait=0)
    assert lock.acquire()
    now_us = lock.fence
    lock.release()
    assert now_us is not None
    ahead = now_us + 10**12  # the last fence, 11 days ahead of the clock
    r.hset(lock.keys.state, "f", str(ahead))
    fences = []
    for _ in range(3):
        assert lock.acquire()
        fences.append(lock.fence)
        lock.release()
    assert fences == [ahead + 1, ahead + 2, ahead + 3]
    # A floor with fewer digits than the clock never wins.
    r.hset(lock.keys.state, "f", "999")
    assert lock.acquire()
    assert lock.fence is not None and now_us < lock.fence < ahead
    lock.release()


def test_fences_increase_across_restart_without_persistence(redis_factory: Any) -> None:
    server = redis_factory(port=free_port(), unix=False, persistence=False).start()
    client = server.client(socket_timeout=5, socket_connect_timeout=5)
    try:
        lock = Lock(client, "fence-restart", ttl=30, wait=0)
        fences = []
        for _ in range(3):
            assert lock.acquire()
            fences.append(lock.fence)
            server.restart()  # SIGKILL, no persistence: every key is gone
            assert client.dbsize() == 0
            with pytest.raises(LockLost):
                lock.release()
        assert lock.acquire()
        fences.append(lock.fence)
        assert int(client.hget(lock.keys.lease, "f")) == lock.fence  # type: ignore[arg-type]
        lock.release()
        assert all(x < y for x, y in itertools.pairwise(fences)), fences
    finally:
        client.close()


# -- waiting -----------------------------------------------------------------------------------
def test_release_hands_over_by_notification(r: redis.Redis) -> None:
    plant_sentinel(r)
    holder = Lock(r, "handoff", ttl=30, wait=0)
    assert holder.acquire()
    got = threading.Event()
    waiter = Lock(r, "handoff", ttl=30, wait=15)
    results: list[bool] = []

    def wait_for_it() -> None:
        results.append(waiter.acquire())
        got.set()
        holder_released.wait(10)

    holder_released = threading.Event()
    t = threading.Thread(target=wait_for_it)
    t.start()
    try:
        wait_until(lambda: r.llen(holder.keys.queue) == 1)
        released_at = time.monotonic()
        holder.release()
        # The holder's lease had 30 s left: only the notification explains this.
        assert got.wait(10)
        assert time.monotonic() - released_at < 2
        assert results == [True]
    finally:
        holder_released.set()
        t.join(10)
    assert r.llen(holder.keys.queue) == 0
    assert r.hget(waiter.keys.lease, "t") == waiter.token.encode()  # type: ignore[union-attr]
    # The waiter's thread ended without releasing: the lease stays until its TTL.
    audit_keyspace(r)


def test_waiters_are_served_in_fifo_order(r: redis.Redis) -> None:
    plant_sentinel(r)
    n = 8
    holder = Lock(r, "fifo", ttl=30, wait=0)
    assert holder.acquire()
    order: list[int] = []
    errors: list[BaseException] = []

    def waiter(k: int) -> None:
        lock = Lock(r, "fifo", ttl=30, wait=30)
        try:
            if lock.acquire():
                order.append(k)
                lock.release()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = []
    for k in range(n):
        t = threading.Thread(target=waiter, args=(k,))
        t.start()
        threads.append(t)
        # Start the next waiter only once this one is in the queue.
        wait_until(lambda k=k: r.llen(holder.keys.queue) == k + 1)  # type: ignore[misc]
    holder.release()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert not errors
    assert order == list(range(n))
    audit_keyspace(r)


def test_hundreds_of_waiters_do_not_exhaust_the_pool(redis_server: Any) -> None:
    pool = redis.BlockingConnectionPool.from_url(
        redis_server.url, max_connections=8, timeout=5, socket_timeout=5
    )
    client = redis.Redis(connection_pool=pool)
    plant_sentinel(client)
    n = 200
    holder = Lock(client, "crowd", ttl=60, wait=0)
    assert holder.acquire()
    got: list[int] = []
    errors: list[BaseException] = []
    mutex = threading.Lock()

    def waiter(k: int) -> None:
        lock = Lock(client, "crowd", ttl=60, wait=90)
        try:
            if lock.acquire():
                with mutex:
                    got.append(k)
                lock.release()
        except BaseException as exc:  # reported below
            with mutex:
                errors.append(exc)

    threads = [threading.Thread(target=waiter, args=(k,)) for k in range(n)]
    try:
        for t in threads:
            t.start()
        wait_until(lambda: client.llen(holder.keys.queue) == n, timeout=60, interval=0.05)
        started = time.monotonic()
        holder.release()
        # Not starved of a connection by the waiters.
        assert time.monotonic() - started < 2
        for t in threads:
            t.join(90)
        assert not any(t.is_alive() for t in threads)
        assert not errors, errors[:3]
        assert sorted(got) == list(range(n))
        assert client.llen(holder.keys.queue) == 0
        audit_keyspace(client)
    finally:
        client.close()


def test_a_waiter_that_gives_up_hands_the_channel_to_the_next(r: redis.Redis) -> None:
    # Waiters read the wake-up channel themselves, one at a time. When the one
    # reading gives up, another must take over: otherwise the next wake-up
    # would wait for nobody, and its waiter would sleep out the holder's
    # whole 30 s lease.
    from django_redislock.core.io.notify import get_notifier

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
    from django_redislock.core.io.notify import get_notifier

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
        wait_until(lambda: any(notifier.channel in v for v in r.hvals(holder.keys.state)), 5)
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
    from django_redislock.core.io.notify import Notifier, Wakeup
    from tests.faults.proxy import FaultProxy

    server = redis_factory(port=free_port(), unix=False).start()
    proxy = FaultProxy(("127.0.0.1", server.port))
    client = redis.Redis.from_url(proxy.url, socket_timeout=5, socket_connect_timeout=5)
    try:
        notifier = Notifier(client, KeySpace("short-sleeper"))
        with proxy.fault(latency=0.05):
            assert notifier.wait(Wakeup(), 0.005) is None
            assert notifier._reconnect.failures == 0 and notifier._retry_at == 0.0
            assert notifier._pending is not None
            assert notifier.wait_ready(2.0)
        assert notifier._reconnect.failures == 0 and notifier._pending is None
    finally:
        client.close()
        proxy.close()


# -- invariant 6 and Redis failures ---------------------------------------------------------------
def test_late_acquire_reply_is_not_an_acquisition(redis_factory: Any) -> None:
    server = redis_factory(port=free_port(), unix=False).start()
    client = server.client(socket_timeout=10, socket_connect_timeout=5)
    try:
        plant_sentinel(client)
        client.ping()  # the connection exists before the pause
        lock = Lock(client, "late", ttl=0.05, wait=0)
        server.pause()
        timer = threading.Timer(0.3, server.resume)
        timer.start()
        try:
            assert lock.acquire() is False
        finally:
            timer.join(5)
            server.resume()
        assert not lock.held and lock.token is None
        assert not client.exists(lock.keys.lease)
        # Nothing prevents a normal acquire afterwards.
        assert lock.acquire(ttl=5)
        lock.release()
        audit_keyspace(client)
    finally:
        client.close()


@pytest.mark.parametrize("wait", [0, 5])
def test_redis_down_is_unavailable_not_busy(redis_factory: Any, wait: float) -> None:
    server = redis_factory(port=free_port(), unix=False).start()
    client = server.client(socket_timeout=1, socket_connect_timeout=1)
    try:
        lock = Lock(client, "down", ttl=5, wait=wait)
        assert lock.acquire()
        server.stop()
        started = time.monotonic()
        with pytest.raises(RedisUnavailable):
            lock.release()
        other = Lock(client, "down", ttl=5, wait=wait)
        with pytest.raises(RedisUnavailable):
            other.acquire()
        with pytest.raises(RedisUnavailable), Lock(client, "down", ttl=5, wait=wait):
            pass  # pragma: no cover
        assert time.monotonic() - started < 5
        # Released state stays coherent: the handle no longer thinks it holds it.
        assert not lock.held
    finally:
        client.close()


def test_redis_error_reply_is_unavailable(r: redis.Redis) -> None:
    lock = Lock(r, "wrongtype", ttl=5, wait=0)
    r.set(lock.keys.lease, "not a hash")
    with pytest.raises(RedisUnavailable, match="error"):
        lock.acquire()


def test_keyspace_prefix_is_used(r: redis.Redis) -> None:
    plant_sentinel(r)
    ks = KeySpace("other:app")
    lock = Lock(r, "pfx", ttl=5, wait=0, keyspace=ks)
    assert lock.acquire()
    assert lock.keys.lease.startswith(b"other:app:L:")
    assert r.exists(lock.keys.lease)
    assert Lock(r, "pfx", ttl=5, wait=0).acquire()  # other namespace, other lock
    audit_keyspace(r, "other:app")
    lock.release()


def test_lost_wakeup_is_recovered_when_the_channel_reconnects(r: redis.Redis) -> None:
    holder = Lock(r, "lost-wakeup", ttl=30, wait=0)
    assert holder.acquire()
    waiter = Lock(r, "lost-wakeup", ttl=30, wait=20)
    result: dict[str, Any] = {}
    done = threading.Event()

    def wait_for_it() -> None:
        result["ok"] = waiter.acquire()
        result["at"] = time.monotonic()
        done.wait(10)
        if result["ok"]:
            waiter.release()

    t = threading.Thread(target=wait_for_it)
    t.start()
    try:
        wait_until(lambda: r.llen(holder.keys.queue) == 1)
        # Drop every wake-up channel, then release at once: the wake-up is
        # published to nobody. The listener's reconnect must make up for it,
        # long before the holder's 30 s lease would have run out.
        assert r.client_kill_filter(_type="pubsub") >= 1
        released_at = time.monotonic()
        holder.release()
        wait_until(lambda: "ok" in result, timeout=15)
        assert result["ok"] is True
        assert result["at"] - released_at < 5
    finally:
        done.set()
        t.join(10)


def test_a_repeated_release_reports_success_never_a_new_holders_lease(r: redis.Redis) -> None:
    # A release whose reply was lost may be sent again (a client retry): the
    # second run must say "released" whatever happened to the lease after
    # (invariant 14), and must never free a later holder.
    lock = Lock(r, "repeat", ttl=5, wait=0)
    assert lock.acquire()
    keys, args = lock._key_tuple, lock._release_args(lock.token)
    assert scripts.run(r, scripts.RELEASE, keys, args) == 1
    assert scripts.run(r, scripts.RELEASE, keys, args) == 1
    other = Lock(r, "repeat", ttl=5, wait=0)
    assert other.acquire()
    assert scripts.run(r, scripts.RELEASE, keys, args) == 1
    assert other.owned()
    other.release()
    assert scripts.run(r, scripts.RELEASE, keys, args) == 1


def test_a_repeated_release_after_the_lease_went_to_a_waiter_is_no_loss(
    r: redis.Redis,
) -> None:
    # The first release handed the lease straight to a queued waiter; the
    # retry of that release (its reply was lost) used to find another holder
    # and report a false LockLost.
    lock = Lock(r, "repeat-handed", ttl=5, wait=0)
    assert lock.acquire()
    keys, args = lock._key_tuple, lock._release_args(lock.token)
    waiter = Lock(r, "repeat-handed", ttl=5, wait=10)
    got = threading.Event()
    queued = threading.Event()

    def wait_for_it() -> None:
        if waiter.acquire():
            got.set()
            queued.wait(10)
            waiter.release()

    t = threading.Thread(target=wait_for_it)
    t.start()
    try:
        wait_until(lambda: r.llen(lock.keys.queue) == 1, timeout=10)
        assert scripts.run(r, scripts.RELEASE, keys, args) == 1  # handed to the waiter
        assert got.wait(10)
        assert scripts.run(r, scripts.RELEASE, keys, args) == 1  # the retry
        assert waiter.owned()
    finally:
        queued.set()
        t.join(10)


def test_owned_works_with_a_decoding_client(redis_server: Any) -> None:
    client = redis_server.client(decode_responses=True, socket_timeout=5)
    try:
        lock = Lock(client, "decoded", ttl=5, wait=0)
        assert lock.acquire()
        assert lock.owned()
        lock.release()
        assert not lock.owned()
    finally:
        client.close()
