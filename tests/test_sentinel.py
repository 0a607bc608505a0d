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
import redis
from django.conf import settings
from django.core.cache import caches
from django.test import override_settings
from redis.sentinel import Sentinel

from django_redislock import connection
from django_redislock.core import LockLost, RedisUnavailable, ReplicationTimeout
from django_redislock.core.drivers.lock import Lock
from django_redislock.fencing import StaleFence, fenced_get, fenced_update
from django_redislock.locking.factories import get_async_lock, get_lock, keyspace
from tests.helpers_oracles import Occupancy
from tests.servers import RedisServer
from tests.testapp.models import Product
from tests.topologies import SERVICE, SentinelTopology, wait_until

pytestmark = [pytest.mark.sentinel]

# The databases the fenced writes of the failover window go to: SQLite, and
# PostgreSQL when it answers.
FENCE_ALIASES = [alias for alias in ("default", "postgres") if alias in settings.DATABASES]


@pytest.fixture(scope="session")
def topology() -> Iterator[SentinelTopology]:
    """A primary, a replica, three sentinels: started once per test process.

    Not once per module: pytest-django runs the database tests of every
    module first, so this module's tests do not run in one stretch, and a
    second topology would meet pools that django-redis keeps per LOCATION
    for the life of the process (``redis://mymaster/0``), built for the
    sentinels of the first one.
    """
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
    # django-redis's SentinelClient reads from a replica, which has the write
    # an instant later (replication is asynchronous): read until it does.
    wait_until("the replica to serve the write", lambda: caches["default"].get("greeting"), 10)
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
    assert sorted(row["name"] for row in json.loads(out.getvalue())["locks"]) == [
        "listed",
        "throttle:ok",
    ]
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


@pytest.mark.parametrize("command", ["config_get", "scan"])
def test_a_plain_command_that_times_out_leaves_no_reply_for_the_next_call(
    sentinel_settings: None, topology: SentinelTopology, command: str
) -> None:
    """The library's own plain commands (the eviction check's CONFIG GET, the
    inspection's SCAN) on its Sentinel pool: one that times out against a
    frozen primary must not go back to the pool with its request unanswered
    (fails before this change: the next lock call read the CONFIG GET's late
    reply as its own, a TypeError in a CI run)."""
    client = connection.get_client()
    assert probe_write()  # an idle, connected connection in the pool
    pool = client.connection_pool
    primary = topology.primary()
    # The sentinels held still: a pause past their patience would fail over.
    for sentinel in topology.sentinels:
        sentinel.pause()
    try:
        primary.pause()
        try:
            used = pool._available_connections[-1]
            assert used._sock is not None
            with pytest.raises(redis.exceptions.TimeoutError):
                if command == "config_get":
                    client.config_get("maxmemory-policy")
                else:
                    client.scan(0, match="*", count=10)
            # The connection it took (the pool hands out its last idle one)
            # is back in the pool closed, not open with the late reply on its way.
            assert used in pool._available_connections
            assert used._sock is None
        finally:
            primary.resume()
    finally:
        for sentinel in topology.sentinels:
            sentinel.resume()
    # The late reply, if it had stayed, would be read by this lock call.
    assert probe_write()


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


@pytest.mark.slow
@pytest.mark.django_db(transaction=True, databases=FENCE_ALIASES)
def test_a_resumed_primary_grants_beside_the_new_one_and_fencing_decides(
    sentinel_settings: None, topology: SentinelTopology
) -> None:
    """docs/guarantees.rst, Failover: a primary frozen (SIGSTOP) past the
    sentinels' patience and resumed stays a primary until they reconfigure it,
    and grants the lock beside the new primary; fencing keeps the data right."""
    topology.wait_replicated(60)
    frozen = topology.primary()
    old = topology.primary_address()
    sentinels = Sentinel(topology.sentinel_addresses, socket_timeout=1)
    # A worker whose pooled connection to the primary is open before the
    # freeze (a process's pool keeps its idle connections; a pause breaks
    # nothing a socket can see). A pool of its own: a new connection of a
    # Sentinel pool (the wake-up channel's, say) asks the sentinels and, the
    # primary having moved, drops the pool's idle ones, closing the window
    # this test shows before it can be shown.
    stale = sentinels.master_for(SERVICE, socket_timeout=1, socket_connect_timeout=1)
    probe = Lock(stale, "probe", ttl=5, wait=0, keyspace=keyspace())
    assert probe.acquire()
    probe.release()
    # Connects at first use: a worker that asks the sentinels after the failover.
    fresh = sentinels.master_for(SERVICE, socket_timeout=1, socket_connect_timeout=1)
    try:
        frozen.pause()
        try:
            topology.wait_new_primary(old, 40)
            # Asking for a replica's acknowledgement fails there for now: its
            # only replica is the frozen server.
            acked = Lock(fresh, "window", ttl=60, wait=0, keyspace=keyspace(), replicas=1)
            with pytest.raises(ReplicationTimeout):
                acked.acquire()
            on_new = Lock(fresh, "window", ttl=60, wait=0, keyspace=keyspace())
            assert on_new.acquire()
            new = topology.primary_address()
            # The window lasts until the sentinels see the old primary again
            # and make it a replica, about a second after it resumes: sooner
            # than a loaded host may run the steps below. The sentinels are
            # held still for them, so the window is there to be shown.
            for sentinel in topology.sentinels:
                sentinel.pause()
        finally:
            frozen.resume()
        try:
            # The old primary answers as a primary: the pooled connection is
            # granted the lock the new primary also granted.
            on_old = Lock(stale, "window", ttl=60, wait=0, keyspace=keyspace())
            assert on_old.keys.lease == on_new.keys.lease
            # Not with replicas=1: its replica follows nobody now, so the resumed
            # primary cannot have a grant acknowledged, and gives it back.
            acked_old = Lock(
                stale,
                "window",
                ttl=60,
                wait=0,
                keyspace=keyspace(),
                replicas=1,
                replicas_timeout=0.2,
            )
            with pytest.raises(ReplicationTimeout):
                acked_old.acquire()
            assert on_old.acquire(), "the resumed primary refused: no window to show"
            assert role_of(frozen) == "master"  # it never answered READONLY
            with frozen.client(socket_timeout=1) as c:
                assert c.exists(on_old.keys.lease) == 1
            assert new != old  # while the sentinels name the other
            with topology.server_at(new[1]).client(socket_timeout=1) as c:
                assert c.exists(on_new.keys.lease) == 1
            assert on_old.held and on_new.held  # two holders of one lock
            # Fences are the servers' clock: the later grant has the larger one.
            assert on_old.fence > on_new.fence
            for alias in FENCE_ALIASES:
                _both_holders_buy(alias, earlier=on_new.fence, later=on_old.fence)
        finally:
            for sentinel in topology.sentinels:
                sentinel.resume()
        # The sentinels turn the old primary into a replica of the new one,
        # which wipes its lease (a full resync); its holder learns at its next extend.
        wait_until(
            "the resumed primary to be made a replica", lambda: role_of(frozen) == "slave", 40
        )
        topology.wait_replicated(60)
        wait_until("every sentinel to see it as a healthy replica", lambda: settled(topology), 30)
        # Its pooled connection meets READONLY there, is dropped, and the call
        # is retried once on the new primary, where the lease is the other's.
        with pytest.raises(LockLost):
            on_old.extend()
        assert on_new.held
        on_new.release()
    finally:
        for client in (fresh, stale, *sentinels.sentinels):
            client.close()


def settled(topology: SentinelTopology) -> bool:
    """Whether every sentinel lists the replica, linked and with no fault flags."""
    port = topology.replica().port
    for sentinel in topology.sentinels:
        with sentinel.client(socket_timeout=1) as c:
            replicas = c.execute_command("SENTINEL", "REPLICAS", SERVICE)
        for replica in replicas:
            # A map over RESP3, a flat list of names and values over RESP2.
            fields = replica if isinstance(replica, dict) else _pairs(replica)
            if int(fields[b"port"]) == port:
                if fields[b"flags"] != b"slave" or fields[b"master-link-status"] != b"ok":
                    return False
                break
        else:
            return False
    return True


def _pairs(flat: list[Any]) -> dict[Any, Any]:
    return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}


def role_of(server: RedisServer) -> str:
    """What ``server`` says it is: ``master`` or ``slave``."""
    with server.client(socket_timeout=1) as c:
        return str(c.info("replication")["role"])


def _both_holders_buy(alias: str, *, earlier: int, later: int) -> None:
    """Each holder of one lock sells one unit of the same product, interleaved
    as the window allows: both read, then both write. Fencing refuses the
    holder with the smaller token once the other has claimed the row."""
    products = Product.objects.using(alias)
    row = products.create(name="window", stock=5, fence=0)
    qs = products.filter(pk=row.pk)
    seen_by_earlier = fenced_get(qs, earlier)  # claims the row for the earlier holder
    seen_by_later = fenced_get(qs, later)  # the later holder claims it from then on
    assert seen_by_earlier.stock == seen_by_later.stock == 5
    with pytest.raises(StaleFence):
        fenced_update(qs, earlier, stock=seen_by_earlier.stock - 1)
    assert fenced_update(qs, later, stock=seen_by_later.stock - 1) == 1
    with pytest.raises(StaleFence):
        fenced_get(qs, earlier)  # nor can it read the row as its own again
    final = products.get(pk=row.pk)
    assert (final.stock, final.fence) == (4, later)  # one sale, one unit


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
    # Back as an empty server, made a replica of the new primary here, as an
    # operator's tooling would: the sentinels would do it too, but only once
    # it has reported itself a primary for several of their INFO periods
    # (8 s and more), which on a loaded host outlasted 40 s.
    primary.start()
    host, port = topology.primary_address()
    with primary.client(socket_timeout=1) as c:
        c.execute_command("REPLICAOF", host, str(port))
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
