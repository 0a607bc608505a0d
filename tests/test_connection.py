"""Clients built from CACHES: bounded timeouts, one asyncio client per loop, warnings."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest
import redis
from django.test import override_settings

from django_redislock import connection
from django_redislock.core import LockLost, LockNotAcquired, RedisUnavailable
from django_redislock.locking.factories import get_async_lock, get_lock, keyspace
from tests.helpers_oracles import audit_keyspace, plant_sentinel
from tests.servers import free_port

pytestmark = pytest.mark.usefixtures("fresh_clients")


def _caches_for(server: Any) -> dict[str, Any]:
    return {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": server.url,
            "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
        }
    }


def test_get_client_applies_the_library_timeouts() -> None:
    client = connection.get_client()
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 2.0
    assert kwargs["socket_connect_timeout"] == 1.0
    assert client.ping()
    assert connection.get_client() is client
    with override_settings(REDISLOCK={"SOCKET_TIMEOUT": 0.7, "CONNECT_TIMEOUT": 0.3}):
        bounded = connection.get_client()
        assert bounded is not client
        kwargs = bounded.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == 0.7
        assert kwargs["socket_connect_timeout"] == 0.3
        assert get_lock("timeouts").client is bounded
    # The cache's own client is untouched.
    from django_redis import get_redis_connection

    assert (
        get_redis_connection("default").connection_pool.connection_kwargs.get("socket_timeout")
        != 0.7
    )


def test_socket_timeout_bounds_a_hung_server(redis_factory: Any) -> None:
    server = redis_factory(port=free_port(), unix=False).start()
    with override_settings(CACHES=_caches_for(server), REDISLOCK={"SOCKET_TIMEOUT": 0.5}):
        lock = get_lock("hung", timeout=5, wait=0)
        assert lock.acquire()
        lock.release()
        server.pause()
        try:
            started = time.monotonic()
            with pytest.raises(RedisUnavailable):
                lock.acquire()
            # One retry at most: two socket timeouts and a little.
            assert time.monotonic() - started < 3
        finally:
            server.resume()


def test_a_connection_dropped_mid_call_is_retried_once(r: redis.Redis) -> None:
    client = connection.get_client()
    conn_id = client.client_id()  # the pooled connection the next call reuses
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["value"] = client.blpop(["redislock-test:never"], 1)
        except Exception as exc:  # reported below
            outcome["error"] = exc

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 5
    while not any(c["id"] == str(conn_id) and c["cmd"] == "blpop" for c in r.client_list()):
        assert time.monotonic() < deadline, "the call never reached Redis"
        time.sleep(0.01)
    assert r.client_kill_filter(_id=conn_id) == 1
    thread.join(10)
    assert not thread.is_alive()
    # The retry ran the call again on a new connection.
    assert outcome == {"value": None}


def test_get_lock_uses_settings_and_signals(r: redis.Redis) -> None:
    plant_sentinel(r)
    from django_redislock import signals

    seen: list[tuple[str, dict[str, Any]]] = []

    def receiver(signal: Any) -> Any:
        def handler(sender: Any, **kwargs: Any) -> None:
            seen.append((signal, kwargs))

        return handler

    handlers = {name: receiver(name) for name in ("lock_acquired", "lock_busy", "lock_released")}
    for name, handler in handlers.items():
        getattr(signals, name).connect(handler)
    try:
        with override_settings(REDISLOCK={"TIMEOUT": 12, "WAIT": 0, "PREFIX": "myapp"}):
            lock = get_lock("settings")
            assert lock.ttl == 12 and lock.wait == 0
            assert lock.keyspace is keyspace() and lock.keys.lease.startswith(b"myapp:L:")
            with lock:
                assert 0 < r.pttl(lock.keys.lease) <= 12_000
                with pytest.raises(LockNotAcquired):
                    get_lock("settings").__enter__()
            audit_keyspace(r, "myapp")
    finally:
        for name, handler in handlers.items():
            getattr(signals, name).disconnect(handler)
    assert [name for name, _ in seen] == ["lock_acquired", "lock_busy", "lock_released"]
    assert seen[0][1]["name"] == "settings" and seen[0][1]["fence"] == lock.fence


def test_async_client_is_per_event_loop() -> None:
    async def get() -> Any:
        return connection.get_async_client()

    first = asyncio.new_event_loop()
    second = asyncio.new_event_loop()
    try:
        a1 = first.run_until_complete(get())
        a2 = first.run_until_complete(get())
        b1 = second.run_until_complete(get())
        assert a1 is a2
        assert b1 is not a1
        assert b1.connection_pool is not a1.connection_pool
        assert a1.connection_pool.connection_kwargs["socket_timeout"] == 2.0

        async def ping(client: Any) -> Any:
            return await client.ping()

        assert first.run_until_complete(ping(a1))
        assert second.run_until_complete(ping(b1))
    finally:
        for loop in (first, second):
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()


class _ClusterLikeClient(redis.asyncio.Redis):
    """A real asyncio client whose ``aclose()`` takes no argument, as an
    asyncio ``RedisCluster``'s does."""

    closed: list[bool] = []

    async def aclose(self) -> None:  # type: ignore[override]
        type(self).closed.append(True)
        await super().aclose(close_connection_pool=True)


def _cluster_like_factory(*, asyncio: bool) -> Any:
    assert asyncio
    return _ClusterLikeClient.from_url("redis://127.0.0.1:1/0")


def test_a_user_client_without_close_arguments_is_closed_with_its_loop() -> None:
    _ClusterLikeClient.closed.clear()

    async def get() -> Any:
        return connection.get_async_client()

    with override_settings(REDISLOCK={"CLIENT": _cluster_like_factory}):
        client = asyncio.run(get())
    assert isinstance(client, _ClusterLikeClient)
    assert _ClusterLikeClient.closed == [True]


def test_async_client_in_another_thread_has_its_own_loop() -> None:
    async def get() -> Any:
        return connection.get_async_client()

    mine = asyncio.run(get())
    found: list[Any] = []
    t = threading.Thread(target=lambda: found.append(asyncio.run(get())))
    t.start()
    t.join(10)
    assert found and found[0] is not mine


async def test_get_async_lock(r: redis.Redis) -> None:
    plant_sentinel(r)
    lock = get_async_lock("async-settings", timeout=5, wait=0)
    assert lock.client is connection.get_async_client()
    assert await lock.acquire()
    assert await lock.owned()
    other = get_async_lock("async-settings", timeout=5, wait=0)
    assert not await other.acquire()
    await lock.release()
    audit_keyspace(r)


def _join_eviction_checks() -> None:
    from django_redislock import connection

    for thread in list(connection._eviction_checks.values()):
        thread.join(10)
        assert not thread.is_alive()


def test_eviction_policy_is_warned_about(redis_factory: Any, caplog: Any) -> None:
    server = redis_factory(
        port=free_port(), unix=False, extra=("--maxmemory-policy", "allkeys-lru")
    ).start()
    caplog.set_level(logging.WARNING, logger="django_redislock.connection")
    with override_settings(CACHES=_caches_for(server)):
        get_lock("evictable")
        get_lock("evictable")
    _join_eviction_checks()
    warnings = [
        rec
        for rec in caplog.records
        if rec.name == "django_redislock.connection" and "allkeys-lru" in rec.getMessage()
    ]
    assert len(warnings) == 1, caplog.records
    assert warnings[0].levelno == logging.WARNING


@pytest.mark.parametrize(
    "factory",
    ["get_async_lock", "get_async_multi_lock", "get_async_rw_lock", "get_async_semaphore"],
)
async def test_eviction_policy_is_warned_about_by_the_async_factories(
    redis_factory: Any, caplog: Any, factory: str
) -> None:
    # Only get_async_semaphore checked it: an ASGI site that only took
    # asyncio locks was never warned. Fails before this change.
    from django_redislock.locking import factories as locks

    server = redis_factory(
        port=free_port(), unix=False, extra=("--maxmemory-policy", "allkeys-lru")
    ).start()
    caplog.set_level(logging.WARNING, logger="django_redislock.connection")
    arguments: dict[str, tuple[Any, ...]] = {
        "get_async_lock": ("evictable",),
        "get_async_multi_lock": (["evictable-a", "evictable-b"],),
        "get_async_rw_lock": ("evictable", "read"),
        "get_async_semaphore": ("evictable", 2),
    }
    with override_settings(CACHES=_caches_for(server)):
        getattr(locks, factory)(*arguments[factory])
    _join_eviction_checks()
    warned = [rec for rec in caplog.records if "allkeys-lru" in rec.getMessage()]
    assert len(warned) == 1, caplog.records


def test_noeviction_is_not_warned_about(caplog: Any) -> None:
    caplog.set_level(logging.WARNING, logger="django_redislock.connection")
    get_lock("fine")
    _join_eviction_checks()
    assert not [rec for rec in caplog.records if rec.name == "django_redislock.connection"]


def test_unavailable_server_is_redis_unavailable(redis_factory: Any) -> None:
    server = redis_factory(port=free_port(), unix=False)
    # Never started: nothing listens on that port.
    with override_settings(CACHES=_caches_for(server)):
        lock = get_lock("nobody-home", timeout=5, wait=2)
        started = time.monotonic()
        with pytest.raises(RedisUnavailable):
            lock.acquire()
        assert time.monotonic() - started < 3


def test_failing_signal_receivers_do_not_break_locks(r: redis.Redis, caplog: Any) -> None:
    from django_redislock import signals

    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    caplog.set_level(logging.ERROR, logger="django_redislock.signals")
    names = ("lock_acquired", "lock_busy", "lock_released", "lock_lost")
    for name in names:
        getattr(signals, name).connect(broken)
    try:
        lock = get_lock("robust", timeout=5, wait=0)
        assert lock.acquire()
        assert lock.owned()
        assert not get_lock("robust", timeout=5, wait=0).acquire()
        lock.release()
        assert not r.exists(lock.keys.lease)
        assert lock.acquire()
        r.delete(lock.keys.lease)
        with pytest.raises(LockLost):
            lock.release()
    finally:
        for name in names:
            getattr(signals, name).disconnect(broken)
    failures = [rec for rec in caplog.records if rec.name == "django_redislock.signals"]
    assert len(failures) == 5
    assert all(rec.exc_info and rec.exc_info[0] is RuntimeError for rec in failures)
