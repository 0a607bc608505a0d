from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from tests.drive import DRIVERS, Drive
from tests.servers import RedisServer, redis_binary, server_label
from tests.topologies import ClusterTopology, close_async_cluster, cluster_client, cluster_drive

if TYPE_CHECKING:
    from django.test import Client

# The test kit's fixtures, as an installed package would load them (entry point pytest11).
pytest_plugins = ["django_redislock.testing.plugin"]


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("REDISLOCK_SERVER_BIN", "").strip():
        try:
            redis_binary()
        except RuntimeError as exc:
            raise pytest.UsageError(str(exc)) from None
    expected = os.environ.get("REDISLOCK_EXPECT_SERVER", "").strip()
    if expected and not (server_label() + ".").startswith(expected + "."):
        # tox's server factors name a version: a wheel that ships another
        # one must not pass as a run on the named server.
        raise pytest.UsageError(
            f"REDISLOCK_EXPECT_SERVER={expected!r} but {redis_binary()} is {server_label()}: "
            "pin the package that ships the server binary, or rename the tox factor"
        )
    if _redis_py_version() < (5, 1):
        _close_failed_unix_connects()


def _close_failed_unix_connects() -> None:
    """Give redis-py before 5.1 the fix that 5.1 made: a failed unix-socket connect
    closes its socket (``UnixDomainSocketConnection._connect`` left it open).

    The open socket surfaces as a ResourceWarning whenever a client meets a server
    that is down or still starting. An ignore filter is not enough: the library's
    eviction check meets the server from a thread of its own, whose warning can land
    while pytest is between installing ``error`` and the ignore for the next phase,
    and then fails a test that did nothing wrong. Closing the socket means there is
    no warning to filter, and a socket that we leak still fails the run.
    """
    cls = redis.connection.UnixDomainSocketConnection

    def _connect(self: Any) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.socket_connect_timeout)
            sock.connect(self.path)
            sock.settimeout(self.socket_timeout)
        except BaseException:
            sock.close()
            raise
        return sock

    cls._connect = _connect  # type: ignore[method-assign]


def pytest_report_header(config: pytest.Config) -> str:
    # Which server every private server of the run comes from (REDISLOCK_SERVER_BIN).
    return f"server: {server_label()} ({redis_binary()})"


def _redis_py_version() -> tuple[int, int]:
    major, minor = redis.__version__.split(".")[:2]
    return int(major), int(minor)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """The session's private Redis, on the socket named in tests/settings.py."""
    socket_path = Path(os.environ["REDISLOCK_TEST_SOCKET"])
    server = RedisServer(directory=str(socket_path.parent))
    server.socket_path = str(socket_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _clean_redis(redis_server: RedisServer) -> Iterator[None]:
    """Each test starts on an empty private Redis (never the machine's own)."""
    with redis_server.client() as c:
        c.flushall()
    yield


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A sync client with the bounded timeouts the library expects."""
    client = redis_server.client(socket_timeout=5, socket_connect_timeout=5)
    yield client
    client.close()


@pytest.fixture
def r_locks(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A sync client of the session's Redis that waits 40 s for a reply, as long
    as a Celery worker may take to answer for a task."""
    client = redis.Redis(unix_socket_path=redis_server.socket_path, socket_timeout=40)
    yield client
    client.close()


@pytest.fixture
def redis_factory() -> Iterator[type[RedisServer]]:
    """Start extra private servers (ports, persistence, ...); all stopped after."""
    started: list[RedisServer] = []

    class Factory(RedisServer):
        def __init__(self, **kwargs: object) -> None:
            super().__init__(**kwargs)  # type: ignore[arg-type]
            started.append(self)

    yield Factory
    for server in started:
        server.cleanup()


@pytest.fixture
def fresh_clients() -> Iterator[None]:
    """The library's cached clients made anew around the test: they follow CACHES
    at creation, so a test that overrides it starts clean (a module opts in with
    ``pytestmark = pytest.mark.usefixtures("fresh_clients")``)."""
    from django_redislock import connection

    connection.reset()
    yield
    connection.reset()


@pytest.fixture
def superuser_client(django_user_model: Any) -> Client:
    """A test client logged in as a new superuser, ``root``."""
    from django.test import Client

    account = django_user_model.objects.create_user("root", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(account)
    return client


@pytest.fixture(scope="session", autouse=True)
def _databases_required() -> None:
    """In CI (REDISLOCK_REQUIRE_POSTGRES=1, REDISLOCK_REQUIRE_MYSQL=1) a
    database server that did not answer is a failure, not skipped tests."""
    from django.conf import settings

    for variable, alias, server in [
        ("REDISLOCK_REQUIRE_POSTGRES", "postgres", "PostgreSQL"),
        ("REDISLOCK_REQUIRE_POSTGRES", "postgres_pool", "Django's pool (psycopg[pool])"),
        ("REDISLOCK_REQUIRE_MYSQL", "mysql", "MariaDB/MySQL"),
    ]:
        if os.environ.get(variable) == "1" and alias not in settings.DATABASES:
            pytest.fail(f"{server} is required ({variable}=1) but did not answer")


# The fixtures that give a test database access (pytest-django's).
_DATABASE_FIXTURES = {
    "db",
    "transactional_db",
    "django_db_reset_sequences",
    "django_db_serialized_rollback",
    "live_server",
}


@pytest.fixture(autouse=True)
def _old_connections_left_alone(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test without database access leaves alone the database connections
    earlier tests of the process left open.

    Django closes old connections when a request starts and ends. A request a
    test drives or ends in this thread outside the test clients' own calls
    (the ASGI handler called directly, a streamed response closed a second
    time) would ask such a connection whether it is still usable, which
    pytest-django refuses to a test without database access: the test passed
    or failed by which tests had run before it on its worker. The test clients
    unhook Django's handler for their own calls and hook it back after, so it
    is the check itself that is left out here, for this test only."""
    from django.db.backends.base.base import BaseDatabaseWrapper

    if request.node.get_closest_marker("django_db") is not None or (
        _DATABASE_FIXTURES & set(request.fixturenames)
    ):
        yield
        return
    check = BaseDatabaseWrapper.close_if_unusable_or_obsolete
    BaseDatabaseWrapper.close_if_unusable_or_obsolete = _left_alone  # type: ignore[method-assign]
    try:
        yield
    finally:
        BaseDatabaseWrapper.close_if_unusable_or_obsolete = check  # type: ignore[method-assign]


def _left_alone(self: Any) -> None:
    """Neither asked nor closed: see ``_old_connections_left_alone``."""


@pytest.fixture(autouse=True)
def _connection_pools_closed() -> Iterator[None]:
    """Django keeps one pool per alias for the life of the process: closed
    after each test, so that no pooled connection outlives the test database."""
    yield
    from django.conf import settings
    from django.db import connections

    for alias, database in settings.DATABASES.items():
        if database.get("OPTIONS", {}).get("pool"):
            connection = connections[alias]
            if alias in getattr(connection, "_connection_pools", {}):
                connection.close()  # this thread's, back to the pool
                connection.close_pool()


@pytest.fixture
async def ar(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    """An asyncio client with the bounded timeout the library expects."""
    client = redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=5)
    yield client
    await client.aclose()


@pytest.fixture(params=DRIVERS)
async def drive(
    request: pytest.FixtureRequest, r: redis.Redis, redis_server: RedisServer
) -> AsyncIterator[Drive]:
    """The test runs once on the sync drivers, once on the asyncio ones (tests/drive.py)."""
    if request.param == "sync":
        yield Drive("sync", r, r)
        return
    client = redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=5)
    yield Drive("asyncio", client, r)
    await client.aclose()


@pytest.fixture
async def adrive(ar: redis.asyncio.Redis, r: redis.Redis) -> Drive:
    """The asyncio drivers alone, for what only tasks can do (cancellation)."""
    return Drive("asyncio", ar, r)


# -- a private Redis Cluster, for the modules marked ``cluster`` ---------------------------


@pytest.fixture(scope="module")
def topology() -> Iterator[ClusterTopology]:
    """Three primaries, no replicas: started once for the module that asks."""
    cluster = ClusterTopology(primaries=3, replicas=0).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def rc(topology: ClusterTopology) -> Iterator[RedisCluster]:
    """A sync client of ``topology``, every primary flushed first."""
    client = cluster_client(topology)
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield client
    client.close()


@pytest.fixture
async def arc(topology: ClusterTopology) -> AsyncIterator[AsyncRedisCluster]:
    """An asyncio client of ``topology``, every primary flushed first."""
    client = AsyncRedisCluster(
        host="127.0.0.1",
        port=topology.nodes[0].port or 0,
        socket_timeout=5,
        socket_connect_timeout=2,
    )
    await client.flushall(target_nodes=AsyncRedisCluster.PRIMARIES)
    yield client
    await close_async_cluster(client)


@pytest.fixture(params=DRIVERS)
async def cdrive(request: pytest.FixtureRequest, topology: ClusterTopology) -> AsyncIterator[Drive]:
    """``drive`` on ``topology``: the test runs on the sync drivers, then the asyncio ones."""
    async with cluster_drive(request.param, topology) as drive:
        yield drive
