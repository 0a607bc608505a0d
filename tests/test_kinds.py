"""What every kind of lock does alike, one scenario for all of them.

A kind: a lock in the first-come order, a lock in the barging order
(``fair=False``), a semaphore of one permit, a read-write lock (a writer
holds, a reader asks) and a multi-name lock (its busy name is the one asked
for). Each scenario runs for every kind on both drivers (``drive``,
tests/drive.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import redis

from django_redislock.core import KeySpace, LockNotAcquired, ReplicationTimeout
from tests.drive import Drive

KS = KeySpace()

# What a lock's state hash keeps when nobody waits: the last fence, the queue
# hint, the name, tokens given back, the barging count and wake-up, the
# memory of losses (lua/_prelude.lua). Anything else is a waiter's.
LOCK_BOOKKEEPING = {b"f", b"q", b"d", b"n", b"b", b"w", b"e", b"h", b"u"}


class Kind(NamedTuple):
    holder: Callable[..., Any]  # (drive, **options) -> a handle that takes the name
    asker: Callable[..., Any]  # (drive, **options) -> a handle that asks for it after
    keys: Any  # the busy name's keys
    held: Callable[[redis.Redis, Any], int]  # how many hold the busy name, in Redis
    waiting: Callable[[bytes], bool]  # whether a state field is a waiter's


def _lock_held(r: redis.Redis, keys: Any) -> int:
    return int(r.exists(keys.lease))


def _zset_held(r: redis.Redis, keys: Any) -> int:
    return int(r.zcard(keys.lease))


KINDS = {
    "lock": Kind(
        lambda d, **kw: d.Lock(d.client, "k", **kw),
        lambda d, **kw: d.Lock(d.client, "k", **kw),
        KS.lock("k"),
        _lock_held,
        lambda field: field not in LOCK_BOOKKEEPING,
    ),
    "barging": Kind(
        lambda d, **kw: d.Lock(d.client, "k", fair=False, **kw),
        lambda d, **kw: d.Lock(d.client, "k", fair=False, **kw),
        KS.lock("k"),
        _lock_held,
        lambda field: field not in LOCK_BOOKKEEPING,
    ),
    "semaphore": Kind(
        lambda d, **kw: d.Semaphore(d.client, "k", 1, **kw),
        lambda d, **kw: d.Semaphore(d.client, "k", 1, **kw),
        KS.semaphore("k"),
        _zset_held,
        lambda field: field.startswith(b"w:"),
    ),
    "rwlock": Kind(
        lambda d, **kw: d.ReadWriteLock(d.client, "k", "write", **kw),
        lambda d, **kw: d.ReadWriteLock(d.client, "k", "read", **kw),
        KS.rwlock("k"),
        _zset_held,
        lambda field: field.startswith((b"w:", b"r:")),
    ),
    "multi": Kind(
        lambda d, **kw: d.Lock(d.client, "k", **kw),
        lambda d, **kw: d.MultiLock(d.client, ["j", "k"], **kw),
        KS.lock("k"),
        _lock_held,
        lambda field: field not in LOCK_BOOKKEEPING,
    ),
}


@pytest.fixture(params=list(KINDS))
def k(request: pytest.FixtureRequest) -> Kind:
    """Each kind in turn."""
    return KINDS[request.param]


async def test_a_waiter_that_gives_up_leaves_the_queue(
    drive: Drive, r: redis.Redis, k: Kind
) -> None:
    holder = k.holder(drive, ttl=30, wait=0)
    assert await drive(holder.acquire())
    asker = k.asker(drive, ttl=30, wait=0.3)
    assert await drive(asker.acquire()) is False
    assert r.llen(k.keys.queue) == 0
    assert [f for f in r.hkeys(k.keys.state) if k.waiting(f)] == []
    await drive(holder.release())
    assert not r.hexists(k.keys.state, "q")
    assert k.held(r, k.keys) == 0


async def test_a_busy_context_manager_carries_retry_after(
    drive: Drive, r: redis.Redis, k: Kind
) -> None:
    holder = k.holder(drive, ttl=20, wait=0)
    async with drive.holding(holder):
        with pytest.raises(LockNotAcquired) as info:
            async with drive.holding(k.asker(drive, wait=0)):
                pass  # pragma: no cover
        assert info.value.retry_after is not None and 0 < info.value.retry_after <= 20
    assert k.held(r, k.keys) == 0


async def test_an_unacknowledged_grant_is_given_back(drive: Drive, r: redis.Redis, k: Kind) -> None:
    # The test server has no replica: nobody acknowledges the grant.
    asker = k.asker(drive, ttl=30, wait=0, replicas=1, replicas_timeout=0.05)
    with pytest.raises(ReplicationTimeout):
        await drive(asker.acquire())
    assert not asker.held and k.held(r, k.keys) == 0
    plain = k.asker(drive, ttl=30, wait=0)
    assert await drive(plain.acquire())
    await drive(plain.release())
