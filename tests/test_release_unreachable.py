"""A decorated call whose release cannot reach Redis: a warning, not an exception.

docs/guarantees.rst says so: the call's result stands, the warning goes to
``django_redislock.release``, and the lease is given back off the caller's
path once Redis answers (or runs out). A ``redis_lock`` block and
``Lock.release()`` raise ``RedisUnavailable`` instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from django.http import HttpResponse
from django.test import AsyncRequestFactory, RequestFactory, override_settings

from django_redislock import RedisUnavailable, connection, current_lock, redis_lock, redis_locked
from django_redislock.core.engine.keys import LockKeys
from django_redislock.locking.factories import get_async_lock, get_lock
from django_redislock.signals import redis_unavailable
from tests.helpers_oracles import signal_sent
from tests.servers import RedisServer
from tests.test_decorators import close_async_clients
from tests.topologies import wait_until

WARNING = "could not release 'report:7' ("


@pytest.fixture
def server(redis_factory: Any) -> Iterator[RedisServer]:
    """CACHES pointed at a private Redis of this test's own, which it may pause."""
    private = redis_factory().start()
    caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": private.url}}
    # The release waits one socket timeout for the paused server; the acquire
    # before it must not time out on a loaded machine.
    with override_settings(CACHES=caches, REDISLOCK={"SOCKET_TIMEOUT": 1.0}):
        connection.reset()
        try:
            yield private
        finally:
            private.resume()  # a test that failed half-way may have left it stopped
            connection.reset()


@pytest.fixture
async def async_server(server: RedisServer) -> AsyncIterator[RedisServer]:
    """``server``, and this loop's clients of it closed before it goes."""
    yield server
    await close_async_clients()


def release_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "django_redislock.release"]


def assert_release_reported(sent: list[dict[str, Any]]) -> None:
    # The call ran under its lock: nothing ran unlocked, so fail_open is False.
    [fields] = sent
    assert fields["name"] == "report:7" and fields["fail_open"] is False
    assert isinstance(fields["error"], RedisUnavailable)
    assert fields["lock"] is not None and fields["lock"].name == "report:7"


def lease_exists(server: RedisServer, keys: LockKeys) -> bool:
    with server.client(socket_timeout=1) as c:
        return bool(c.exists(keys.lease))


@pytest.mark.parametrize("as_view", [True, False], ids=["view", "function"])
def test_a_release_that_cannot_reach_redis_logs_and_returns(
    server: RedisServer, caplog: pytest.LogCaptureFixture, as_view: bool
) -> None:
    seen: dict[str, Any] = {}

    @redis_locked("report:{pk}", timeout=60)
    def report(request: Any, pk: int) -> HttpResponse:
        lock = current_lock()
        assert lock is not None
        seen["keys"] = lock.keys
        assert lease_exists(server, lock.keys)
        server.pause()  # Redis stops answering between the acquire and the release
        return HttpResponse("report 7")

    request = RequestFactory().get("/reports/7/") if as_view else None
    try:
        with (
            caplog.at_level(logging.WARNING, logger="django_redislock"),
            signal_sent(redis_unavailable) as sent,
        ):
            response = report(request, pk=7)  # no exception
    finally:
        server.resume()
    assert (response.status_code, response.content) == (200, b"report 7")
    assert_release_reported(sent)
    [record] = release_warnings(caplog)
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith(WARNING)
    assert record.getMessage().endswith("; its lease will expire")
    # The release script was still in Redis's buffer, and the give-back
    # follows it: the name is free soon after Redis resumes, not after 60 s.
    wait_until("the lease to be given back", lambda: not lease_exists(server, seen["keys"]), 10)


@pytest.mark.parametrize("as_view", [True, False], ids=["view", "function"])
async def test_an_async_release_that_cannot_reach_redis_logs_and_returns(
    async_server: RedisServer, caplog: pytest.LogCaptureFixture, as_view: bool
) -> None:
    server = async_server
    seen: dict[str, Any] = {}

    @redis_locked("report:{pk}", timeout=60)
    async def report(request: Any, pk: int) -> HttpResponse:
        lock = current_lock()
        assert lock is not None
        seen["keys"] = lock.keys
        assert lease_exists(server, lock.keys)
        server.pause()
        return HttpResponse("report 7")

    request = AsyncRequestFactory().get("/reports/7/") if as_view else None
    try:
        with (
            caplog.at_level(logging.WARNING, logger="django_redislock"),
            signal_sent(redis_unavailable) as sent,
        ):
            response = await report(request, pk=7)
    finally:
        server.resume()
    assert (response.status_code, response.content) == (200, b"report 7")
    assert_release_reported(sent)
    [record] = release_warnings(caplog)
    assert record.getMessage().startswith(WARNING)
    deadline = time.monotonic() + 10
    while lease_exists(server, seen["keys"]):
        assert time.monotonic() < deadline, "the lease was not given back"
        await asyncio.sleep(0.02)
    # The give-back runs as a task of this loop: let it finish before the loop ends.
    givebacks = [t for t in asyncio.all_tasks() if t.get_name() == "redislock-giveback"]
    await asyncio.wait_for(asyncio.gather(*givebacks), 10)


def test_a_redis_lock_block_and_a_bare_release_raise_instead(server: RedisServer) -> None:
    """Code that holds the lock itself is told: ``RedisUnavailable``."""
    block = redis_lock("report:7", timeout=60)
    try:
        with pytest.raises(RedisUnavailable), block as held:
            keys = held.keys
            server.pause()
    finally:
        server.resume()
    wait_until("the block's lease to be given back", lambda: not lease_exists(server, keys), 10)
    lock = get_lock("report:8", timeout=60, wait=0)
    assert lock.acquire()
    server.pause()
    try:
        with pytest.raises(RedisUnavailable):
            lock.release()
    finally:
        server.resume()
    wait_until("the lease to be given back", lambda: not lease_exists(server, lock.keys), 10)


async def test_an_async_redis_lock_block_and_release_raise_instead(
    async_server: RedisServer,
) -> None:
    server = async_server
    try:
        with pytest.raises(RedisUnavailable):
            async with redis_lock("report:7", timeout=60) as held:
                keys = held.keys
                server.pause()
        lock = get_async_lock("report:8", timeout=60, wait=0)
        server.resume()
        # The release's timeout opened the breaker (docs/operating.rst, "A Redis
        # that stalls"): it closes at the first answer, the give-back's (off the
        # caller's path) or a probe's after its window.
        deadline = time.monotonic() + 5
        while True:
            try:
                assert await lock.acquire()
                break
            except RedisUnavailable as exc:
                assert exc.reason == "breaker_open" and time.monotonic() < deadline
                await asyncio.sleep(0.05)
        server.pause()
        with pytest.raises(RedisUnavailable):
            await lock.release()
    finally:
        server.resume()
    deadline = time.monotonic() + 10
    while lease_exists(server, keys) or lease_exists(server, lock.keys):
        assert time.monotonic() < deadline, "the leases were not given back"
        await asyncio.sleep(0.02)
    givebacks = [t for t in asyncio.all_tasks() if t.get_name() == "redislock-giveback"]
    await asyncio.wait_for(asyncio.gather(*givebacks), 10)
