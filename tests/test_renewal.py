"""The renewal watchdog: keeps leases alive, stops at renew_max, reports loss."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from django_redislock import signals
from django_redislock.core import LockLost
from django_redislock.locking.factories import get_async_lock, get_lock
from tests.drive import Drive
from tests.helpers_oracles import audit_keyspace, plant_sentinel
from tests.test_decorators import close_async_clients


async def _renewals_seen(drive: Drive, r: redis.Redis, lock: Any, seconds: float) -> int:
    """Watch the lease for ``seconds``; count PTTL jumps up (renewals)."""
    renewals = 0
    last = r.pttl(lock.keys.lease)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert r.hget(lock.keys.lease, "t") == lock.token.encode()
        pttl = r.pttl(lock.keys.lease)
        assert pttl > 0
        if pttl > last:
            renewals += 1
        last = pttl
        await drive.sleep(0.02)
    return renewals


async def test_renewal_keeps_a_short_lease_alive(drive: Drive, r: redis.Redis) -> None:
    plant_sentinel(r)
    lock = drive.Lock(drive.client, "renewed", ttl=1, wait=0, renew=True)
    assert await drive(lock.acquire())
    assert await _renewals_seen(drive, r, lock, 3.2) >= 3
    assert lock.held and await drive(lock.owned())
    assert not lock.lost
    await drive(lock.release())
    assert not r.exists(lock.keys.lease)
    audit_keyspace(r)


async def test_renewal_stops_after_release(drive: Drive) -> None:
    lock = drive.Lock(drive.client, "renew-stop", ttl=1, wait=0, renew=True)
    other = drive.Lock(drive.client, "renew-stop", ttl=5, wait=0)
    assert await drive(lock.acquire())
    await drive(lock.release())
    assert await drive(other.acquire())
    # The released handle's watchdog entry must not touch the new lease.
    await drive.sleep(0.5)
    assert await drive(other.owned())
    assert not lock.lost
    await drive(other.release())


async def test_renew_max_stops_renewal_and_the_lease_expires(drive: Drive, r: redis.Redis) -> None:
    lost: list[Any] = []
    lock = drive.Lock(
        drive.client, "renew-max", ttl=1, wait=0, renew=True, renew_max=2, on_lost=lost.append
    )
    acquired = time.monotonic()
    assert await drive(lock.acquire())
    await drive.until(lambda: not r.exists(lock.keys.lease), timeout=10, interval=0.02)
    # It was renewed past its TTL, then left to expire.
    assert time.monotonic() - acquired > 1.5
    with pytest.raises(LockLost):
        await drive(lock.release())
    assert lost == [lock]


async def test_deleted_key_while_renewing_is_reported(drive: Drive, r: redis.Redis) -> None:
    lost_event = drive.event()
    lost: list[Any] = []
    signalled: list[dict[str, Any]] = []

    def on_lost(lock: Any) -> None:
        lost.append(lock)
        lost_event.set()

    def receiver(sender: Any, **kwargs: Any) -> None:
        signalled.append(kwargs)

    signals.lock_lost.connect(receiver)
    make = get_async_lock if drive.is_async else get_lock
    try:
        lock = make("renew-lost", timeout=1, wait=0, renew=True, on_lost=on_lost)
        assert await drive(lock.acquire())
        fence = lock.fence
        await _renewals_seen(drive, r, lock, 0.5)
        r.delete(lock.keys.lease)
        await lost_event.wait(5)
        assert lost == [lock] and lock.lost
        assert len(signalled) == 1
        assert signalled[0]["name"] == "renew-lost"
        assert signalled[0]["fence"] == fence
        assert "renewal" in signalled[0]["reason"]
        with pytest.raises(LockLost):
            await drive(lock.release())
        # Reported once, not again at release.
        assert len(lost) == 1 and len(signalled) == 1
    finally:
        signals.lock_lost.disconnect(receiver)
        if drive.is_async:
            await close_async_clients()


async def test_many_renewing_locks(drive: Drive) -> None:
    locks = [drive.Lock(drive.client, f"many-{i}", ttl=0.6, wait=0, renew=True) for i in range(20)]
    for lock in locks:
        assert await drive(lock.acquire())
    await drive.sleep(1.5)
    for lock in locks:
        assert await drive(lock.owned()), lock
        assert not lock.lost
    for lock in locks:
        await drive(lock.release())


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
    # ``first`` is due late enough that the thread still sleeps until it
    # while the next lines run, even on a loaded host (were it popped, the
    # next entry added would be the earliest and rightly wake the thread).
    dog.add(first, 2.0)
    assert on._cond.notified == 1  # the thread has nothing earlier to sleep until
    dog.add(later, 60)
    dog.discard(first)  # a released lock: its entry stays in the heap, inactive
    dog.add(middle, 30)
    assert on._cond.notified == 1
    dog.add(sooner, 0.05)
    assert on._cond.notified == 2
    assert sooner.renewed.wait(10)
    dog.add(after, 2.1)  # past the discarded entry's time
    assert after.renewed.wait(10)
    assert not first.renewed.is_set()  # discarded: never renewed
    assert not later.renewed.is_set() and not middle.renewed.is_set()
    dog.discard(later)
    dog.discard(middle)
