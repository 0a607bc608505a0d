"""Django's own Redis cache backend as the connection source of the locks.

``django.core.cache.backends.redis.RedisCache`` (Django 4.0+) writes to the
first server of its LOCATION and reads from the others. The library reads the
first one's parameters, OPTIONS included, and builds its own bounded client,
as it does for a django-redis alias. Each test runs against real servers: the
session's private Redis, or servers of its own.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from django.core.cache import caches
from django.test import override_settings

from django_redislock import RedisUnavailable, connection, get_async_lock, get_lock
from django_redislock.checks import check_settings
from tests.servers import RedisServer, free_port
from tests.test_decorators import Get, close_async_clients, make_get

BACKEND = "django.core.cache.backends.redis.RedisCache"
FAST = {"SOCKET_TIMEOUT": 0.3, "CONNECT_TIMEOUT": 0.3, "TIMEOUT": 5, "WAIT": 0}


pytestmark = pytest.mark.usefixtures("fresh_clients")


def django_cache(location: Any, **options: Any) -> dict[str, Any]:
    cache: dict[str, Any] = {"BACKEND": BACKEND, "LOCATION": location}
    if options:
        cache["OPTIONS"] = options
    return {"default": cache}


class NamedPool(redis.ConnectionPool):
    """A project's own ``pool_class``: it names every connection it makes."""

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> Any:
        kwargs.setdefault("client_name", "from-pool-class")
        return super().from_url(url, **kwargs)


def _take_and_release(name: str) -> bytes:
    """Take a lock, return its lease key (checked while held), release it."""
    lock = get_lock(name, timeout=5, wait=0)
    assert lock.acquire()
    try:
        assert lock.owned()
        return lock.keys.lease
    finally:
        lock.release()


def _on_db(server: RedisServer, db: int) -> redis.Redis:
    # Not server.client(db=...): the ?db=0 of its URL would win.
    return redis.Redis(unix_socket_path=server.socket_path, db=db, socket_timeout=5)


def _held_lease(name: str) -> Any:
    lock = get_lock(name, timeout=5, wait=0)
    assert lock.acquire()
    return lock


def test_one_server_with_the_librarys_own_bounds(redis_server: RedisServer) -> None:
    location = f"unix://{redis_server.socket_path}?db=3"
    # The cache's own timeouts are the cache's business; locks keep theirs.
    caches_setting = django_cache(location, socket_timeout=60, retry_on_timeout=True)
    with override_settings(CACHES=caches_setting, REDISLOCK={}):
        assert check_settings() == []
        client = connection.get_client()
        kwargs = client.connection_pool.connection_kwargs
        assert (kwargs["path"], kwargs["db"]) == (redis_server.socket_path, 3)
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (2.0, 1.0)
        assert "retry_on_timeout" not in kwargs
        with override_settings(REDISLOCK={"SOCKET_TIMEOUT": 0.7, "CONNECT_TIMEOUT": 0.3}):
            bounded = connection.get_client().connection_pool.connection_kwargs
            assert (bounded["socket_timeout"], bounded["socket_connect_timeout"]) == (0.7, 0.3)
        lock = _held_lease("one-server")
        try:
            with _on_db(redis_server, 3) as db3, _on_db(redis_server, 0) as db0:
                assert db3.exists(lock.keys.lease)
                assert not db0.exists(lock.keys.lease)
        finally:
            lock.release()
        # The cache itself works beside the locks, on the same server.
        caches["default"].set("beside", 1)
        assert caches["default"].get("beside") == 1
        caches["default"].close()


async def test_the_async_client_comes_from_the_same_parameters(redis_server: RedisServer) -> None:
    location = f"unix://{redis_server.socket_path}?db=4"
    try:
        with override_settings(CACHES=django_cache(location), REDISLOCK={}):
            client = connection.get_async_client()
            kwargs = client.connection_pool.connection_kwargs
            assert (kwargs["path"], kwargs["db"], kwargs["socket_timeout"]) == (
                redis_server.socket_path,
                4,
                2.0,
            )
            lock = get_async_lock("async-one-server", timeout=5, wait=0)
            assert await lock.acquire()
            with _on_db(redis_server, 4) as db4:
                assert db4.exists(lock.keys.lease)
            assert not await get_async_lock("async-one-server", timeout=5, wait=0).acquire()
            await lock.release()
    finally:
        await close_async_clients()


@pytest.fixture
def second_server(redis_factory: Any) -> RedisServer:
    """A server listed after the first one in LOCATION: Django reads from it."""
    server: RedisServer = redis_factory(port=free_port(), unix=False).start()
    return server


def _locations(kind: str, primary: str, replica: str) -> Any:
    return {
        "list": [primary, replica],
        "commas": f"{primary},{replica}",
        "semicolons": f"{primary};{replica}",
    }[kind]


@pytest.mark.parametrize("kind", ["list", "commas", "semicolons"])
def test_several_servers_locks_go_to_the_first_only(
    redis_server: RedisServer, second_server: RedisServer, kind: str
) -> None:
    location = _locations(kind, redis_server.url, second_server.url)
    with override_settings(CACHES=django_cache(location), REDISLOCK={}):
        assert check_settings() == []
        assert connection.get_client().connection_pool.connection_kwargs["path"] == (
            redis_server.socket_path
        )
        for n in range(5):  # Django picks a replica at random: try a few
            lock = _held_lease(f"primary-only-{n}")
            try:
                with redis_server.client() as primary, second_server.client() as replica:
                    assert primary.exists(lock.keys.lease)
                    assert replica.dbsize() == 0
            finally:
                lock.release()


def test_a_replica_that_is_down_does_not_matter(redis_server: RedisServer) -> None:
    nobody = f"redis://127.0.0.1:{free_port()}/0"
    with override_settings(CACHES=django_cache([redis_server.url, nobody]), REDISLOCK=FAST):
        _take_and_release("replica-down")


def test_a_primary_that_is_down_is_redis_unavailable(redis_server: RedisServer) -> None:
    # The library never falls back to a replica: a lock there could not be written,
    # or, on a replica promoted by hand, would be a second lock.
    address = f"127.0.0.1:{free_port()}"
    caches_setting = django_cache([f"redis://{address}/0", redis_server.url])
    with (
        override_settings(CACHES=caches_setting, REDISLOCK=FAST),
        pytest.raises(RedisUnavailable) as info,
    ):
        get_lock("primary-down").acquire()
    assert info.value.address == address
    with redis_server.client() as client:
        assert client.dbsize() == 0


def test_a_server_that_does_not_answer_is_bounded(redis_factory: Any) -> None:
    server: RedisServer = redis_factory(port=free_port(), unix=False).start()
    caches_setting = django_cache(server.url, socket_timeout=None)
    with override_settings(CACHES=caches_setting, REDISLOCK=FAST):
        _take_and_release("hung")
        server.pause()
        try:
            with pytest.raises(RedisUnavailable) as info:
                get_lock("hung").acquire()
        finally:
            server.resume()
    assert info.value.reason == "timeout"


@pytest.fixture
def acl_server(redis_factory: Any) -> RedisServer:
    """The user ``locker`` logs in with ``s3cret``; the default user needs another password."""
    server: RedisServer = redis_factory(
        port=free_port(),
        unix=False,
        password="not-the-lockers",
        extra=("--user", "locker", "on", ">s3cret", "~*", "&*", "+@all"),
    )
    return server.start()


@pytest.mark.parametrize(
    ("location", "options"),
    [
        ("redis://locker:s3cret@127.0.0.1:{port}/2", {}),
        ("redis://127.0.0.1:{port}", {"username": "locker", "password": "s3cret", "db": 2}),
        ("redis://:s3cret@127.0.0.1:{port}/2", {"username": "locker"}),
        # What the URL says wins, as in redis-py's from_url.
        ("redis://locker:s3cret@127.0.0.1:{port}/2", {"username": "x", "password": "y", "db": 5}),
    ],
)
def test_username_password_and_db(
    acl_server: RedisServer, location: str, options: dict[str, Any]
) -> None:
    caches_setting = django_cache(location.format(port=acl_server.port), **options)
    with override_settings(CACHES=caches_setting, REDISLOCK=FAST):
        lock = _held_lease("acl")
        try:
            with redis.Redis(port=acl_server.port, password="not-the-lockers", db=2) as admin:
                assert admin.exists(lock.keys.lease)
                mine = str(connection.get_client().client_id())
                assert [c["user"] for c in admin.client_list() if c["id"] == mine] == ["locker"]
        finally:
            lock.release()


@pytest.mark.parametrize("as_path", [True, False])
def test_pool_class_parser_class_and_serializer(redis_server: RedisServer, as_path: bool) -> None:
    from redis.connection import _RESP2Parser

    options = {
        "pool_class": f"{__name__}.NamedPool" if as_path else NamedPool,
        "parser_class": "redis.connection._RESP2Parser" if as_path else _RESP2Parser,
        # Django's RedisCacheClient takes it; it is not a connection parameter.
        "serializer": "django.core.cache.backends.redis.RedisSerializer",
    }
    with override_settings(CACHES=django_cache(redis_server.url, **options), REDISLOCK={}):
        assert check_settings() == []
        kwargs = connection.get_client().connection_pool.connection_kwargs
        assert kwargs["parser_class"] is _RESP2Parser
        assert kwargs["client_name"] == "from-pool-class"
        _take_and_release("pool-class")
        mine = str(connection.get_client().client_id())
        with redis_server.client() as r:
            assert [c["name"] for c in r.client_list() if c["id"] == mine] == ["from-pool-class"]


@pytest.fixture(params=["client", "async_client"])
def get(request: pytest.FixtureRequest) -> Get:
    return make_get(request)


@pytest.mark.urls("tests.urls_locked")
def test_a_locked_view(redis_server: RedisServer, get: Get) -> None:
    with override_settings(CACHES=django_cache(redis_server.url), REDISLOCK={}):
        for url in ("/item/fig/", "/aitem/fig/"):
            response = get(url)
            assert response.status_code == 200
            assert json.loads(response.content)["name"] == "item:fig"
        holder = _held_lease("item:fig")
        try:
            assert get("/item/fig/").status_code == 409
            assert get("/aitem/fig/").status_code == 409
        finally:
            holder.release()


def test_async_error_is_redis_unavailable_too() -> None:
    address = f"127.0.0.1:{free_port()}"

    async def attempt() -> RedisUnavailable:
        try:
            with pytest.raises(RedisUnavailable) as info:
                await get_async_lock("nobody").acquire()
            return info.value
        finally:
            await close_async_clients()

    with override_settings(CACHES=django_cache(f"redis://{address}/0"), REDISLOCK=FAST):
        error = async_to_sync(attempt)()
    assert (error.reason, error.address) == ("refused", address)
