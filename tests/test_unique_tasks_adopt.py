"""``adopt`` and ``detach`` in both drivers: a lease handed from one handle to another."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
import redis.asyncio

from django_redislock.core import AsyncLock, Lock, LockError, LockLost


@pytest.fixture
async def ar(redis_server: Any) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=5)
    yield client
    await client.aclose()


def _pttl(r: redis.Redis, lock: Lock | AsyncLock) -> int:
    return int(r.pttl(lock.keys.lease))


# -- sync -----------------------------------------------------------------------------------
def test_adopt_takes_over_the_lease(r: redis.Redis) -> None:
    first = Lock(r, "handed", ttl=30, wait=0)
    assert first.acquire()
    token, fence = first.token, first.fence
    assert token is not None and fence is not None

    second = Lock(r, "handed", ttl=5, wait=0)
    assert second.adopt(token, fence, ttl=60)
    assert second.held and second.token == token and second.fence == fence
    assert _pttl(r, second) > 30_000  # reset to the adopter's ttl
    assert second.owned()
    second.release()
    assert not r.exists(second.keys.lease)
    assert Lock(r, "handed", wait=0).acquire()


def test_adopt_refuses_a_token_that_no_longer_holds(r: redis.Redis) -> None:
    first = Lock(r, "stale", ttl=30, wait=0)
    assert first.acquire()
    token, fence = first.token, first.fence
    assert token is not None and fence is not None
    first.release()
    other = Lock(r, "stale", ttl=30, wait=0)
    assert other.acquire()

    late = Lock(r, "stale", ttl=30, wait=0)
    assert not late.adopt(token, fence)
    assert late.token is None and not late.held
    # Nothing of the new holder's was touched, and the handle is reusable.
    assert other.owned()
    other.release()
    assert late.acquire()
    late.release()


def test_detach_hands_the_lease_on(r: redis.Redis) -> None:
    lock = Lock(r, "detached", ttl=30, wait=0, renew=True)
    assert lock.acquire()
    fence = lock.fence
    token = lock.detach(ttl=90)
    assert lock.token is None and not lock.held
    assert 60_000 < _pttl(r, lock) <= 90_000
    # Still held in Redis, by nobody in this process.
    assert not Lock(r, "detached", wait=0).acquire()
    assert fence is not None
    heir = Lock(r, "detached", ttl=30, wait=0)
    assert heir.adopt(token, fence)
    heir.release()
    # The detached handle is free for another acquisition.
    assert lock.acquire()
    lock.release()


def test_detach_of_a_lost_lease_raises(r: redis.Redis) -> None:
    lock = Lock(r, "lost", ttl=30, wait=0)
    assert lock.acquire()
    r.delete(lock.keys.lease)
    with pytest.raises(LockLost):
        lock.detach()
    assert lock.token is None
    assert lock.acquire()
    lock.release()


def test_adopt_checks_its_arguments(r: redis.Redis) -> None:
    lock = Lock(r, "args", wait=0)
    with pytest.raises(ValueError, match="16 hex digits"):
        lock.adopt("not-a-token", 1)
    with pytest.raises(ValueError, match="fence"):
        lock.adopt("0123456789abcdef", "7")  # type: ignore[arg-type]


def test_adopt_on_a_handle_already_held(r: redis.Redis) -> None:
    lock = Lock(r, "busy-handle", ttl=30, wait=0)
    assert lock.acquire()
    assert lock.token is not None and lock.fence is not None
    with pytest.raises(LockError, match="not reentrant"):
        lock.adopt(lock.token, lock.fence)
    errors: list[BaseException] = []

    def other_thread() -> None:
        try:
            assert lock.token is not None and lock.fence is not None
            lock.adopt(lock.token, lock.fence)
        except LockError as exc:
            errors.append(exc)

    t = threading.Thread(target=other_thread)
    t.start()
    t.join(10)
    assert len(errors) == 1 and "another thread" in str(errors[0])
    lock.release()


# -- asyncio --------------------------------------------------------------------------------
async def test_async_adopt_takes_over_the_lease(ar: redis.asyncio.Redis, r: redis.Redis) -> None:
    first = AsyncLock(ar, "handed", ttl=30, wait=0)
    assert await first.acquire()
    token, fence = first.token, first.fence
    assert token is not None and fence is not None

    second = AsyncLock(ar, "handed", ttl=5, wait=0)
    assert await second.adopt(token, fence, ttl=60)
    assert second.held and second.token == token and second.fence == fence
    assert _pttl(r, second) > 30_000
    assert await second.owned()
    await second.release()
    assert not r.exists(second.keys.lease)


async def test_async_adopt_refuses_a_token_that_no_longer_holds(
    ar: redis.asyncio.Redis,
) -> None:
    first = AsyncLock(ar, "stale", ttl=30, wait=0)
    assert await first.acquire()
    token, fence = first.token, first.fence
    assert token is not None and fence is not None
    await first.release()
    other = AsyncLock(ar, "stale", ttl=30, wait=0)
    assert await other.acquire()
    late = AsyncLock(ar, "stale", ttl=30, wait=0)
    assert not await late.adopt(token, fence)
    assert late.token is None
    assert await other.owned()
    await other.release()
    assert await late.acquire()
    await late.release()


async def test_async_detach_hands_the_lease_on(ar: redis.asyncio.Redis, r: redis.Redis) -> None:
    lock = AsyncLock(ar, "detached", ttl=30, wait=0, renew=True)
    assert await lock.acquire()
    fence = lock.fence
    token = await lock.detach(ttl=90)
    assert lock.token is None and lock._renewer is None
    assert 60_000 < _pttl(r, lock) <= 90_000
    assert fence is not None
    heir = AsyncLock(ar, "detached", ttl=30, wait=0)
    assert await heir.adopt(token, fence)
    await heir.release()
    assert await lock.acquire()
    await lock.release()


async def test_async_detach_of_a_lost_lease_raises(ar: redis.asyncio.Redis, r: redis.Redis) -> None:
    lock = AsyncLock(ar, "lost", ttl=30, wait=0)
    assert await lock.acquire()
    r.delete(lock.keys.lease)
    with pytest.raises(LockLost):
        await lock.detach()
    assert lock.token is None
    assert await lock.acquire()
    await lock.release()


async def test_async_adopt_checks_its_arguments(ar: redis.asyncio.Redis) -> None:
    lock = AsyncLock(ar, "args", wait=0)
    with pytest.raises(ValueError, match="16 hex digits"):
        await lock.adopt("ABCDEF0123456789", 1)
