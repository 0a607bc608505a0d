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

# Renewal runs every third of the lease: a lease of 1.5 s leaves a renewal 1 s
# to come in on a loaded host (a shorter one lost leases there).
TTL = 1.5


async def _watch_renewals(drive: Drive, r: redis.Redis, lock: Any, renewals: int) -> None:
    """Watch the lease until ``renewals`` PTTL jumps up (renewals) are seen;
    at every look it is still there, held by ``lock``."""
    seen = 0
    last = r.pttl(lock.keys.lease)
    deadline = time.monotonic() + 60  # bounds a failing test only
    while seen < renewals:
        assert time.monotonic() < deadline, f"{seen} renewals seen"
        assert r.hget(lock.keys.lease, "t") == lock.token.encode()
        pttl = r.pttl(lock.keys.lease)
        assert pttl > 0
        if pttl > last:
            seen += 1
        last = pttl
        await drive.sleep(0.02)


async def test_renewal_keeps_a_short_lease_alive(drive: Drive, r: redis.Redis) -> None:
    plant_sentinel(r)
    lock = drive.Lock(drive.client, "renewed", ttl=TTL, wait=0, renew=True)
    acquired = time.monotonic()
    assert await drive(lock.acquire())
    await _watch_renewals(drive, r, lock, 3)
    await drive.until(lambda: time.monotonic() > acquired + 1.5 * TTL, timeout=10)
    await _watch_renewals(drive, r, lock, 1)  # past its first lease, and still renewed
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
        drive.client,
        "renew-max",
        ttl=TTL,
        wait=0,
        renew=True,
        renew_max=2 * TTL,
        on_lost=lost.append,
    )
    acquired = time.monotonic()
    assert await drive(lock.acquire())
    await drive.until(lambda: not r.exists(lock.keys.lease), timeout=20, interval=0.02)
    # It was renewed past its TTL, then left to expire.
    assert time.monotonic() - acquired > 1.5 * TTL
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
        lock = make("renew-lost", timeout=TTL, wait=0, renew=True, on_lost=on_lost)
        assert await drive(lock.acquire())
        fence = lock.fence
        await _watch_renewals(drive, r, lock, 1)
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
    # Twenty renewals share one client and, for asyncio, one event loop: on a
    # loaded host they come in later than one does, so twice the lease.
    ttl = 2 * TTL
    locks = [drive.Lock(drive.client, f"many-{i}", ttl=ttl, wait=0, renew=True) for i in range(20)]
    for lock in locks:
        assert await drive(lock.acquire())
    await drive.sleep(1.5 * ttl)  # every lease renewed past its first end
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
        self.slept = threading.Event()  # the thread has looked at the heap and sleeps

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)

    def wait(self, timeout: float | None = None) -> bool:
        self.slept.set()
        return super().wait(timeout)


def test_a_later_renewal_does_not_wake_the_watchdog() -> None:
    """Each acquire adds a renewal; only one due before the thread's next wake-up
    may wake it (a wake-up takes the GIL from the holder in its critical section)."""
    from django_redislock.core.io.background import Scheduler, Watchdog

    on = Scheduler()
    on._cond = _CountingCondition()
    dog = Watchdog(on)
    first, later, middle, sooner, after = _Tick(), _Tick(), _Tick(), _Tick(), _Tick()
    # ``first`` is due late enough that the thread still sleeps until it
    # while the next lines run, even on a loaded host (were it popped, the
    # next entry added would be the earliest and rightly wake the thread).
    dog.add(first, 2.0)
    assert on._cond.notified == 1  # the thread has nothing earlier to sleep until
    # The thread, started by that add, sleeps until ``first`` from here on: had
    # it started only after the discard below, it would drop ``first`` and
    # sleep until ``later``, and ``middle`` would rightly wake it.
    assert on._cond.slept.wait(10)
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
