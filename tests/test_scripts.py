"""Lua scripts: EVALSHA with NOSCRIPT fallback, errors as RedisUnavailable."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio

from django_redislock.core import AsyncLock, Lock, RedisUnavailable, scripts
from tests.helpers_oracles import audit_keyspace, plant_sentinel


def test_scripts_are_distinct_and_hashed() -> None:
    all_scripts = [scripts.ACQUIRE, scripts.RELEASE, scripts.EXTEND, scripts.CANCEL, scripts.CLEAR]
    assert len({s.sha for s in all_scripts}) == len(all_scripts)
    for s in all_scripts:
        assert len(s.sha) == 40
        assert s.source.startswith(b"-- Shared by every lock script")


def test_sync_after_script_flush(r: redis.Redis) -> None:
    plant_sentinel(r)
    lock = Lock(r, "noscript", ttl=5, wait=0)
    r.script_flush()
    assert r.script_exists(scripts.ACQUIRE.sha) == [False]
    assert lock.acquire()
    assert r.script_exists(scripts.ACQUIRE.sha) == [True]
    r.script_flush()
    lock.extend()
    r.script_flush()
    lock.release()
    assert not r.exists(lock.keys.lease)
    r.script_flush()
    assert lock.acquire()
    lock.release()
    audit_keyspace(r)


async def test_async_after_script_flush(redis_server: object, r: redis.Redis) -> None:
    plant_sentinel(r)
    client = redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=5)  # type: ignore[attr-defined]
    try:
        lock = AsyncLock(client, "noscript-async", ttl=5, wait=0)
        await client.script_flush()
        assert await lock.acquire()
        await client.script_flush()
        await lock.extend()
        await client.script_flush()
        await lock.release()
        assert not r.exists(lock.keys.lease)
        assert await client.script_exists(scripts.RELEASE.sha) == [True]
        audit_keyspace(r)
    finally:
        await client.aclose()


def test_error_reply_becomes_unavailable(r: redis.Redis) -> None:
    lock = Lock(r, "wrong", ttl=5, wait=0)
    r.set(lock.keys.lease, b"x")
    with pytest.raises(RedisUnavailable, match="answered with an error running acquire"):
        lock.acquire()


def test_unreachable_becomes_unavailable() -> None:
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1, socket_timeout=1)
    with pytest.raises(RedisUnavailable, match="could not be reached"):
        scripts.run(client, scripts.RELEASE, (b"a", b"b", b"c"), ("t",))
