"""Locks through a django-redis Sentinel cache, across forced failovers.

The CACHES entry is the one django-redis documents for Sentinel, unchanged:
the library derives bounded sync and asyncio clients from it.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.test import override_settings

from django_redislock import connection
from django_redislock.core import LockLost, RedisUnavailable, ReplicationTimeout
from django_redislock.locking.factories import get_async_lock, get_lock
from tests.helpers_oracles import Occupancy
from tests.topologies import SERVICE, SentinelTopology, wait_until

pytestmark = [pytest.mark.sentinel]


@pytest.fixture(scope="module")
def topology() -> Iterator[SentinelTopology]:
    """A primary, a replica, three sentinels: started once for the module."""
    sentinel = SentinelTopology().start()
    yield sentinel
    sentinel.stop()


def sentinel_caches(topology: SentinelTopology) -> dict[str, Any]:
    return {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{SERVICE}/0",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
                "SENTINELS": topology.sentinel_addresses,
            },
        }
    }


@pytest.fixture
def sentinel_settings(topology: SentinelTopology) -> Iterator[None]:
    # override_settings(CACHES=...) makes Django rebuild its cache handlers.
    with override_settings(CACHES=sentinel_caches(topology), REDISLOCK={"SOCKET_TIMEOUT": 1.0}):
        connection.reset()
        with topology.primary().client() as c:
            c.flushall()
        yield
    connection.reset()


def test_django_redis_sentinel_cache_works_unchanged(
    sentinel_settings: None, topology: SentinelTopology
) -> None:
    caches["default"].set("greeting", "hello")
    assert caches["default"].get("greeting") == "hello"
    client = connection.get_client()
    # The library's own pool follows the sentinels, with bounded timeouts.
    assert type(client.connection_pool).__name__ == "SentinelConnectionPool"
    assert client.connection_pool.connection_kwargs["socket_timeout"] == 1.0
    for sentinel in client.connection_pool.sentinel_manager.sentinels:
        assert sentinel.connection_pool.connection_kwargs["socket_timeout"] == 1.0
    with get_lock("report", timeout=5, wait=0) as lock:
        assert lock.owned()
        with topology.primary().client() as c:
            assert c.exists(lock.keys.lease) == 1


async def test_async_client_follows_the_sentinels(
    sentinel_settings: None, topology: SentinelTopology
) -> None:
    client = connection.get_async_client()
    assert type(client.connection_pool).__name__ == "SentinelConnectionPool"
    assert client.connection_pool.connection_kwargs["socket_timeout"] == 1.0
    async with get_async_lock("report-async", timeout=5, wait=0) as lock:
        assert await lock.owned()
        with topology.primary().client() as c:
            assert c.exists(lock.keys.lease) == 1
    holder = get_async_lock("busy-async", timeout=30, wait=0)
    assert await holder.acquire()
    waiter = get_async_lock("busy-async", timeout=30, wait=10)

    async def wait_then_release() -> bool:
        ok = await waiter.acquire()
        await waiter.release()
        return ok

    task = asyncio.create_task(wait_then_release())
    deadline = time.monotonic() + 10
    while await client.llen(holder.keys.queue) != 1:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    await holder.release()
    assert await asyncio.wait_for(task, 15)  # woken by pub/sub on the primary
    for task in asyncio.all_tasks():
        if task.get_name().startswith("redislock-notify"):
            task.cancel()
    await client.aclose()


def test_mutual_exclusion_threads(sentinel_settings: None) -> None:
    occupancy = Occupancy(multiprocessing.get_context("fork"))
    errors: list[BaseException] = []

    def contend() -> None:
        lock = get_lock("oracle", timeout=10, wait=30)
        try:
            for _ in range(15):
                assert lock.acquire()
                with occupancy.section():
                    pass
                lock.release()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=contend) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert occupancy.entries.value == 90
    assert occupancy.violations.value == 0
    assert occupancy.unsafe.value == 90


def test_replica_ack_through_sentinel(sentinel_settings: None, topology: SentinelTopology) -> None:
    lock = get_lock("acked", timeout=10, wait=0, replicas=1, replicas_timeout=2)
    assert lock.acquire()
    with topology.replica().client() as c:
        assert c.exists(lock.keys.lease) == 1  # acknowledged means it is there
    lock.release()
    with override_settings(REDISLOCK={"SOCKET_TIMEOUT": 1.0, "REPLICAS": 1}):
        configured = get_lock("acked", timeout=10, wait=0)
    assert configured.replicas == 1


@pytest.mark.urls("tests.urls_throttle")
def test_middleware_and_command_through_sentinel(
    sentinel_settings: None, topology: SentinelTopology, settings: Any
) -> None:
    import json
    from io import StringIO

    from django.core.management import call_command
    from django.test import Client

    from django_redislock.core.drivers.semaphore import Semaphore

    middleware = "django_redislock.middleware.ConcurrencyLimitMiddleware"
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, middleware]
    settings.REDISLOCK = {
        "SOCKET_TIMEOUT": 1.0,
        "THROTTLE": [{"name": "ok", "path": "^/ok/", "limit": 1, "per": "global", "wait": 0.2}],
    }
    client = connection.get_client()
    permit = Semaphore(client, "throttle:ok", 1, ttl=60, wait=0)
    assert permit.acquire()
    assert Client().get("/ok/").status_code == 503
    assert asyncio.run(async_get("/ok/")) == 503
    held = get_lock("listed", timeout=60, wait=0)
    assert held.acquire()
    out = StringIO()
    call_command("redislocks", "list", "--format", "json", stdout=out)
    assert sorted(row["name"] for row in json.loads(out.getvalue())) == ["listed", "throttle:ok"]
    permit.release()
    held.release()
    assert Client().get("/ok/").status_code == 200
    assert asyncio.run(async_get("/ok/")) == 200


def _bounded_calls_until(predicate: Any, timeout: float = 40) -> float:
    """Retry until ``predicate()`` is true; return the longest single call seen."""
    longest = 0.0
    deadline = time.monotonic() + timeout
    while True:
        started = time.monotonic()
        try:
            done = predicate()
        except RedisUnavailable:
            done = False
        longest = max(longest, time.monotonic() - started)
        if done:
            return longest
        assert time.monotonic() < deadline, "the new primary never answered"
        time.sleep(0.05)


def probe_write() -> bool:
    """True once a write reaches a primary (a lock taken and given back)."""
    probe = get_lock("probe", timeout=5, wait=0)
    if not probe.acquire():
        return False
    probe.release()
    return True


def test_forced_failover_keeps_an_acknowledged_lease(
    sentinel_settings: None, topology: SentinelTopology
) -> None:
    holder = get_lock("kept", timeout=60, wait=0, replicas=1, replicas_timeout=2)
    assert holder.acquire()
    old = topology.primary_address()
    topology.failover()
    assert topology.primary_address() != old
    # The library's pool finds the new primary; its pooled connections to the
    # old one are dropped on READONLY or reset, within the bounded retry.
    longest = _bounded_calls_until(probe_write)
    assert holder.owned()
    assert longest < 10
    holder.extend()
    holder.release()
    again = get_lock("kept", timeout=5, wait=0)
    assert again.acquire()
    again.release()


def test_failover_to_a_replica_without_the_lease(
    sentinel_settings: None, topology: SentinelTopology
) -> None:
    """Last in the module: it kills the primary and brings it back as a replica."""
    topology.wait_replicated(60)
    replica = topology.replica()
    primary = topology.primary()
    # Stop the replica and cut its link: nothing written from now on reaches
    # it (a stopped process would still find writes in its socket buffer).
    replica.pause()
    try:
        with primary.client() as c:
            # Raw: redis-py 5.0's client_kill_filter() refuses the type "replica".
            c.execute_command("CLIENT", "KILL", "TYPE", "replica")
        # Asking for an acknowledgement fails, and the lease is given back.
        careful = get_lock("lost", timeout=60, wait=0, replicas=1, replicas_timeout=0.2)
        with pytest.raises(ReplicationTimeout):
            careful.acquire()
        with primary.client() as c:
            assert c.exists(careful.keys.lease) == 0
        # Without it the grant succeeds, on the primary alone.
        holder = get_lock("lost", timeout=60, wait=0)
        assert holder.acquire()
        old = topology.primary_address()
        primary.kill()
    finally:
        replica.resume()
    topology.wait_new_primary(old, 40)
    # The new primary never saw the lease: the holder learns at its next
    # extend, every call meanwhile fails fast instead of hanging.
    longest = _bounded_calls_until(probe_write)
    assert longest < 10
    with pytest.raises(LockLost):
        holder.extend()
    assert holder.lost
    other = get_lock("lost", timeout=5, wait=0)
    assert other.acquire()  # free on the new primary
    other.release()
    primary.start()  # back as an empty server; the sentinels make it a replica
    wait_until(
        "the old primary to rejoin as a replica",
        lambda: primary.client(socket_timeout=1).info("replication")["role"] == "slave",
        40,
    )


async def async_get(path: str) -> int:
    """GET through the async request path, then close this loop's client."""
    from django.test import AsyncClient

    try:
        return int((await AsyncClient().get(path)).status_code)
    finally:
        for task in asyncio.all_tasks():
            if task.get_name().startswith("redislock-notify"):
                task.cancel()
        await connection.get_async_client().aclose()
