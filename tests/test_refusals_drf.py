"""Every refusal the library makes inside a DRF view goes through DRF's exception handling.

A project's own ``EXCEPTION_HANDLER`` (here one that wraps every error in an
envelope of its own) renders a busy lock, Redis unavailable, each idempotency
refusal and a throttled request like any other DRF error, with ``Retry-After``
from ``wait``; in every form of DRF view: ``APIView``, a viewset's ``@action``,
``@api_view`` and a generic view; for the idempotency refusals also before
DRF's dispatch (the middleware, ``@idempotent`` around ``as_view()``), where
the view's own exception handling is called. Nothing to opt into. DRF runs no async
handler, so these are sync only.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connections
from django.test import Client, override_settings
from django.urls import include, path
from django.utils.decorators import method_decorator
from rest_framework import exceptions, generics, viewsets
from rest_framework.decorators import action, api_view, authentication_classes, permission_classes
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter
from rest_framework.views import APIView
from rest_framework.views import exception_handler as drf_exception_handler

from django_redislock import concurrency_limited, redis_locked
from django_redislock.contrib.drf import (
    ConcurrencyThrottled,
    IdempotencyRefused,
    LockBusy,
    LockUnavailable,
)
from django_redislock.core.drivers.semaphore import Semaphore
from django_redislock.idempotency import MIDDLEWARE_PATH, idempotent
from tests.test_decorators import dead_redis, held  # noqa: F401 (fixtures)

pytestmark = pytest.mark.urls("tests.test_refusals_drf")

duplicates: list[Any] = []


def envelope(exc: Exception, context: dict[str, Any]) -> Response | None:
    """A project's handler: its own envelope around DRF's answer."""
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(exc, exceptions.APIException):
        response.data = {
            "error": {
                "kind": type(exc).__name__,
                "code": exc.get_codes(),
                "message": str(exc.detail),
                "throttle": isinstance(exc, exceptions.Throttled),
            }
        }
    return response


def _handle(request: Any, pk: Any) -> Response:
    if request.data.get("duplicate"):
        # The same request again while this one runs: from another thread, as
        # another worker would send it.
        def send() -> None:
            try:
                duplicates.append(_post(request.path, request.data, request.headers))
            finally:
                connections.close_all()

        thread = threading.Thread(target=send)
        thread.start()
        thread.join(30)
    return Response({"pk": str(pk), "api_key": request.headers.get("X-Api-Key")}, status=201)


# Two: a duplicate sent while the first runs must reach the idempotency check.
LIMIT_OF = 2
# Throttled, then idempotent, then locked: each refusal can happen in one handler.
LIMIT = method_decorator(concurrency_limited("drf-refusals", LIMIT_OF))


class Open:
    authentication_classes: list[type] = []
    permission_classes = [AllowAny]


class Plain(Open, APIView):
    @LIMIT
    @idempotent
    @redis_locked("drf:{pk}", wait=0)
    def post(self, request: Any, pk: str) -> Response:
        return _handle(request, pk)


class Orders(Open, viewsets.ViewSet):
    @action(detail=True, methods=["post"])
    @LIMIT
    @idempotent
    @redis_locked("drf:{pk}", wait=0)
    def ship(self, request: Any, pk: str) -> Response:
        return _handle(request, pk)


class Generic(Open, generics.GenericAPIView):
    @LIMIT
    @idempotent
    @redis_locked("drf:{pk}", wait=0)
    def post(self, request: Any, pk: str) -> Response:
        return _handle(request, pk)


@api_view(["POST"])
@authentication_classes([])
@permission_classes([AllowAny])
@concurrency_limited("drf-refusals", LIMIT_OF)
@idempotent
@redis_locked("drf:{pk}", wait=0)
def function(request: Any, pk: str) -> Response:
    return _handle(request, pk)


class Bare(Open, APIView):
    """Served by the idempotency middleware, or by @idempotent around as_view()."""

    def post(self, request: Any, pk: str) -> Response:
        return _handle(request, pk)


router = SimpleRouter()
router.register("viewset", Orders, basename="orders")

urlpatterns = [
    path("apiview/<pk>/", Plain.as_view()),
    path("generic/<pk>/", Generic.as_view()),
    path("function/<pk>/", function),
    path("mw/<pk>/", Bare.as_view()),
    path("outer/<pk>/", idempotent(Bare.as_view())),
    path("locked/<pk>/", redis_locked("drf:{pk}", wait=0)(Bare.as_view())),
    path("limited/<pk>/", concurrency_limited("drf-refusals", LIMIT_OF)(Bare.as_view())),
    path("", include(router.urls)),
]

FORMS = {
    "apiview": "/apiview/1/",
    "viewset": "/viewset/1/ship/",
    "generic": "/generic/1/",
    "function": "/function/1/",
}
# Keys checked before DRF's dispatch: by the middleware, or around as_view().
BEFORE_DISPATCH = {"middleware": "/mw/1/", "outer": "/outer/1/"}


def _post(url: str, data: Any = None, headers: Any = None) -> Any:
    sent = {k: v for k, v in dict(headers or {}).items() if k in ("Idempotency-Key", "X-Api-Key")}
    return Client(raise_request_exception=False).post(
        url, data or {}, content_type="application/json", headers=sent
    )


@pytest.fixture(autouse=True)
def _project_handler() -> Iterator[None]:
    duplicates.clear()
    with override_settings(
        REST_FRAMEWORK={"EXCEPTION_HANDLER": f"{__name__}.envelope"},
        MIDDLEWARE=[*settings.MIDDLEWARE, MIDDLEWARE_PATH],
        REDISLOCK={**settings.REDISLOCK, "IDEMPOTENCY": {"PATHS": ["^/mw/"]}},
    ):
        yield


@pytest.fixture(params=list(FORMS))
def url(request: pytest.FixtureRequest) -> str:
    return FORMS[request.param]


@pytest.fixture(params=[*FORMS, *BEFORE_DISPATCH])
def keyed_url(request: pytest.FixtureRequest) -> str:
    """Every form for the idempotency refusals, the middleware's too."""
    return {**FORMS, **BEFORE_DISPATCH}[request.param]


def _error(response: Any) -> dict[str, Any]:
    body = response.json()
    assert list(body) == ["error"], body  # the project's envelope, nothing of ours
    assert response["Content-Type"] == "application/json"
    error: dict[str, Any] = body["error"]
    return error


@pytest.fixture(params=[*FORMS, "locked"])
def locked_url(request: pytest.FixtureRequest) -> str:
    """Every form for a lock's refusals, a lock around the whole as_view() too."""
    return {**FORMS, "locked": "/locked/1/"}[request.param]


def test_a_busy_lock_is_the_projects_409(locked_url: str, held: Any) -> None:  # noqa: F811
    held("drf:1", timeout=20)
    response = _post(locked_url)
    assert response.status_code == 409
    assert 1 <= int(response["Retry-After"]) <= 20
    error = _error(response)
    assert (error["kind"], error["code"]) == (LockBusy.__name__, "lock_busy")
    assert error["message"] == "This resource is busy; try again shortly."


def test_redis_unavailable_is_the_projects_503(locked_url: str, dead_redis: None) -> None:  # noqa: F811
    response = _post(locked_url)
    assert response.status_code == 503
    assert int(response["Retry-After"]) >= 1
    error = _error(response)
    assert (error["kind"], error["code"]) == (LockUnavailable.__name__, "lock_unavailable")


def test_a_key_reused_for_another_body_is_the_projects_422(keyed_url: str) -> None:
    assert _post(keyed_url, {"n": 1}, {"Idempotency-Key": "k"}).status_code == 201
    response = _post(keyed_url, {"n": 2}, {"Idempotency-Key": "k"})
    assert response.status_code == 422
    assert not response.has_header("Retry-After")  # the same key will never do
    error = _error(response)
    assert (error["kind"], error["code"]) == (IdempotencyRefused.__name__, "idempotency_key_reused")


def test_a_duplicate_in_flight_is_the_projects_409(keyed_url: str) -> None:
    first = _post(keyed_url, {"duplicate": True}, {"Idempotency-Key": "d"})
    assert first.status_code == 201
    (duplicate,) = duplicates
    assert duplicate.status_code == 409
    assert int(duplicate["Retry-After"]) >= 1
    error = _error(duplicate)
    assert (error["kind"], error["code"]) == (IdempotencyRefused.__name__, "idempotency_key_in_use")


def test_an_unknown_scope_is_the_projects_500(keyed_url: str) -> None:
    """Credentials no authentication class read: the key cannot be scoped per user."""
    response = _post(keyed_url, {}, {"Idempotency-Key": "s", "X-Api-Key": "alice"})
    assert response.status_code == 500
    error = _error(response)
    assert (error["kind"], error["code"]) == (
        IdempotencyRefused.__name__,
        "idempotency_scope_unknown",
    )
    assert "X-Api-Key header" in error["message"]


def test_a_missing_key_where_one_is_required_is_the_projects_400(keyed_url: str) -> None:
    required = {**settings.REDISLOCK, "IDEMPOTENCY": {"PATHS": ["^/mw/"], "REQUIRED": True}}
    with override_settings(REDISLOCK=required):
        response = _post(keyed_url)
    assert response.status_code == 400
    assert _error(response)["code"] == "idempotency_key_missing"


@pytest.mark.parametrize("url", [*FORMS.values(), "/limited/1/"])
def test_a_throttled_request_is_the_projects_throttle(url: str, r: redis.Redis) -> None:
    occupiers = [Semaphore(r, "throttle:drf-refusals", LIMIT_OF, ttl=20, wait=0) for _ in "ab"]
    assert all(occupier.acquire() for occupier in occupiers)
    try:
        response = _post(url)
    finally:
        for occupier in occupiers:
            occupier.release()
    assert response.status_code == 503  # a global rule; 429 per client
    assert response["Retry-After"] == "1"
    error = _error(response)
    assert (error["kind"], error["code"]) == (ConcurrencyThrottled.__name__, "throttled")
    assert error["throttle"] is True  # a DRF Throttled, for handlers that look for one
    assert _post(url).status_code == 201


def test_drf_default_handler_gives_detail_and_code() -> None:
    """Without a project handler, DRF's own: ``{"detail": ...}`` and Retry-After."""
    with override_settings(REST_FRAMEWORK={}):
        assert _post("/function/1/", {"n": 1}, {"Idempotency-Key": "x"}).status_code == 201
        response = _post("/function/1/", {"n": 2}, {"Idempotency-Key": "x"})
    assert response.status_code == 422
    assert list(response.json()) == ["detail"]


def test_the_response_settings_leave_drf_views_to_the_exception_handler(held: Any) -> None:  # noqa: F811
    """``BUSY_RESPONSE`` shapes answers outside DRF views only."""
    held("drf:1", timeout=20)
    custom = {**settings.REDISLOCK, "BUSY_RESPONSE": "tests.test_decorators.custom_busy"}
    with override_settings(REDISLOCK=custom):
        response = _post("/apiview/1/")
    assert response.status_code == 409
    assert _error(response)["code"] == "lock_busy"


def test_the_middleware_under_asgi_renders_through_the_drf_view() -> None:
    """An ASGI request: the middleware serves the sync DRF view in a thread, and
    hands its refusal to the view's exception handling there."""
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    async def post(body: str) -> Any:
        return await AsyncClient().post(
            "/mw/1/", body, content_type="application/json", headers={"Idempotency-Key": "a"}
        )

    assert async_to_sync(post)('{"n": 1}').status_code == 201
    response = async_to_sync(post)('{"n": 2}')
    assert response.status_code == 422
    assert _error(response)["code"] == "idempotency_key_reused"


def test_a_refusal_raised_for_drf_is_counted() -> None:
    """Raising ends the call: the metrics count the refusal before it is raised."""
    from prometheus_client import REGISTRY

    from django_redislock import connection

    labels = {"name": f"idempotent:{__name__}.function", "outcome": "refused"}

    def refused() -> float:
        return REGISTRY.get_sample_value("redislock_idempotency_keys_total", labels) or 0.0

    connection.reset()
    try:
        with override_settings(REDISLOCK={**settings.REDISLOCK, "METRICS": ["prometheus"]}):
            before = refused()
            assert _post("/function/1/", {"n": 1}, {"Idempotency-Key": "m"}).status_code == 201
            assert _post("/function/1/", {"n": 2}, {"Idempotency-Key": "m"}).status_code == 422
            assert refused() == before + 1
    finally:
        connection.reset()
