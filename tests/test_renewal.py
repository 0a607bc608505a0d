"""The renewal watchdog: keeps leases alive, stops at renew_max, reports loss."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from django_redislock import signals
from django_redislock.core import Lock, LockLost
from django_redislock.locking.factories import get_lock
from tests.helpers_oracles import audit_keyspace, plant_sentinel, wait_until


def _renewals_seen(r: redis.Redis, lock: Lock, seconds: float) -> int:
    """Watch the lease for ``seconds``; count PTTL jumps up (renewals)."""
    renewals = 0
    last = r.pttl(lock.keys.lease)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert r.hget(lock.keys.lease, "t") == lock.token.encode()  # type: ignore[union-attr]
        pttl = r.pttl(lock.keys.lease)
        assert pttl > 0
        if pttl > last:
            renewals += 1
        last = pttl
        time.sleep(0.02)
    return renewals


def test_renewal_keeps_a_short_lease_alive(r: redis.Redis) -> None:
    plant_sentinel(r)
    lock = Lock(r, "renewed", ttl=1, wait=0, renew=True)
    assert lock.acquire()
    assert _renewals_seen(r, lock, 3.2) >= 3
    assert lock.held and lock.owned()
    assert not lock.lost
    lock.release()
    assert not r.exists(lock.keys.lease)
    audit_keyspace(r)


def test_renewal_stops_after_release(r: redis.Redis) -> None:
    lock = Lock(r, "renew-stop", ttl=1, wait=0, renew=True)
    other = Lock(r, "renew-stop", ttl=5, wait=0)
    assert lock.acquire()
    lock.release()
    assert other.acquire()
    # The released handle's watchdog entry must not touch the new lease.
    time.sleep(0.5)
    assert other.owned()
    assert not lock.lost
    other.release()


def test_renew_max_stops_renewal_and_the_lease_expires(r: redis.Redis) -> None:
    lost: list[Lock] = []
    lock = Lock(r, "renew-max", ttl=1, wait=0, renew=True, renew_max=2, on_lost=lost.append)
    acquired = time.monotonic()
    assert lock.acquire()
    wait_until(lambda: not r.exists(lock.keys.lease), timeout=10, interval=0.02)
    # It was renewed past its TTL, then left to expire.
    assert time.monotonic() - acquired > 1.5
    with pytest.raises(LockLost):
        lock.release()
    assert lost == [lock]


def test_deleted_key_while_renewing_is_reported(r: redis.Redis) -> None:
    lost_event = threading.Event()
    lost: list[Lock] = []
    signalled: list[dict[str, Any]] = []

    def on_lost(lock: Lock) -> None:
        lost.append(lock)
        lost_event.set()

    def receiver(sender: Any, **kwargs: Any) -> None:
        signalled.append(kwargs)

    signals.lock_lost.connect(receiver)
    try:
        lock = get_lock("renew-lost", timeout=1, wait=0, renew=True, on_lost=on_lost)
        assert lock.acquire()
        fence = lock.fence
        _renewals_seen(lock.client, lock, 0.5)
        r.delete(lock.keys.lease)
        assert lost_event.wait(5)
        assert lost == [lock] and lock.lost
        assert len(signalled) == 1
        assert signalled[0]["name"] == "renew-lost"
        assert signalled[0]["fence"] == fence
        assert "renewal" in signalled[0]["reason"]
        with pytest.raises(LockLost):
            lock.release()
        # Reported once, not again at release.
        assert len(lost) == 1 and len(signalled) == 1
    finally:
        signals.lock_lost.disconnect(receiver)


def test_many_renewing_locks(r: redis.Redis) -> None:
    locks = [Lock(r, f"many-{i}", ttl=0.6, wait=0, renew=True) for i in range(20)]
    for lock in locks:
        assert lock.acquire()
    time.sleep(1.5)
    for lock in locks:
        assert lock.owned(), lock
        assert not lock.lost
    for lock in locks:
        lock.release()


class _Tick:
    """A renewable that records its renewals and asks for no more."""

    def __init__(self) -> None:
        self.renewed = threading.Event()

    def _renew_once(self) -> float | None:
        self.renewed.set()
        return None


class _CountingCondition(threading.Condition):
    def __init__(self) -> None:
        super().__init__()
        self.notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)


def test_a_later_renewal_does_not_wake_the_watchdog() -> None:
    """Each acquire adds a renewal; only one due before the thread's next wake-up
    may wake it (a wake-up takes the GIL from the holder in its critical section)."""
    from django_redislock.core.io.renewal import Watchdog
    from django_redislock.core.io.scheduler import Scheduler

    on = Scheduler()
    on._cond = _CountingCondition()
    dog = Watchdog(on)
    first, later, middle, sooner, after = _Tick(), _Tick(), _Tick(), _Tick(), _Tick()
    dog.add(first, 0.3)
    assert on._cond.notified == 1  # the thread has nothing earlier to sleep until
    dog.add(later, 60)
    dog.discard(first)  # a released lock: its entry stays in the heap, inactive
    dog.add(middle, 30)
    assert on._cond.notified == 1
    dog.add(sooner, 0.05)
    assert on._cond.notified == 2
    assert sooner.renewed.wait(10)
    dog.add(after, 0.4)  # past the discarded entry's time
    assert after.renewed.wait(10)
    assert not first.renewed.is_set()  # discarded: never renewed
    assert not later.renewed.is_set() and not middle.renewed.is_set()
    dog.discard(later)
    dog.discard(middle)
