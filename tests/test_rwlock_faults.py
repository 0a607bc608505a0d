"""Read-write locks under faults: late and lost replies, broken connections, a frozen Redis.

The same faults as the lock's scenarios (``tests/faults``), through the same
proxy and the library's own client settings. Whatever happens, an acquire
either holds or leaves nothing behind, a release whose reply was lost never
reports a false loss, and every call ends within its bound.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator

import pytest
import redis

from django_redislock.core import KeySpace, ReadWriteLock
from django_redislock.core.exceptions import LockLost, RedisUnavailable
from tests.faults.harness import ServerPool, bounded_client, freeze_bound
from tests.helpers_oracles import audit_keyspace, plant_sentinel, wait_until

KS = KeySpace()
MODES = ("read", "write")


@pytest.fixture
def pool() -> Iterator[ServerPool]:
    with ServerPool() as servers:
        yield servers


def turns(admin: redis.Redis, name: str) -> int:
    """Holders and reservations of ``name`` still in Redis."""
    return int(admin.zcard(KS.rwlock(name).lease))


@pytest.mark.parametrize("mode", MODES)
def test_reply_later_than_the_ttl_is_not_an_acquisition(pool: ServerPool, mode: str) -> None:
    server = pool.server()
    admin = server.admin()
    plant_sentinel(admin)
    proxy = pool.proxy(server)
    client = bounded_client(proxy.url, timeout=3.0)
    rng = random.Random(7)
    for n in range(3):
        name = f"late:{n}"
        ttl = rng.uniform(0.15, 0.3)
        lock = ReadWriteLock(client, name, mode, ttl=ttl, wait=0)  # type: ignore[arg-type]
        client.ping()
        with proxy.fault(latency=ttl + 0.1, direction="reply"):
            assert not lock.acquire()
        # The late grant is given back (after its reply, off the caller's path).
        wait_until(lambda name=name: turns(admin, name) == 0, 2.0)
        other = ReadWriteLock(admin, name, "write", ttl=1, wait=0)
        assert other.acquire()
        other.release()
    client.close()
    audit_keyspace(admin)


@pytest.mark.parametrize("mode", MODES)
def test_lost_replies_leave_nothing_and_report_no_false_loss(pool: ServerPool, mode: str) -> None:
    server = pool.server()
    admin = server.admin()
    plant_sentinel(admin)
    proxy = pool.proxy(server)
    client = bounded_client(proxy.url, timeout=0.5)
    for n in range(3):
        # The acquire ran, its reply was lost: held, or nothing left granted.
        name = f"drop-acquire:{n}"
        lock = ReadWriteLock(client, name, mode, ttl=5, wait=0)  # type: ignore[arg-type]
        proxy.drop_replies = 1
        try:
            acquired = lock.acquire()
        except RedisUnavailable:
            acquired = False
        proxy.heal()
        if acquired:
            assert lock.owned()
            lock.release()
        wait_until(lambda name=name: turns(admin, name) == 0, 2.0)
        # The release ran, its reply was lost: the retry reports success.
        name = f"drop-release:{n}"
        lock = ReadWriteLock(client, name, mode, ttl=5, wait=0)  # type: ignore[arg-type]
        assert lock.acquire()
        proxy.drop_replies = 1
        # Told the truth: released, or unknown (the give-back goes on); never LockLost.
        with contextlib.suppress(RedisUnavailable):
            lock.release()
        proxy.heal()
        wait_until(lambda name=name: turns(admin, name) == 0, 2.0)
        # Frames cut into pieces, and a connection reset under a holder.
        with proxy.fault(split=3):
            lock = ReadWriteLock(client, f"split:{n}", mode, ttl=5)  # type: ignore[arg-type]
            assert lock.acquire() and lock.owned()
            lock.extend()
            lock.release()
        lock = ReadWriteLock(client, f"reset:{n}", mode, ttl=5)  # type: ignore[arg-type]
        assert lock.acquire()
        proxy.reset()
        lock.extend()
        lock.release()
    client.close()
    audit_keyspace(admin)


def test_frozen_redis_every_call_bounded(pool: ServerPool) -> None:
    server = pool.server()
    timeout = 0.3
    client = bounded_client(server.url, timeout=timeout)
    holder = ReadWriteLock(client, "frozen", "read", ttl=5, wait=0)
    assert holder.acquire()
    with server.paused():
        for mode in MODES:
            lock = ReadWriteLock(client, "frozen", mode, ttl=5, wait=0)  # type: ignore[arg-type]
            started = time.monotonic()
            with pytest.raises(RedisUnavailable):
                lock.acquire()
            assert time.monotonic() - started < freeze_bound(timeout) + 0.5
    client.close()


@pytest.mark.parametrize("mode", MODES)
def test_redis_restarted_empty_the_holder_learns_its_loss(pool: ServerPool, mode: str) -> None:
    server = pool.server(persistence=False)
    client = bounded_client(server.url, timeout=1.0)
    first = ReadWriteLock(client, "restart", mode, ttl=30, wait=0)  # type: ignore[arg-type]
    assert first.acquire()
    server.restart(kill=True)
    writer = ReadWriteLock(client, "restart", "write", ttl=30, wait=0)
    assert writer.acquire()  # the documented limit: Redis forgot the holder
    if mode == "write":
        assert writer.fence is not None and first.fence is not None
        assert writer.fence > first.fence  # the fence still guards the writes
    with pytest.raises(LockLost):
        first.extend()
    with pytest.raises(LockLost):
        first.release()
    assert writer.owned()
    writer.release()
    client.close()
