"""Why Redis is unavailable, in words: wrong password, nothing listening, no answer.

Each case runs against a real server of its own: one started with
``requirepass``, a port nobody listens on, and a server stopped with SIGSTOP.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import override_settings

from django_redislock import RedisUnavailable, get_async_lock, get_lock
from tests.servers import RedisServer, free_port
from tests.test_decorators import Get, close_async_clients, make_get

pytestmark = [pytest.mark.urls("tests.urls_locked"), pytest.mark.usefixtures("fresh_clients")]

FAST = {"SOCKET_TIMEOUT": 0.3, "CONNECT_TIMEOUT": 0.3, "TIMEOUT": 5, "WAIT": 0}
OLD_WORDS = "could not be reached in time"


def _caches(
    location: str, backend: str = "django_redis.cache.RedisCache", **options: Any
) -> dict[str, Any]:
    return {"default": {"BACKEND": backend, "LOCATION": location, "OPTIONS": options}}


DJANGO_BACKEND = "django.core.cache.backends.redis.RedisCache"


@pytest.fixture
def locked_server(redis_factory: Any) -> RedisServer:
    server: RedisServer = redis_factory(port=free_port(), unix=False, password="right-one")
    return server.start()


@pytest.fixture
def paused_server(redis_factory: Any) -> Iterator[RedisServer]:
    server: RedisServer = redis_factory(port=free_port(), unix=False).start()
    server.pause()
    yield server
    server.resume()


def _sync_error() -> RedisUnavailable:
    with pytest.raises(RedisUnavailable) as info:
        get_lock("reason").acquire()
    return info.value


def _async_error() -> RedisUnavailable:
    async def attempt() -> RedisUnavailable:
        try:
            with pytest.raises(RedisUnavailable) as info:
                await get_async_lock("reason").acquire()
            return info.value
        finally:
            await close_async_clients()

    return async_to_sync(attempt)()


ATTEMPTS = {"sync": _sync_error, "async": _async_error}


@pytest.mark.parametrize("path", ["sync", "async"])
@pytest.mark.parametrize(
    ("location", "options"),
    [
        ("redis://:wrong@127.0.0.1:{port}/0", {}),
        ("redis://someone:wrong@127.0.0.1:{port}/0", {}),
        ("redis://127.0.0.1:{port}/0", {"PASSWORD": "wrong"}),
        ("redis://127.0.0.1:{port}/0", {}),
        # Django's own RedisCache: its OPTIONS are redis-py's, in lower case.
        ("redis://127.0.0.1:{port}/0", {"backend": DJANGO_BACKEND, "password": "wrong"}),
        ("redis://:wrong@127.0.0.1:{port}/0", {"backend": DJANGO_BACKEND}),
        ("redis://127.0.0.1:{port}/0", {"backend": DJANGO_BACKEND}),
    ],
)
def test_wrong_or_missing_password(
    locked_server: RedisServer, path: str, location: str, options: dict[str, Any]
) -> None:
    address = f"127.0.0.1:{locked_server.port}"
    caches = _caches(location.format(port=locked_server.port), **options)
    with override_settings(CACHES=caches, REDISLOCK=FAST):
        error = ATTEMPTS[path]()
    assert (error.reason, error.address) == ("auth", address)
    message = str(error)
    assert message.startswith(
        f"Redis at {address} did not accept the client's username and password running "
    )
    assert (
        "user:password in the LOCATION URL, or in CACHES' OPTIONS: PASSWORD for django-redis, "
        "username and password for Django's RedisCache" in message
    )
    assert ". Check the credentials" in message  # two sentences, not one run-on
    assert OLD_WORDS not in message


@pytest.mark.parametrize(
    "options",
    [{"PASSWORD": "right-one"}, {"backend": DJANGO_BACKEND, "password": "right-one"}],
)
def test_the_right_password_works(locked_server: RedisServer, options: dict[str, Any]) -> None:
    caches = _caches(f"redis://127.0.0.1:{locked_server.port}/0", **options)
    with override_settings(CACHES=caches, REDISLOCK=FAST):
        lock = get_lock("reason")
        assert lock.acquire()
        lock.release()


@pytest.mark.parametrize("path", ["sync", "async"])
def test_nothing_listening(path: str) -> None:
    port = free_port()
    with override_settings(CACHES=_caches(f"redis://127.0.0.1:{port}/0"), REDISLOCK=FAST):
        error = ATTEMPTS[path]()
    assert (error.reason, error.address) == ("refused", f"127.0.0.1:{port}")
    message = str(error)
    assert message.startswith(f"Redis at 127.0.0.1:{port} refused the connection running ")
    assert message.endswith(f"Is Redis running at 127.0.0.1:{port}?")
    assert OLD_WORDS not in message


@pytest.mark.parametrize("path", ["sync", "async"])
def test_nothing_listening_on_a_unix_socket(path: str, tmp_path: Any) -> None:
    socket_path = str(tmp_path / "none.sock")
    with override_settings(CACHES=_caches(f"unix://{socket_path}?db=0"), REDISLOCK=FAST):
        error = ATTEMPTS[path]()
    assert (error.reason, error.address) == ("refused", socket_path)
    assert str(error).endswith(f"Is Redis running at {socket_path}?")


@pytest.mark.parametrize("path", ["sync", "async"])
def test_no_answer_in_time(paused_server: RedisServer, path: str) -> None:
    address = f"127.0.0.1:{paused_server.port}"
    with override_settings(CACHES=_caches(f"redis://{address}/0"), REDISLOCK=FAST):
        error = ATTEMPTS[path]()
    assert (error.reason, error.address) == ("timeout", address)
    message = str(error)
    assert message.startswith(f"Redis at {address} did not answer in time running ")
    assert "SOCKET_TIMEOUT and CONNECT_TIMEOUT" in message


@pytest.fixture(params=["client", "async_client"])
def get(request: pytest.FixtureRequest) -> Get:
    return make_get(request)


def test_a_view_logs_the_reason(
    get: Get, locked_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caches = _caches(f"redis://:wrong@127.0.0.1:{locked_server.port}/0")
    with (
        override_settings(CACHES=caches, REDISLOCK=FAST),
        caplog.at_level(logging.WARNING, "django_redislock.unavailable"),
    ):
        response = get("/item/x/")
    assert response.status_code == 503
    [record] = [r for r in caplog.records if r.name == "django_redislock.unavailable"]
    assert "did not accept the client's username and password" in record.getMessage()
    assert OLD_WORDS not in record.getMessage()


def test_redislocks_command_names_the_wrong_password(locked_server: RedisServer) -> None:
    from io import StringIO

    from django.core.management import CommandError, call_command

    address = f"127.0.0.1:{locked_server.port}"
    with (
        override_settings(CACHES=_caches(f"redis://:wrong@{address}/0"), REDISLOCK=FAST),
        pytest.raises(CommandError) as info,
    ):
        call_command("redislocks", "list", stdout=StringIO(), stderr=StringIO())
    message = str(info.value)
    assert message.startswith(
        f"Redis is unavailable: Redis at {address} did not accept the client's username and "
        "password scanning for locks: "
    )
    assert "in the LOCATION URL" in message


def test_redislocks_command_names_the_address_nobody_listens_on() -> None:
    from io import StringIO

    from django.core.management import CommandError, call_command

    address = f"127.0.0.1:{free_port()}"
    with (
        override_settings(CACHES=_caches(f"redis://{address}/0"), REDISLOCK=FAST),
        pytest.raises(CommandError) as info,
    ):
        call_command("redislocks", "list", stdout=StringIO(), stderr=StringIO())
    assert str(info.value).endswith(f"Is Redis running at {address}?")
