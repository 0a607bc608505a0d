"""``adopt`` and ``detach`` in both drivers: a lease handed from one handle to another.

Each scenario takes ``drive`` and runs on ``Lock`` and ``AsyncLock`` (tests/drive.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from django_redislock.core import LockError, LockLost
from tests.drive import Drive


def _pttl(r: redis.Redis, lock: Any) -> int:
    return int(r.pttl(lock.keys.lease))


async def test_adopt_takes_over_the_lease(drive: Drive, r: redis.Redis) -> None:
    first = drive.Lock(drive.client, "handed", ttl=30, wait=0)
    assert await drive(first.acquire())
    token, fence = first.token, first.fence
    assert token is not None and fence is not None

    second = drive.Lock(drive.client, "handed", ttl=5, wait=0)
    assert await drive(second.adopt(token, fence, ttl=60))
    assert second.held and second.token == token and second.fence == fence
    assert _pttl(r, second) > 30_000  # reset to the adopter's ttl
    assert await drive(second.owned())
    await drive(second.release())
    assert not r.exists(second.keys.lease)
    assert await drive(drive.Lock(drive.client, "handed", wait=0).acquire())


async def test_adopt_refuses_a_token_that_no_longer_holds(drive: Drive) -> None:
    first = drive.Lock(drive.client, "stale", ttl=30, wait=0)
    assert await drive(first.acquire())
    token, fence = first.token, first.fence
    assert token is not None and fence is not None
    await drive(first.release())
    other = drive.Lock(drive.client, "stale", ttl=30, wait=0)
    assert await drive(other.acquire())

    late = drive.Lock(drive.client, "stale", ttl=30, wait=0)
    assert not await drive(late.adopt(token, fence))
    assert late.token is None and not late.held
    # Nothing of the new holder's was touched, and the handle is reusable.
    assert await drive(other.owned())
    await drive(other.release())
    assert await drive(late.acquire())
    await drive(late.release())


async def test_detach_hands_the_lease_on(drive: Drive, r: redis.Redis) -> None:
    lock = drive.Lock(drive.client, "detached", ttl=30, wait=0, renew=True)
    assert await drive(lock.acquire())
    fence = lock.fence
    token = await drive(lock.detach(ttl=90))
    assert lock.token is None and not lock.held and lock._renewer is None
    assert 60_000 < _pttl(r, lock) <= 90_000
    # Still held in Redis, by nobody in this process.
    assert not await drive(drive.Lock(drive.client, "detached", wait=0).acquire())
    assert fence is not None
    heir = drive.Lock(drive.client, "detached", ttl=30, wait=0)
    assert await drive(heir.adopt(token, fence))
    await drive(heir.release())
    # The detached handle is free for another acquisition.
    assert await drive(lock.acquire())
    await drive(lock.release())


async def test_detach_of_a_lost_lease_raises(drive: Drive, r: redis.Redis) -> None:
    lock = drive.Lock(drive.client, "lost", ttl=30, wait=0)
    assert await drive(lock.acquire())
    r.delete(lock.keys.lease)
    with pytest.raises(LockLost):
        await drive(lock.detach())
    assert lock.token is None
    assert await drive(lock.acquire())
    await drive(lock.release())


async def test_adopt_checks_its_arguments(drive: Drive) -> None:
    lock = drive.Lock(drive.client, "args", wait=0)
    with pytest.raises(ValueError, match="16 hex digits"):
        await drive(lock.adopt("not-a-token", 1))
    with pytest.raises(ValueError, match="16 hex digits"):
        await drive(lock.adopt("ABCDEF0123456789", 1))
    with pytest.raises(ValueError, match="fence"):
        await drive(lock.adopt("0123456789abcdef", "7"))


async def test_adopt_on_a_handle_already_held(drive: Drive) -> None:
    lock = drive.Lock(drive.client, "busy-handle", ttl=30, wait=0)
    assert await drive(lock.acquire())
    assert lock.token is not None and lock.fence is not None
    with pytest.raises(LockError, match="not reentrant"):
        await drive(lock.adopt(lock.token, lock.fence))
    with pytest.raises(LockError, match=f"another {drive.party}"):
        await drive.join(drive.spawn(lambda: drive(lock.adopt(lock.token, lock.fence))))
    await drive(lock.release())
