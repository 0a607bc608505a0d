"""Every script call is bounded by the socket timeout, whatever client is passed,
and a script that may have run is never sent again.

redis-py 8's default retry policy (ten retries, timeouts included, back-off up
to a second) would turn a frozen Redis into a call of many socket timeouts that
sends the same script again each time. Each test freezes a private Redis with
SIGSTOP, calls a script that counts its runs, resumes Redis and checks both
the time the call took and how often the script ran.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from django.test import override_settings
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from django_redislock import connection
from django_redislock.core import RedisUnavailable
from django_redislock.core.engine import scripts
from django_redislock.core.engine.protocol import may_have_run
from django_redislock.core.io import calls, calls_async
from tests.drive import Drive, run_to_end
from tests.servers import RedisServer
from tests.topologies import SERVICE, SentinelTopology, wait_until

# Generous on a loaded 2-core host: one 0.5 s timeout plus a small constant,
# far below what a second timeout and a back-off would take.
BOUND = 1.5
COUNTER = b"redislock-test:runs"
_SOURCE = b"return redis.call('INCR', KEYS[1])"
COUNT = scripts.Script("count", _SOURCE, hashlib.sha1(_SOURCE).hexdigest())


@pytest.fixture
def frozen_server(redis_factory: Any) -> Iterator[RedisServer]:
    server: RedisServer = redis_factory().start()
    yield server
    server.resume()  # whatever happened, never leave it stopped


def _runs(server: RedisServer) -> int:
    with server.client(socket_timeout=5) as c:
        return int(c.get(COUNTER) or 0)


def _settled_runs(server: RedisServer, expected_at_least: int) -> int:
    """The count once a late run had its chance to happen (Redis resumed)."""
    wait_until("Redis to answer again", lambda: _runs(server) >= expected_at_least, 10)
    # A second script sent by a retry would arrive within the back-off.
    time.sleep(1.5)
    return _runs(server)


async def _warmed(call: Callable[[], Awaitable[Any]], server: RedisServer) -> int:
    """Connect and cache the script before the freeze; the runs counted so far.

    Not what is tested: on a loaded host a first connection can outlast the
    0.5 s timeout, so the warm call is tried again, for at most 10 s. A try
    that timed out may still have run, hence the count read afterwards.
    """
    deadline = time.monotonic() + 10
    while True:
        try:
            await call()
            return _runs(server)
        except RedisUnavailable:
            if time.monotonic() > deadline:
                raise


async def _assert_bounded(drive: Drive, client: Any, server: RedisServer) -> None:
    run = drive.run_script
    before = await _warmed(lambda: drive(run(client, COUNT, (COUNTER,), ())), server)
    server.pause()
    try:
        for attempt in (1, 2):  # the second needs a new connection: bounded too
            started = time.monotonic()
            with pytest.raises(RedisUnavailable) as info:
                await drive(run(client, COUNT, (COUNTER,), ()))
            took = time.monotonic() - started
            assert took < BOUND, f"attempt {attempt} took {took:.2f}s"
            if attempt == 1:
                assert may_have_run(info.value)
    finally:
        server.resume()
    # The first frozen call was written and runs once Redis resumes; the
    # second never got a connection. Nothing ran twice.
    assert _settled_runs(server, before + 1) == before + 1


async def test_plain_client_is_bounded_and_not_resent(
    drive: Drive, frozen_server: RedisServer
) -> None:
    # As the README shows: a bare client with a socket timeout and redis-py's
    # default retry policy.
    url = f"unix://{frozen_server.socket_path}"
    async with drive.connect(url, socket_timeout=0.5) as client:
        await _assert_bounded(drive, client, frozen_server)


def test_acked_call_is_bounded_and_not_resent(frozen_server: RedisServer) -> None:
    client = redis.Redis(unix_socket_path=frozen_server.socket_path, socket_timeout=0.5)
    try:
        assert calls.run_acked(client, COUNT, (COUNTER,), (), 0, 0.1) == (1, 0)
        frozen_server.pause()
        try:
            started = time.monotonic()
            with pytest.raises(RedisUnavailable):
                calls.run_acked(client, COUNT, (COUNTER,), (), 0, 0.1)
            assert time.monotonic() - started < BOUND
        finally:
            frozen_server.resume()
        assert _settled_runs(frozen_server, 2) == 2
    finally:
        client.close()


def test_library_client_is_bounded_and_not_resent(frozen_server: RedisServer) -> None:
    caches = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": frozen_server.url,
            "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
        }
    }
    connection.reset()
    try:
        with override_settings(CACHES=caches, REDISLOCK={"SOCKET_TIMEOUT": 0.5}):
            client = connection.get_client()
            run_to_end(_assert_bounded(Drive("sync", client, client), client, frozen_server))
    finally:
        connection.reset()


def test_refused_connection_did_not_run(redis_factory: Any) -> None:
    server: RedisServer = redis_factory().start()
    client = redis.Redis(unix_socket_path=server.socket_path, socket_timeout=0.5)
    try:
        server.stop()
        with pytest.raises(RedisUnavailable, match="refused the connection") as info:
            calls.run(client, COUNT, (COUNTER,), ())
        assert not may_have_run(info.value)
    finally:
        client.close()


@pytest.fixture(scope="module")
def sentinel_topology() -> Iterator[SentinelTopology]:
    topology = SentinelTopology().start()
    yield topology
    topology.stop()


def test_sentinel_client_with_retries_is_bounded(sentinel_topology: SentinelTopology) -> None:
    # A Sentinel-managed client given a retry policy that retries timeouts:
    # lock scripts go through a twin Sentinel pool without retries.
    sentinel = Sentinel(sentinel_topology.sentinel_addresses, socket_timeout=0.5)
    client = sentinel.master_for(
        SERVICE, socket_timeout=0.5, retry=Retry(ExponentialBackoff(cap=1, base=0.1), 10)
    )
    primary = sentinel_topology.primary()
    try:
        assert calls.run(client, COUNT, (COUNTER,), ()) == 1
        # Short: the sentinels must not start a failover (down-after is 1 s).
        primary.pause()
        try:
            started = time.monotonic()
            with pytest.raises(RedisUnavailable):
                calls.run(client, COUNT, (COUNTER,), ())
            took = time.monotonic() - started
        finally:
            primary.resume()
        assert took < BOUND, f"took {took:.2f}s"
        assert _settled_runs(primary, 2) == 2
        assert calls.run(client, COUNT, (COUNTER,), ()) == 3
    finally:
        client.close()
        with primary.client(socket_timeout=5) as c:
            c.delete(COUNTER)


def _connections_received(server: RedisServer) -> int:
    with server.client(socket_timeout=5) as c:
        return int(c.info("stats")["total_connections_received"])


def _caches(server: RedisServer) -> dict[str, Any]:
    return {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": server.url,
            "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
        }
    }


def test_library_client_never_retries_a_timeout(frozen_server: RedisServer) -> None:
    # Its one retry is for a broken pooled connection; a timeout is not retried,
    # for any command, so one socket timeout bounds it.
    connection.reset()
    try:
        with override_settings(CACHES=_caches(frozen_server), REDISLOCK={"SOCKET_TIMEOUT": 0.5}):
            client = connection.get_client()
            assert client.hget(COUNTER, b"x") is None
            frozen_server.pause()
            try:
                for _ in range(2):  # pooled connection, then a new one
                    started = time.monotonic()
                    with pytest.raises(redis.TimeoutError):
                        client.hget(COUNTER, b"x")
                    assert time.monotonic() - started < BOUND
            finally:
                frozen_server.resume()
    finally:
        connection.reset()


async def test_library_async_client_is_bounded(frozen_server: RedisServer) -> None:
    connection.reset()
    try:
        with override_settings(CACHES=_caches(frozen_server), REDISLOCK={"SOCKET_TIMEOUT": 0.5}):
            client = connection.get_async_client()
            before = await _warmed(
                lambda: calls_async.run_async(client, COUNT, (COUNTER,), ()), frozen_server
            )
            assert await client.hget(b"redislock-test:none", b"x") is None
            connections = _connections_received(frozen_server)
            frozen_server.pause()
            try:
                started = time.monotonic()
                with pytest.raises(RedisUnavailable):
                    await calls_async.run_async(client, COUNT, (COUNTER,), ())
                assert time.monotonic() - started < BOUND
                started = time.monotonic()
                # A new connection whose handshake times out: not tried again.
                # (redis-py 5.0 reports it as a ConnectionError caused by the
                # timeout; the count of connections below shows the one try.)
                with pytest.raises((redis.TimeoutError, redis.ConnectionError)):
                    await client.hget(b"redislock-test:none", b"x")
                assert time.monotonic() - started < BOUND
            finally:
                frozen_server.resume()
            # One attempt, and the client asking this.
            assert _connections_received(frozen_server) == connections + 2
            assert _settled_runs(frozen_server, before + 1) == before + 1
            await client.aclose()
    finally:
        connection.reset()
