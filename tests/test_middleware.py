"""ConcurrencyLimitMiddleware and concurrency_limited, through ``client`` and ``async_client``."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.contrib.auth.models import User
from django.core.checks import Error
from django.test import AsyncClient, Client

from django_redislock import connection, signals
from django_redislock.checks import check_settings
from django_redislock.core.drivers.semaphore import Semaphore
from django_redislock.core.engine.keys import KeySpace
from django_redislock.middleware import concurrency_limited
from tests.helpers_oracles import signal_sent
from tests.servers import free_port

pytestmark = pytest.mark.urls("tests.urls_throttle")

KS = KeySpace()
MW = "django_redislock.middleware.ConcurrencyLimitMiddleware"


def holders(r: redis.Redis, name: str) -> int:
    return int(r.zcard(KS.semaphore(name).lease))


def wait_until(predicate: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return bool(predicate())


def dead_client(*, asyncio: bool = False) -> Any:
    """REDISLOCK['CLIENT'] factory for a Redis nobody listens on."""
    import redis.asyncio as aredis

    kwargs = {"port": free_port(), "socket_timeout": 0.5, "socket_connect_timeout": 0.5}
    return aredis.Redis(**kwargs) if asyncio else redis.Redis(**kwargs)


def custom_throttled(request: Any, *, status: int, retry_after: Any, reason: str, name: str) -> Any:
    from django.http import HttpResponse

    return HttpResponse(f"custom {reason} {name}", status=status)


@pytest.fixture
def throttle(settings: Any) -> Iterator[Any]:
    """Install the middleware; the test sets REDISLOCK['THROTTLE']."""
    mw = list(settings.MIDDLEWARE)
    mw.insert(mw.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1, MW)
    settings.MIDDLEWARE = mw
    connection.reset()
    yield settings
    connection.reset()


def rules(settings: Any, *specs: dict[str, Any], **extra: Any) -> None:
    settings.REDISLOCK = {"THROTTLE": list(specs), **extra}


class IPAsyncClient(AsyncClient):
    """AsyncClient whose requests come from ``ip`` (the ASGI scope's client)."""

    def __init__(self, ip: str | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ip = ip or "127.0.0.1"

    def _base_scope(self, **request: Any) -> dict[str, Any]:
        scope: dict[str, Any] = super()._base_scope(**request)
        scope["client"] = [self.ip, 40000]
        return scope


@pytest.fixture(params=["sync", "async"])
def get(request: pytest.FixtureRequest, throttle: Any) -> Any:
    """One GET/POST helper for both request paths: returns the response."""
    kind = request.param

    def call(path: str, method: str = "get", client: Any = None, **extra: Any) -> Any:
        headers = {
            k[5:].replace("_", "-").lower(): extra.pop(k)
            for k in list(extra)
            if k.startswith("HTTP_")
        }
        if headers:
            extra["headers"] = headers
        ip = extra.pop("REMOTE_ADDR", "127.0.0.1") if kind == "async" else None
        if kind == "sync":
            c = client or Client(raise_request_exception=False)
            return getattr(c, method)(path, **extra)

        async def run() -> Any:
            c = IPAsyncClient(ip, raise_request_exception=False)
            if client is not None:
                c.cookies = client.cookies
            return await getattr(c, method)(path, **extra)

        return asyncio.run(run())

    call.kind = kind  # type: ignore[attr-defined]
    return call


@pytest.fixture
def caught() -> Iterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        kwargs.pop("signal", None)
        seen.append(kwargs)

    signals.request_throttled.connect(receiver)
    yield seen
    signals.request_throttled.disconnect(receiver)


REPORTS = {"name": "reports", "path": r"^/reports/", "limit": 1, "wait": 0}


def test_unmatched_request_runs_untouched(get: Any, throttle: Any, r: redis.Redis) -> None:
    rules(throttle, REPORTS)
    response = get("/ok/")
    assert response.status_code == 200
    assert list(r.scan_iter(match=b"redislock:S*")) == []


def test_permit_held_during_view_and_released_after(
    get: Any, throttle: Any, r: redis.Redis
) -> None:
    rules(throttle, REPORTS)
    seen: list[int] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        seen.append(holders(r, "throttle:reports"))

    signals.lock_acquired.connect(receiver)
    try:
        response = get("/reports/slow/")
    finally:
        signals.lock_acquired.disconnect(receiver)
    assert response.status_code == 200
    assert seen == [1]
    assert holders(r, "throttle:reports") == 0


def test_global_rule_full_gives_503_with_retry_after(
    get: Any, throttle: Any, r: redis.Redis, caught: list[dict[str, Any]]
) -> None:
    rules(throttle, REPORTS)
    occupier = Semaphore(r, "throttle:reports", 1, ttl=20, wait=0)
    assert occupier.acquire()
    response = get("/reports/slow/")
    assert response.status_code == 503
    assert response["Retry-After"] == "1"
    assert response["Cache-Control"] == "no-store"
    assert len(caught) == 1 and caught[0]["rule"] == "reports" and caught[0]["status"] == 503
    json_response = get("/reports/slow/", HTTP_ACCEPT="application/json")
    assert json_response.status_code == 503 and json_response.json()["error"] == "throttled"
    occupier.release()
    assert get("/reports/slow/").status_code == 200


def test_retry_after_from_rule(get: Any, throttle: Any, redislock_hold_permits: Any) -> None:
    rules(throttle, {**REPORTS, "retry_after": 7})
    redislock_hold_permits("throttle:reports", 1)
    assert get("/reports/slow/")["Retry-After"] == "7"


def test_per_ip_rule_gives_429_only_to_that_ip(
    get: Any, throttle: Any, redislock_hold_permits: Any, caught: list[dict[str, Any]]
) -> None:
    rules(throttle, {**REPORTS, "per": "ip", "limit": 1})
    redislock_hold_permits("throttle:reports:ip:10.0.0.1", 1)
    response = get("/reports/slow/", REMOTE_ADDR="10.0.0.1")
    assert response.status_code == 429 and "Retry-After" in response
    assert caught[0]["status"] == 429
    assert get("/reports/slow/", REMOTE_ADDR="10.0.0.2").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_per_user_rule(get: Any, throttle: Any, r: redis.Redis) -> None:
    rules(throttle, {**REPORTS, "per": "user"})
    user = User.objects.create_user("ann", password="pw")
    logged_in = Client()
    logged_in.force_login(user)
    occupier = Semaphore(r, f"throttle:reports:user:u:{user.pk}", 1, ttl=20, wait=0)
    assert occupier.acquire()
    assert get("/reports/slow/", client=logged_in).status_code == 429
    # Anonymous users are keyed by IP, so they are not affected.
    assert get("/reports/slow/").status_code == 200
    anon = Semaphore(r, "throttle:reports:user:ip:127.0.0.1", 1, ttl=20, wait=0)
    assert anon.acquire()
    assert get("/reports/slow/").status_code == 429


def test_per_callable_rule(get: Any, throttle: Any, r: redis.Redis) -> None:
    rules(throttle, {**REPORTS, "per": "tests.testapp.views_throttle.client_key"})
    occupier = Semaphore(
        r, "throttle:reports:tests.testapp.views_throttle.client_key:acme", 1, ttl=20, wait=0
    )
    assert occupier.acquire()
    assert get("/reports/slow/", HTTP_X_TENANT="acme").status_code == 429
    assert get("/reports/slow/", HTTP_X_TENANT="other").status_code == 200
    assert get("/reports/slow/").status_code == 200  # None: exempt


def test_methods_and_url_name_matching(get: Any, throttle: Any, r: redis.Redis) -> None:
    rules(
        throttle,
        {"name": "posts", "methods": ["post"], "limit": 1},
        {"name": "named", "url_name": "named-view", "limit": 1},
    )
    posts = Semaphore(r, "throttle:posts", 1, ttl=20, wait=0)
    named = Semaphore(r, "throttle:named", 1, ttl=20, wait=0)
    assert posts.acquire() and named.acquire()
    assert get("/ok/").status_code == 200
    assert get("/ok/", method="post").status_code == 503
    assert get("/named/3/").status_code == 503
    assert get("/reports/slow/").status_code == 200


def test_path_and_method_must_both_match(get: Any, throttle: Any, r: redis.Redis) -> None:
    rules(throttle, {**REPORTS, "methods": "POST"})
    assert Semaphore(r, "throttle:reports", 1, ttl=20, wait=0).acquire()
    assert get("/reports/slow/").status_code == 200
    assert get("/reports/slow/", method="post").status_code == 503
    assert get("/ok/", method="post").status_code == 200


def test_view_that_raises_releases_its_permit(get: Any, throttle: Any, r: redis.Redis) -> None:
    rules(throttle, {"name": "boom", "path": "^/boom/", "limit": 1})
    response = get("/boom/")
    assert response.status_code == 500
    assert holders(r, "throttle:boom") == 0


def test_a_permit_released_at_close_and_released_again_is_no_loss(
    throttle: Any, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # The release at a response's close() is by token, from any thread; sent
    # again (as after a lost reply) it must say released, not "expired".
    from django_redislock.throttling.permits import closer

    sem = Semaphore(connection.get_client(), "close-twice", 1, ttl=30, wait=0)
    assert sem.acquire()
    close = closer([sem])
    close()
    with caplog.at_level(logging.WARNING, logger="django_redislock"):
        close()
    assert [rec.getMessage() for rec in caplog.records] == []


def test_streaming_response_holds_permit_until_closed(throttle: Any, r: redis.Redis) -> None:
    rules(throttle, {"name": "stream", "path": "^/stream/", "limit": 1})
    client = Client()
    response = client.get("/stream/")
    assert response.status_code == 200 and response.streaming
    assert holders(r, "throttle:stream") == 1
    assert Client().get("/stream/").status_code == 503
    body = b"".join(response.streaming_content)  # the client closes at the end
    assert body == b"chunk0\nchunk1\nchunk2\n"
    assert holders(r, "throttle:stream") == 0
    response.close()  # closing twice is harmless
    assert Client().get("/stream/").status_code == 200


def test_file_response_holds_permit_until_closed(throttle: Any, r: redis.Redis) -> None:
    rules(throttle, {"name": "dl", "url_name": "download", "limit": 1})
    response = Client().get("/download/")
    assert response.status_code == 200
    assert holders(r, "throttle:dl") == 1
    assert Client().get("/download/").status_code == 503
    assert b"def download" in b"".join(response.streaming_content)
    assert holders(r, "throttle:dl") == 0


async def test_async_streaming_response_holds_permit_until_closed(
    throttle: Any, r: redis.Redis
) -> None:
    rules(throttle, {"name": "astream", "path": "^/astream/", "limit": 1})
    response = await AsyncClient().get("/astream/")
    assert response.status_code == 200 and response.streaming
    assert holders(r, "throttle:astream") == 1
    assert (await AsyncClient().get("/astream/")).status_code == 503
    body = b"".join([chunk async for chunk in response.streaming_content])
    assert body == b"chunk0\nchunk1\nchunk2\n"
    assert holders(r, "throttle:astream") == 0


def test_custom_throttle_response(get: Any, throttle: Any, r: redis.Redis) -> None:
    rules(throttle, REPORTS, THROTTLE_RESPONSE="tests.test_middleware.custom_throttled")
    assert Semaphore(r, "throttle:reports", 1, ttl=20, wait=0).acquire()
    response = get("/reports/slow/")
    assert response.status_code == 503
    assert response.content == b"custom throttled reports"
    assert "Retry-After" in response


def test_disabled_means_no_throttling(get: Any, throttle: Any, r: redis.Redis) -> None:
    rules(throttle, REPORTS, ENABLED=False)
    assert Semaphore(r, "throttle:reports", 1, ttl=20, wait=0).acquire()
    assert get("/reports/slow/").status_code == 200
    assert get("/deco/").status_code == 200


def test_redis_down_fails_open_by_default(
    get: Any, throttle: Any, caplog: pytest.LogCaptureFixture
) -> None:
    rules(throttle, REPORTS, CLIENT="tests.test_middleware.dead_client")
    with (
        signal_sent(signals.redis_unavailable) as seen,
        caplog.at_level(logging.WARNING, logger="django_redislock.throttle"),
    ):
        response = get("/reports/slow/")
    assert response.status_code == 200
    assert len(seen) == 1 and seen[0]["fail_open"] is True and seen[0]["name"] == "reports"
    assert any("without its 'reports' permit" in rec.getMessage() for rec in caplog.records)


def test_redis_down_fails_closed_when_asked(get: Any, throttle: Any) -> None:
    rules(throttle, REPORTS, CLIENT="tests.test_middleware.dead_client", THROTTLE_FAIL_OPEN=False)
    response = get("/reports/slow/")
    assert response.status_code == 503 and "Retry-After" in response
    assert get("/ok/").status_code == 200


def test_queued_request_gets_permit_when_freed(throttle: Any, r: redis.Redis) -> None:
    rules(throttle, {**REPORTS, "wait": 10})
    occupier = Semaphore(r, "throttle:reports", 1, ttl=60, wait=0)
    assert occupier.acquire()
    statuses: list[int] = []
    t = threading.Thread(target=lambda: statuses.append(Client().get("/reports/slow/").status_code))
    t.start()
    assert wait_until(lambda: r.llen(KS.semaphore("throttle:reports").queue) == 1)
    occupier.release()
    t.join(15)
    assert statuses == [200]


async def test_async_queued_request_gets_permit_when_freed(throttle: Any, r: redis.Redis) -> None:
    rules(throttle, {**REPORTS, "wait": 10})
    occupier = Semaphore(r, "throttle:reports", 1, ttl=60, wait=0)
    assert occupier.acquire()
    task = asyncio.create_task(AsyncClient().get("/reports/aslow/"))
    deadline = time.monotonic() + 10
    while r.llen(KS.semaphore("throttle:reports").queue) != 1:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)
    occupier.release()
    response = await asyncio.wait_for(task, 15)
    assert response.status_code == 200


def test_several_rules_all_apply(get: Any, throttle: Any, r: redis.Redis) -> None:
    rules(
        throttle,
        {"name": "all", "limit": 5},
        {**REPORTS, "per": "ip"},
    )
    assert Semaphore(r, "throttle:reports:ip:127.0.0.1", 1, ttl=20, wait=0).acquire()
    assert get("/reports/slow/").status_code == 429
    # The first rule's permit was given back when the second refused.
    assert holders(r, "throttle:all") == 0
    assert get("/ok/").status_code == 200


def test_bad_rules_are_skipped_not_500(
    get: Any, throttle: Any, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    rules(throttle, {"name": "bad", "path": "([", "limit": 1}, REPORTS)
    assert Semaphore(r, "throttle:reports", 1, ttl=20, wait=0).acquire()
    with caplog.at_level(logging.ERROR, logger="django_redislock.throttle"):
        assert get("/ok/").status_code == 200
        assert get("/reports/slow/").status_code == 503


# -- the decorator ------------------------------------------------------------------------
def test_decorator_limits_view(get: Any, throttle: Any, r: redis.Redis) -> None:
    rules(throttle)
    assert get("/deco/").status_code == 200
    assert holders(r, "throttle:deco") == 0
    assert Semaphore(r, "throttle:deco", 1, ttl=20, wait=0).acquire()
    response = get("/deco/")
    assert response.status_code == 503 and "Retry-After" in response


def test_async_decorated_view_per_ip(get: Any, throttle: Any, r: redis.Redis) -> None:
    rules(throttle)
    assert get("/adeco/").status_code == 200
    assert Semaphore(r, "throttle:adeco:ip:127.0.0.1", 1, ttl=20, wait=0).acquire()
    assert get("/adeco/").status_code == 429


def test_decorated_view_that_raises_releases(get: Any, throttle: Any, r: redis.Redis) -> None:
    rules(throttle)
    assert get("/deco-boom/").status_code == 500
    assert holders(r, "throttle:deco-boom") == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": "2"}, "limit"),
        ({"limit": 1, "per": "planet"}, "per"),
        ({"limit": 1, "per": "no.such.module"}, "cannot be imported"),
        ({"limit": 1, "wait": -1}, "wait"),
        ({"limit": 1, "timeout": 0}, "timeout"),
        ({"limit": 1, "name": ""}, "name"),
    ],
)
def test_decorator_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    name = kwargs.pop("name", "x")
    limit = kwargs.pop("limit")
    with pytest.raises(ValueError, match=match):
        concurrency_limited(name, limit, **kwargs)


# -- system checks -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("throttle_setting", "check_id"),
    [
        ("reports", "E020"),
        (["reports"], "E020"),
        ([{"limit": 1}], "E021"),
        ([{"name": "a", "limit": 1}, {"name": "a", "limit": 2}], "E021"),
        ([{"name": "a", "limit": 1, "paht": "^/x"}], "E022"),
        ([{"name": "a", "limit": 1, "path": "(["}], "E023"),
        ([{"name": "a", "limit": 1, "path": 5}], "E023"),
        ([{"name": "a", "limit": 1, "per": "planet"}], "E024"),
        ([{"name": "a", "limit": 1, "per": "no.such.func"}], "E024"),
        ([{"name": "a"}], "E025"),
        ([{"name": "a", "limit": 0}], "E025"),
        ([{"name": "a", "limit": 1.5}], "E025"),
        ([{"name": "a", "limit": 1, "wait": -1}], "E026"),
        ([{"name": "a", "limit": 1, "wait": "1"}], "E026"),
        ([{"name": "a", "limit": 1, "timeout": 0}], "E027"),
        ([{"name": "a", "limit": 1, "methods": ["GET", 5]}], "E028"),
        ([{"name": "a", "limit": 1, "methods": "G E T"}], "E028"),
        ([{"name": "a", "limit": 1, "url_name": ""}], "E029"),
        ([{"name": "a", "limit": 1, "retry_after": -2}], "E030"),
    ],
)
def test_system_checks(settings: Any, throttle_setting: Any, check_id: str) -> None:
    settings.REDISLOCK = {"THROTTLE": throttle_setting}
    messages = [
        m
        for m in check_settings()
        if m.id.startswith("django_redislock.E02") or m.id == "django_redislock.E030"
    ]
    assert [m.id for m in messages] == [f"django_redislock.{check_id}"]
    assert isinstance(messages[0], Error) and messages[0].hint


def test_valid_rules_pass_checks(settings: Any) -> None:
    settings.REDISLOCK = {
        "THROTTLE": [
            REPORTS,
            {
                "name": "b",
                "url_name": ["x", "ns:y"],
                "methods": ["GET"],
                "limit": 3,
                "per": "user",
                "wait": 1.5,
                "timeout": 10,
                "retry_after": 2,
            },
            {"name": "c", "limit": 1, "per": "tests.testapp.views_throttle.client_key"},
        ]
    }
    assert check_settings() == []


# -- throttling handles come from the same factory as locks -----------------------------
def test_replicas_apply_to_throttling(get: Any, throttle: Any, r: redis.Redis) -> None:
    # The test server has no replica: with REPLICAS=1 no permit is acknowledged,
    # so it is given back and the request is refused as Redis unavailable.
    from django_redislock import ReplicationTimeout

    rules(throttle, REPORTS, REPLICAS=1, REPLICAS_TIMEOUT=0.05, THROTTLE_FAIL_OPEN=False)
    with signal_sent(signals.redis_unavailable) as seen:
        response = get("/reports/slow/")
    assert response.status_code == 503
    assert len(seen) == 1 and isinstance(seen[0]["error"], ReplicationTimeout), seen
    assert holders(r, "throttle:reports") == 0
    rules(throttle, REPORTS, THROTTLE_FAIL_OPEN=False)
    assert get("/reports/slow/").status_code == 200


def test_eviction_policy_is_checked_for_throttling(
    get: Any, throttle: Any, redis_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    server = redis_factory(
        port=free_port(), unix=False, extra=("--maxmemory-policy", "allkeys-lru")
    ).start()
    throttle.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": server.url,
            "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
        }
    }
    rules(throttle, REPORTS)
    connection.reset()
    caplog.set_level(logging.WARNING, logger="django_redislock.connection")
    assert get("/reports/slow/").status_code == 200
    for thread in list(connection._eviction_checks.values()):
        thread.join(10)
    warned = [rec for rec in caplog.records if "allkeys-lru" in rec.getMessage()]
    assert len(warned) == 1, caplog.records
