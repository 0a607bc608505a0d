"""Lock calls stay within the connection pool the caller configured.

Each test gives a client ``max_connections`` and a retry policy that retries a
timed-out connect (redis-py 8's default does), names its connections
(``client_name``) and counts them on the server (``CLIENT LIST``). With every
connection of the pool taken, a lock call fails as a plain command does,
rather than opening connections of its own; the server never sees more than
the cap.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from django.test import override_settings
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry
from redis.sentinel import Sentinel

from django_redislock import connection
from django_redislock.core import AsyncLock, Lock, RedisUnavailable
from django_redislock.core.engine import scripts
from django_redislock.core.engine.protocol import may_have_run
from django_redislock.core.io import calls, calls_async
from tests.servers import RedisServer
from tests.topologies import SERVICE, ClusterTopology, SentinelTopology

CAP = 3
NAME = "capped"
COUNTER = b"redislock-test:cap"
_SOURCE = b"return redis.call('INCR', KEYS[1])"
COUNT = scripts.Script("count", _SOURCE, hashlib.sha1(_SOURCE).hexdigest())


def lingering_retry() -> Retry:
    # Retries timeouts and connection errors, with back-off: as redis-py 8's default.
    return Retry(ExponentialBackoff(cap=1, base=0.1), 10)


def connections_named(server: RedisServer, name: str = NAME) -> int:
    with server.client(socket_timeout=5) as c:
        return sum(1 for entry in c.client_list() if entry.get("name") == name)


def _args(getter: Any) -> tuple[str, ...]:
    # redis-py before 5.3 requires a command name; later versions warn on one.
    parameter = inspect.signature(getter).parameters.get("command_name")
    return ("PING",) if parameter is not None and parameter.default is inspect._empty else ()


def take_all(pool: Any) -> list[Any]:
    return [pool.get_connection(*_args(pool.get_connection)) for _ in range(CAP)]


async def atake_all(pool: Any) -> list[Any]:
    return [await pool.get_connection(*_args(pool.get_connection)) for _ in range(CAP)]


@pytest.fixture
def server(redis_factory: Any) -> RedisServer:
    started: RedisServer = redis_factory().start()
    return started


def capped_client(server: RedisServer, kind: str) -> redis.Redis:
    kwargs: dict[str, Any] = {
        "path": server.socket_path,
        "socket_timeout": 0.5,
        "client_name": NAME,
        "retry": lingering_retry(),
        "max_connections": CAP,
        "connection_class": redis.UnixDomainSocketConnection,
    }
    if kind == "blocking":
        pool: Any = redis.BlockingConnectionPool(timeout=0.2, **kwargs)
    else:
        pool = redis.ConnectionPool(**kwargs)
    return redis.Redis(connection_pool=pool)


@pytest.mark.parametrize("kind", ["pool", "blocking"])
def test_a_lock_call_at_the_cap_fails_as_a_plain_command_does(
    server: RedisServer, kind: str
) -> None:
    client = capped_client(server, kind)
    pool = client.connection_pool
    try:
        held = take_all(pool)
        assert connections_named(server) == CAP
        with pytest.raises(redis.ConnectionError):
            client.incr(COUNTER)
        with pytest.raises(RedisUnavailable) as info:
            calls.run(client, COUNT, (COUNTER,), ())
        assert not may_have_run(info.value)
        assert connections_named(server) == CAP
        for conn in held:
            pool.release(conn)
        assert calls.run(client, COUNT, (COUNTER,), ()) == 1
        assert connections_named(server) == CAP
    finally:
        client.close()


def test_locks_and_commands_from_many_threads_share_the_cap(server: RedisServer) -> None:
    pool = redis.BlockingConnectionPool(
        connection_class=redis.UnixDomainSocketConnection,
        path=server.socket_path,
        socket_timeout=2,
        client_name=NAME,
        retry=lingering_retry(),
        max_connections=CAP,
        timeout=10,
    )
    client = redis.Redis(connection_pool=pool)
    threads = 8
    start = threading.Barrier(threads, timeout=10)
    failures: list[BaseException] = []

    def work(n: int) -> None:
        try:
            lock = Lock(client, f"cap:{n % 2}", ttl=5, wait=10)
            start.wait()
            for _ in range(20):
                with lock:
                    client.incr(COUNTER)
        except BaseException as exc:  # recorded: the assertion below shows it
            failures.append(exc)

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    try:
        assert not any(worker.is_alive() for worker in workers)
        assert failures == []
        assert int(client.get(COUNTER) or 0) == threads * 20
        assert connections_named(server) <= CAP
    finally:
        client.close()


async def test_an_async_lock_call_at_the_cap_fails_as_a_plain_command_does(
    server: RedisServer,
) -> None:
    client = redis.asyncio.Redis(
        unix_socket_path=server.socket_path,
        socket_timeout=0.5,
        client_name=NAME,
        retry=redis.asyncio.retry.Retry(ExponentialBackoff(cap=1, base=0.1), 10),
        max_connections=CAP,
    )
    pool = client.connection_pool
    try:
        held = await atake_all(pool)
        with pytest.raises(redis.ConnectionError):
            await client.incr(COUNTER)
        with pytest.raises(RedisUnavailable) as info:
            await calls_async.run_async(client, COUNT, (COUNTER,), ())
        assert not may_have_run(info.value)
        assert connections_named(server) == CAP
        for conn in held:
            await pool.release(conn)
        assert await calls_async.run_async(client, COUNT, (COUNTER,), ()) == 1
        assert connections_named(server) == CAP
    finally:
        await client.aclose()


@pytest.mark.parametrize("pool_class", ["redis.ConnectionPool", "redis.BlockingConnectionPool"])
def test_the_library_client_has_the_cache_pool_s_cap(server: RedisServer, pool_class: str) -> None:
    caches = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": server.url,
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.DefaultClient",
                "CONNECTION_POOL_CLASS": pool_class,
                "CONNECTION_POOL_KWARGS": {"max_connections": CAP, "client_name": NAME},
            },
        }
    }
    connection.reset()
    try:
        with override_settings(CACHES=caches, REDISLOCK={"SOCKET_TIMEOUT": 0.5}):
            client = connection.get_client()
            pool = client.connection_pool
            assert type(pool).__name__ == pool_class.split(".")[1]
            held = take_all(pool)
            with pytest.raises(RedisUnavailable):
                calls.run(client, COUNT, (COUNTER,), ())
            assert connections_named(server) == CAP
            for conn in held:
                pool.release(conn)
            assert calls.run(client, COUNT, (COUNTER,), ()) == 1
    finally:
        connection.reset()


async def test_the_library_async_client_has_the_cache_pool_s_cap(server: RedisServer) -> None:
    caches = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": server.url,
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.DefaultClient",
                "CONNECTION_POOL_KWARGS": {"max_connections": CAP, "client_name": NAME},
            },
        }
    }
    connection.reset()
    try:
        with override_settings(CACHES=caches, REDISLOCK={"SOCKET_TIMEOUT": 0.5}):
            client = connection.get_async_client()
            held = await atake_all(client.connection_pool)
            with pytest.raises(RedisUnavailable):
                await calls_async.run_async(client, COUNT, (COUNTER,), ())
            assert connections_named(server) == CAP
            for conn in held:
                await client.connection_pool.release(conn)
            await client.aclose()
    finally:
        connection.reset()


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_a_connection_closed_by_a_restart_is_replaced_before_a_script_is_sent(
    redis_factory: Any, transport: str
) -> None:
    # Taken from the pool, connected, but closed by the server: found out
    # before the script is written (it is not repeatable, so it could not be
    # sent again). Over TCP redis-py 8 expects maintenance notifications on
    # idle connections: data is no sign of staleness there, EOF still is.
    from tests.servers import free_port

    server: RedisServer = redis_factory(port=free_port()).start()
    if transport == "tcp":
        client = redis.Redis(
            host="127.0.0.1", port=server.port or 0, socket_timeout=0.5, retry=lingering_retry()
        )
    else:
        client = capped_client(server, "pool")
    try:
        assert calls.run(client, COUNT, (COUNTER,), ()) == 1
        server.restart(kill=True)
        assert calls.run(client, COUNT, (COUNTER,), ()) == 1
    finally:
        client.close()


# -- Sentinel and Cluster ----------------------------------------------------------------
@pytest.fixture(scope="module")
def sentinel_topology() -> Iterator[SentinelTopology]:
    topology = SentinelTopology().start()
    yield topology
    topology.stop()


def test_a_sentinel_client_s_lock_calls_stay_within_its_cap(
    sentinel_topology: SentinelTopology,
) -> None:
    sentinel = Sentinel(sentinel_topology.sentinel_addresses, socket_timeout=0.5)
    client = sentinel.master_for(
        SERVICE,
        socket_timeout=0.5,
        retry=lingering_retry(),
        max_connections=CAP,
        client_name=NAME,
    )
    primary = sentinel_topology.primary()
    pool = client.connection_pool
    try:
        held = take_all(pool)
        with pytest.raises(RedisUnavailable):
            calls.run(client, COUNT, (COUNTER,), ())
        assert connections_named(primary) == CAP
        for conn in held:
            pool.release(conn)
        assert calls.run(client, COUNT, (COUNTER,), ()) >= 1
        assert connections_named(primary) == CAP
    finally:
        client.close()
        for c in sentinel.sentinels:
            c.close()
        with primary.client(socket_timeout=5) as c:
            c.delete(COUNTER)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterTopology]:
    topology = ClusterTopology(primaries=3, replicas=0).start()
    yield topology
    topology.stop()


def test_a_cluster_client_s_lock_calls_stay_within_each_node_s_cap(
    cluster: ClusterTopology,
) -> None:
    client = RedisCluster(
        host="127.0.0.1",
        port=cluster.nodes[0].port or 0,
        socket_timeout=0.5,
        max_connections=CAP,
        client_name=NAME,
    )
    try:
        node = client.get_node_from_key(COUNTER)
        server = cluster.node_at(node.port)
        pool = client.get_redis_connection(node).connection_pool
        held = take_all(pool)
        with pytest.raises(RedisUnavailable):
            calls.run(client, COUNT, (COUNTER,), ())
        assert connections_named(server) == CAP
        for conn in held:
            pool.release(conn)
        assert calls.run(client, COUNT, (COUNTER,), ()) >= 1
        assert connections_named(server) == CAP
    finally:
        client.delete(COUNTER)
        client.close()


def _pool_metrics(module: str) -> Any:
    """redis-py's metrics recorder ``module``, where its pools record their
    connections (7.4 and later; 7.2 and 7.3 have a recorder without those
    records); else the test is skipped."""
    recorder = pytest.importorskip(module)
    if not hasattr(recorder, "record_connection_count"):
        pytest.skip("redis-py records its pools' connections from 7.4 on")
    return recorder


def test_redis_py_s_connection_metrics_stay_balanced(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # redis-py (7.4 on) counts idle and used connections per pool (opt-in metrics);
    # a lock call takes a connection as its checkout does, and counts it so.
    recorder = _pool_metrics("redis.observability.recorder")
    import redis.connection
    from redis.observability.attributes import get_pool_name

    counts: dict[str, int] = {}
    watched: list[str] = []

    def record(pool_name: str, connection_state: Any, counter: int = 1) -> None:
        # Only this test's pool: another pool collected meanwhile counts its own.
        if pool_name in watched:
            key = str(connection_state)
            counts[key] = counts.get(key, 0) + counter

    monkeypatch.setattr(recorder, "record_connection_count", record)
    monkeypatch.setattr(redis.connection, "record_connection_count", record, raising=False)
    # As with metrics on: with them off (the default) a checkout records nothing.
    monkeypatch.setattr(recorder, "is_enabled", lambda: True)
    for kind in ("pool", "blocking"):
        client = capped_client(server, kind)
        # The pool of the kind before may be collected at any moment (a
        # garbage collection pass frees it: it is in a reference cycle), and
        # counts its connections out under its own name: watched no longer.
        watched[:] = [get_pool_name(client.connection_pool)]
        counts.clear()
        try:
            for _ in range(3):
                assert calls.run(client, COUNT, (COUNTER,), ()) >= 1
            # One connection, made once, idle again after each call.
            idle, used = recorder.ConnectionState.IDLE, recorder.ConnectionState.USED
            assert counts == {str(idle): 1, str(used): 0}, kind
        finally:
            client.close()


def test_redis_py_s_checkout_timings_are_recorded_as_its_checkout_records_them(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # redis-py's checkout also records how long a new connection took to
    # make, and a blocking pool's how long the caller waited for one: a lock
    # call records them as a plain command's checkout does.
    recorder = _pool_metrics("redis.observability.recorder")
    import redis.connection
    from redis.observability.attributes import get_pool_name

    made: list[float] = []
    waited: list[float] = []
    watched: list[str] = []

    def create_time(connection_pool: Any, duration_seconds: float) -> None:
        if get_pool_name(connection_pool) in watched:
            made.append(duration_seconds)

    def wait_time(pool_name: str, duration_seconds: float) -> None:
        if pool_name in watched:
            waited.append(duration_seconds)

    for module in (recorder, redis.connection):
        monkeypatch.setattr(module, "record_connection_create_time", create_time, raising=False)
        monkeypatch.setattr(module, "record_connection_wait_time", wait_time, raising=False)
    monkeypatch.setattr(recorder, "is_enabled", lambda: True)
    for kind in ("pool", "blocking"):
        client = capped_client(server, kind)
        watched[:] = [get_pool_name(client.connection_pool)]
        made.clear()
        waited.clear()
        try:
            for _ in range(3):
                assert calls.run(client, COUNT, (COUNTER,), ()) >= 1
            ours = (len(made), len(waited))
            for _ in range(3):
                client.get(COUNTER)  # redis-py's own checkout, of the same connection
            theirs = (len(made) - ours[0], len(waited) - ours[1])
            each = 3 if kind == "blocking" else 0
            # One connection made, by the first lock call; a blocking pool
            # times every checkout's wait, a lock call's as a command's.
            assert ours == (1, each), kind
            assert theirs == (0, each), kind
            assert all(seconds >= 0 for seconds in made + waited)
        finally:
            client.delete(COUNTER)
            client.close()


@pytest.fixture
def redis_py_metrics_on() -> Iterator[None]:
    """redis-py's own OpenTelemetry metrics on (7.2 and later), as a project
    turns them on with an ``OTelConfig``; the process's meter provider left
    as it is (recording through a no-op one is enough), and off again after."""
    pytest.importorskip("opentelemetry.metrics")
    providers = pytest.importorskip("redis.observability.providers")
    config = pytest.importorskip("redis.observability.config")
    recorders = [pytest.importorskip("redis.observability.recorder")]
    with contextlib.suppress(ImportError):
        from redis.asyncio.observability import recorder as async_recorder

        recorders.append(async_recorder)
    providers.get_observability_instance().init(config.OTelConfig())
    for recorder in recorders:
        recorder.reset_collector()
    try:
        assert recorders[0].is_enabled()
        yield
    finally:
        providers.reset_observability_instance()
        for recorder in recorders:
            recorder.reset_collector()


@pytest.mark.usefixtures("redis_py_metrics_on")
def test_lock_calls_with_redis_py_s_own_metrics_on(server: RedisServer) -> None:
    # redis-py 7.2 and 7.3 have the recorder but count no pool connections:
    # a lock call must not ask it to (it has no such record there).
    client = capped_client(server, "pool")
    try:
        lock = Lock(client, "metrics-on", ttl=5, wait=0)
        assert lock.acquire()
        lock.release()
        assert calls.run(client, COUNT, (COUNTER,), ()) >= 1
    finally:
        client.delete(COUNTER)
        client.close()


@pytest.mark.usefixtures("redis_py_metrics_on")
async def test_async_lock_calls_with_redis_py_s_own_metrics_on(server: RedisServer) -> None:
    client = _async_client(server)
    try:
        lock = AsyncLock(client, "metrics-on", ttl=5, wait=0)
        assert await lock.acquire()
        await lock.release()
        assert await calls_async.run_async(client, COUNT, (COUNTER,), ()) >= 1
    finally:
        await client.delete(COUNTER)
        await client.aclose()


# -- giving a connection back ----------------------------------------------------------
#
# A lock call gives its connection back in fewer steps than redis-py's own
# ``ConnectionPool.release`` (``_calls_prims.give_back``); these hold it to
# what that release does: the connection idle again and counted so, a
# waiting re-authentication made on it, a project's own listener told.


def test_a_lock_call_gives_its_connection_back_to_the_pool(server: RedisServer) -> None:
    client = capped_client(server, "pool")
    pool = client.connection_pool
    try:
        for _ in range(CAP + 2):
            assert calls.run(client, COUNT, (COUNTER,), ()) >= 1
        # One connection, made once, idle again after each call.
        assert len(pool._available_connections) == 1
        assert not pool._in_use_connections
        assert connections_named(server) == 1
    finally:
        client.delete(COUNTER)
        client.close()


def test_a_connection_marked_to_reconnect_is_closed_as_it_goes_back(server: RedisServer) -> None:
    """redis-py 7 and later mark a connection to reconnect (a server's
    maintenance notice that it moves); its release closes a marked one, and
    so does a lock call's give-back: the next call connects anew."""
    if not hasattr(redis.connection.AbstractConnection, "mark_for_reconnect"):
        pytest.skip("redis-py before 7.0 marks no connection to reconnect")
    client = capped_client(server, "pool")
    pool = client.connection_pool
    try:
        assert calls.run(client, COUNT, (COUNTER,), ()) >= 1
        (conn,) = pool._available_connections
        conn.mark_for_reconnect()
        assert calls.run(client, COUNT, (COUNTER,), ()) >= 1
        assert pool._available_connections == [conn]
        assert conn._sock is None  # closed as it went back
        assert calls.run(client, COUNT, (COUNTER,), ()) >= 1
        assert conn._sock is not None and not conn.should_reconnect()
    finally:
        client.delete(COUNTER)
        client.close()


class _Token:
    """A credential provider's new token, as redis-py hands it to a
    connection to re-authenticate with when it is next given back."""

    def __init__(self, user: str, password: str) -> None:
        self.user, self.password = user, password

    def try_get(self, key: str) -> str:
        assert key == "oid"
        return self.user

    def get_value(self) -> str:
        return self.password


def new_user_token(server: RedisServer) -> _Token:
    """A user made on ``server``, and a token naming it, as a credential
    provider hands redis-py a new one."""
    with server.client(socket_timeout=5) as admin:
        admin.acl_setuser(
            "relock",
            enabled=True,
            passwords=["+s3cret"],
            keys=["*"],
            channels=["*"],
            commands=["+@all"],
        )
    return _Token("relock", "s3cret")


def test_a_connection_given_back_re_authenticates_with_its_waiting_token(
    server: RedisServer,
) -> None:
    if not hasattr(redis.connection.AbstractConnection, "set_re_auth_token"):
        pytest.skip("redis-py before 5.3 does not re-authenticate connections")
    token = new_user_token(server)
    client = capped_client(server, "pool")
    pool = client.connection_pool
    try:
        assert calls.run(client, COUNT, (COUNTER,), ()) >= 1
        (conn,) = pool._available_connections
        conn.set_re_auth_token(token)
        assert calls.run(client, COUNT, (COUNTER,), ()) >= 1
        # Re-authenticated as it went back, on the pool's lock, as redis-py's
        # release does it: the next command on it runs as the new user.
        assert pool._available_connections == [conn]
        assert conn._re_auth_token is None
        conn.send_command("ACL", "WHOAMI")
        assert conn.read_response() in (b"relock", "relock")
    finally:
        client.delete(COUNTER)
        client.close()


def _add_listener(pool: Any, event_type: type, listener: Any) -> None:
    """Beside redis-py's own listener (re-authentication), one of the
    project's on ``pool``'s dispatcher: through ``register_listeners`` where
    redis-py has it (7.0 and later), else in the dispatcher's mapping, the
    only way a project has before then."""
    dispatcher = pool._event_dispatcher
    if hasattr(dispatcher, "register_listeners"):
        dispatcher.register_listeners({event_type: [listener]})
    else:
        dispatcher._event_listeners_mapping[event_type].append(listener)


def test_a_project_s_release_listener_hears_every_lock_call(server: RedisServer) -> None:
    event = pytest.importorskip("redis.event")
    heard: list[Any] = []

    class Listener(event.EventListenerInterface):  # type: ignore[misc, name-defined, unused-ignore]
        def listen(self, released: Any) -> None:
            heard.append(released.connection)

    client = capped_client(server, "pool")
    pool = client.connection_pool
    try:
        assert calls.run(client, COUNT, (COUNTER,), ()) >= 1  # the script loaded
        # Beside redis-py's own listener (re-authentication), the pool's
        # dispatcher now has one of the project's: told of every give-back.
        _add_listener(pool, event.AfterConnectionReleasedEvent, Listener())
        for _ in range(3):
            assert calls.run(client, COUNT, (COUNTER,), ()) >= 1
        assert heard == pool._available_connections * 3
    finally:
        client.delete(COUNTER)
        client.close()


def _async_client(server: RedisServer) -> redis.asyncio.Redis:
    return redis.asyncio.Redis(
        unix_socket_path=server.socket_path, socket_timeout=5, client_name=NAME
    )


async def test_redis_py_s_async_connection_metrics_stay_balanced(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The asyncio pool counts a connection as used in its get_connection and
    # as idle again in its release; a lock call takes one with the pool's
    # get_available_connection, which counts nothing, so it counts it itself.
    recorder = _pool_metrics("redis.asyncio.observability.recorder")
    import redis.asyncio.connection
    from redis.observability.attributes import get_pool_name

    counts: dict[str, int] = {}
    watched: list[str] = []

    async def record(pool_name: str, connection_state: Any, counter: int = 1) -> None:
        if pool_name in watched:
            key = str(connection_state)
            counts[key] = counts.get(key, 0) + counter

    async def enabled() -> bool:
        return True

    made: list[float] = []

    async def create_time(connection_pool: Any, duration_seconds: float) -> None:
        if get_pool_name(connection_pool) in watched:
            made.append(duration_seconds)

    monkeypatch.setattr(recorder, "record_connection_count", record)
    monkeypatch.setattr(redis.asyncio.connection, "record_connection_count", record, raising=False)
    monkeypatch.setattr(recorder, "record_connection_create_time", create_time)
    # As with metrics on: with them off (the default) nothing is recorded.
    monkeypatch.setattr(recorder, "is_enabled", enabled)
    client = _async_client(server)
    watched[:] = [get_pool_name(client.connection_pool)]
    try:
        for _ in range(3):
            assert await calls_async.run_async(client, COUNT, (COUNTER,), ()) >= 1
        # One connection, made once (and its making timed), idle again after each call.
        idle, used = recorder.ConnectionState.IDLE, recorder.ConnectionState.USED
        assert counts == {str(idle): 1, str(used): 0}
        assert len(made) == 1 and made[0] >= 0
    finally:
        await client.delete(COUNTER)
        await client.aclose()


async def test_an_async_connection_given_back_re_authenticates_with_its_waiting_token(
    server: RedisServer,
) -> None:
    if not hasattr(redis.asyncio.connection.AbstractConnection, "set_re_auth_token"):
        pytest.skip("redis-py before 5.3 does not re-authenticate connections")
    token = new_user_token(server)
    client = _async_client(server)
    pool = client.connection_pool
    try:
        assert await calls_async.run_async(client, COUNT, (COUNTER,), ()) >= 1
        (conn,) = pool._available_connections
        conn.set_re_auth_token(token)
        assert await calls_async.run_async(client, COUNT, (COUNTER,), ()) >= 1
        assert pool._available_connections == [conn]
        assert conn._re_auth_token is None
        await conn.send_command("ACL", "WHOAMI")
        assert await conn.read_response() in (b"relock", "relock")
    finally:
        await client.delete(COUNTER)
        await client.aclose()


async def test_an_async_connection_marked_to_reconnect_is_closed_as_it_goes_back(
    server: RedisServer,
) -> None:
    if not hasattr(redis.asyncio.connection.AbstractConnection, "mark_for_reconnect"):
        pytest.skip("redis-py before 7.0 marks no connection to reconnect")
    client = _async_client(server)
    pool = client.connection_pool
    try:
        assert await calls_async.run_async(client, COUNT, (COUNTER,), ()) >= 1
        (conn,) = pool._available_connections
        conn.mark_for_reconnect()
        assert await calls_async.run_async(client, COUNT, (COUNTER,), ()) >= 1
        assert pool._available_connections == [conn]
        assert not conn.is_connected  # closed as it went back
        # The next call connects it anew. (redis-py 7's asyncio connection
        # keeps the mark, so its own release closes it again after each use.)
        assert await calls_async.run_async(client, COUNT, (COUNTER,), ()) >= 1
        assert pool._available_connections == [conn]
    finally:
        await client.delete(COUNTER)
        await client.aclose()


async def test_a_project_s_release_listener_hears_every_async_lock_call(
    server: RedisServer,
) -> None:
    event = pytest.importorskip("redis.event")
    heard: list[Any] = []

    class Listener(event.AsyncEventListenerInterface):  # type: ignore[misc, name-defined, unused-ignore]
        async def listen(self, released: Any) -> None:
            heard.append(released.connection)

    client = _async_client(server)
    pool = client.connection_pool
    try:
        assert await calls_async.run_async(client, COUNT, (COUNTER,), ()) >= 1
        _add_listener(pool, event.AsyncAfterConnectionReleasedEvent, Listener())
        for _ in range(3):
            assert await calls_async.run_async(client, COUNT, (COUNTER,), ()) >= 1
        assert heard == pool._available_connections * 3
    finally:
        await client.delete(COUNTER)
        await client.aclose()
