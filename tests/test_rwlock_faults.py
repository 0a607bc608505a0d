"""Read-write locks under faults: late and lost replies, broken connections, a frozen Redis.

The same faults as the lock's scenarios (``tests/faults``), through the same
proxy and the library's own client settings, on both drivers (``drive``,
tests/drive.py). Whatever happens, an acquire
either holds or leaves nothing behind, a release whose reply was lost never
reports a false loss, and every call ends within its bound.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_redislock.core import KeySpace, ReadWriteLock
from django_redislock.core.exceptions import LockLost, RedisUnavailable
from django_redislock.core.io import breaker
from tests.drive import Drive
from tests.faults.harness import ServerPool, bounded_client_for, freeze_bound
from tests.helpers_oracles import audit_keyspace, plant_sentinel

KS = KeySpace()
MODES = ("read", "write")


@pytest.fixture
def pool() -> Iterator[ServerPool]:
    with ServerPool() as servers:
        yield servers


def asyncio_falls_short(request: pytest.FixtureRequest, drive: Drive, why: str) -> None:
    """Where the asyncio driver does not yet do what the sync one does: an
    expected failure, strict, so that the fix shows (and this mark goes)."""
    if drive.is_async:
        request.applymarker(pytest.mark.xfail(reason=why, strict=True))


def turns(admin: redis.Redis, name: str) -> int:
    """Holders and reservations of ``name`` still in Redis."""
    return int(admin.zcard(KS.rwlock(name).lease))


def behind_a_proxy(
    drive: Drive, pool: ServerPool, *, timeout: float
) -> tuple[redis.Redis, Any, Any]:
    """A private server's admin client (sentinel planted), a fault proxy in
    front of it, and the driver's bounded client through the proxy."""
    server = pool.server()
    admin = server.admin()
    plant_sentinel(admin)
    proxy = pool.proxy(server)
    return admin, proxy, bounded_client_for(drive, proxy.url, timeout=timeout)


@pytest.mark.parametrize("mode", MODES)
async def test_reply_later_than_the_ttl_is_not_an_acquisition(
    drive: Drive, pool: ServerPool, mode: str
) -> None:
    admin, proxy, client = behind_a_proxy(drive, pool, timeout=3.0)
    rng = random.Random(7)
    for n in range(3):
        name = f"late:{n}"
        ttl = rng.uniform(0.15, 0.3)
        lock = drive.ReadWriteLock(client, name, mode, ttl=ttl, wait=0)
        await drive(client.ping())
        with proxy.fault(latency=ttl + 0.1, direction="reply"):
            assert not await drive(lock.acquire())
        # The late grant is given back (after its reply, off the caller's path).
        await drive.until(lambda name=name: turns(admin, name) == 0, 2.0)
        other = ReadWriteLock(admin, name, "write", ttl=1, wait=0)
        assert other.acquire()
        other.release()
    await drive.close(client)
    audit_keyspace(admin)


@pytest.fixture
def breaker_off() -> Iterator[None]:
    """A dropped reply is a timeout, which opens its pool's breaker for a window
    (tests/test_breaker.py): a test of what each call tells its caller, one
    right after another, turns it off."""
    previous = breaker.set_window(0)
    yield
    breaker.set_window(previous)


@pytest.mark.parametrize("mode", MODES)
async def test_lost_replies_leave_nothing_and_report_no_false_loss(
    drive: Drive, pool: ServerPool, mode: str, request: pytest.FixtureRequest, breaker_off: None
) -> None:
    admin, proxy, client = behind_a_proxy(drive, pool, timeout=0.5)
    for n in range(3):
        # The acquire ran, its reply was lost: held, or nothing left granted.
        name = f"drop-acquire:{n}"
        lock = drive.ReadWriteLock(client, name, mode, ttl=5, wait=0)
        proxy.drop_replies = 1
        try:
            acquired = await drive(lock.acquire())
        except RedisUnavailable:
            acquired = False
        proxy.heal()
        if acquired:
            assert await drive(lock.owned())
            await drive(lock.release())
        await drive.until(lambda name=name: turns(admin, name) == 0, 2.0)
        # The release ran, its reply was lost: the retry reports success.
        name = f"drop-release:{n}"
        lock = drive.ReadWriteLock(client, name, mode, ttl=5, wait=0)
        assert await drive(lock.acquire())
        proxy.drop_replies = 1
        # Told the truth: released, or unknown (the give-back goes on); never LockLost.
        with contextlib.suppress(RedisUnavailable):
            await drive(lock.release())
        proxy.heal()
        await drive.until(lambda name=name: turns(admin, name) == 0, 2.0)
        # Frames cut into pieces, and a connection reset under a holder.
        with proxy.fault(split=3):
            lock = drive.ReadWriteLock(client, f"split:{n}", mode, ttl=5)
            assert await drive(lock.acquire()) and await drive(lock.owned())
            await drive(lock.extend())
            await drive(lock.release())
        lock = drive.ReadWriteLock(client, f"reset:{n}", mode, ttl=5)
        assert await drive(lock.acquire())
        proxy.reset()
        await drive(lock.extend())
        await drive(lock.release())
    await drive.close(client)
    audit_keyspace(admin)


async def test_frozen_redis_every_call_bounded(drive: Drive, pool: ServerPool) -> None:
    server = pool.server()
    timeout = 0.3
    client = bounded_client_for(drive, server.url, timeout=timeout)
    holder = drive.ReadWriteLock(client, "frozen", "read", ttl=5, wait=0)
    assert await drive(holder.acquire())
    with server.paused():
        for mode in MODES:
            lock = drive.ReadWriteLock(client, "frozen", mode, ttl=5, wait=0)
            started = time.monotonic()
            with pytest.raises(RedisUnavailable):
                await drive(lock.acquire())
            assert time.monotonic() - started < freeze_bound(timeout) + 0.5
    await drive.close(client)


@pytest.mark.parametrize("mode", MODES)
async def test_redis_restarted_empty_the_holder_learns_its_loss(
    drive: Drive, pool: ServerPool, mode: str, request: pytest.FixtureRequest
) -> None:
    server = pool.server(persistence=False)
    client = bounded_client_for(drive, server.url, timeout=1.0)
    first = drive.ReadWriteLock(client, "restart", mode, ttl=30, wait=0)
    assert await drive(first.acquire())
    server.restart(kill=True)
    writer = drive.ReadWriteLock(client, "restart", "write", ttl=30, wait=0)
    assert await drive(writer.acquire())  # the documented limit: Redis forgot the holder
    if mode == "write":
        assert writer.fence is not None and first.fence is not None
        assert writer.fence > first.fence  # the fence still guards the writes
    with pytest.raises(LockLost):
        await drive(first.extend())
    with pytest.raises(LockLost):
        await drive(first.release())
    assert await drive(writer.owned())
    await drive(writer.release())
    await drive.close(client)


@pytest.mark.parametrize("mode", MODES)
async def test_a_give_back_that_overtook_the_late_acquire_is_sent_again(
    drive: Drive, pool: ServerPool, mode: str
) -> None:
    admin, proxy, client = behind_a_proxy(drive, pool, timeout=0.3)
    warm = drive.ReadWriteLock(client, f"warm:{mode}", mode, ttl=30, wait=0)
    assert await drive(warm.acquire())  # the scripts are loaded, a connection idle
    await drive(warm.release())
    name = f"overtaken:{mode}"
    lock = drive.ReadWriteLock(client, name, mode, ttl=30, wait=0)
    # The acquire's request is held back in the proxy past the caller's
    # timeout; then the road clears, so the give-back (on a connection of
    # its own) reaches Redis before the acquire does, and the acquire grants
    # a turn after it.
    proxy.latency, proxy.direction = 1.0, "request"
    with pytest.raises(RedisUnavailable):
        await drive(lock.acquire())
    proxy.heal()
    state = KS.rwlock(name).state
    await drive.until(lambda: admin.hexists(state, "i"), 5.0)  # the late acquire ran
    # Its reply is read by the drain, and the give-back goes again: the turn
    # is free long before its 30 s TTL.
    await drive.until(lambda: turns(admin, name) == 0, 3.0)
    await drive.close(client)
    audit_keyspace(admin)
