"""Who the caller is: one answer for throttling rules, ``concurrency_limited`` and idempotency.

A real DRF project: token, session and a JWT-style bearer authentication class
of the project's own, each on its ``APIView``; a plain view; a DRF view that
reads its API key by itself. ``per: "user"`` rules in the middleware count the
user the view will authenticate, not the shared address; credentials nothing
accepts are refused, not counted per address; ``REDISLOCK["CALLER"]`` names
such callers. ``concurrency_limited`` works on handler methods of Django's
``View``, DRF's ``APIView`` and viewset actions, sync and async.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib.auth import get_user_model
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import AsyncClient, Client, override_settings
from django.urls import include, path
from django.views import View
from django.views.decorators.csrf import csrf_exempt
from rest_framework import viewsets
from rest_framework.authentication import (
    BaseAuthentication,
    SessionAuthentication,
    TokenAuthentication,
)
from rest_framework.authtoken.models import Token
from rest_framework.decorators import action
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter
from rest_framework.views import APIView

from django_redislock import connection
from django_redislock.caller import CallerUnknown, caller_of
from django_redislock.idempotency import REPLAYED_HEADER, idempotent
from django_redislock.middleware import concurrency_limited
from django_redislock.testing import hold_permits
from tests.test_decorators import close_async_clients

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(transaction=True)]

MW = "django_redislock.middleware.ConcurrencyLimitMiddleware"


class BearerAuthentication(BaseAuthentication):
    """A JWT-style class: ``Authorization: Bearer <token>``, here the user's name."""

    def authenticate(self, request: Any) -> tuple[Any, str] | None:
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            return None
        try:
            user = get_user_model().objects.get(username=header.removeprefix("Bearer "))
        except get_user_model().DoesNotExist:
            raise AuthenticationFailed("Unknown bearer token.") from None
        return user, header

    def authenticate_header(self, request: Any) -> str:
        return "Bearer"


class Export(APIView):
    authentication_classes = [TokenAuthentication]
    permission_classes = [IsAuthenticated]

    def get(self, request: Any) -> Response:
        return Response({"user": request.user.username})


class BearerExport(Export):
    authentication_classes = [BearerAuthentication]


class SessionExport(Export):
    authentication_classes = [SessionAuthentication]


class SelfChecked(APIView):
    """Reads its API key by itself: no DRF authentication class takes it."""

    authentication_classes: list[type] = []
    permission_classes = [AllowAny]

    def get(self, request: Any) -> Response:
        return Response({"account": request.headers.get("X-Api-Key")})


def plain(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True})


@csrf_exempt
@idempotent
def charge(request: HttpRequest) -> HttpResponse:
    charges.append(request.headers.get("X-Api-Key", ""))
    return JsonResponse({"charge": len(charges)}, status=201)


charges: list[str] = []


# -- concurrency_limited on handler methods ------------------------------------------------
class LimitedExport(Export):
    @concurrency_limited("api-export", 1, per="user")
    def get(self, request: Any) -> Response:
        if request.GET.get("boom"):
            raise ValueError("boom")
        return Response({"user": request.user.username})


class LimitedViewSet(viewsets.ViewSet):
    authentication_classes = [TokenAuthentication]
    permission_classes = [IsAuthenticated]

    @concurrency_limited("api-list", 1, per="user")
    def list(self, request: Any) -> Response:
        return Response({"user": request.user.username})

    @action(detail=True, methods=["get"])
    @concurrency_limited("api-report", 1, per="user")
    def report(self, request: Any, pk: str) -> Response:
        return Response({"user": request.user.username, "pk": pk})


class LimitedView(View):
    @concurrency_limited("page", 1, per="user")
    def get(self, request: HttpRequest) -> HttpResponse:
        return JsonResponse({"user": request.user.username})


class AsyncLimitedView(View):
    @concurrency_limited("apage", 1, per="user")
    async def get(self, request: HttpRequest) -> HttpResponse:
        user = await request.auser()
        return JsonResponse({"user": user.username})


router = SimpleRouter()
router.register("sets", LimitedViewSet, basename="sets")

urlpatterns = [
    path("exports/token/", Export.as_view()),
    path("exports/bearer/", BearerExport.as_view()),
    path("exports/session/", SessionExport.as_view()),
    path("exports/self-checked/", SelfChecked.as_view()),
    path("exports/plain/", plain),
    path("charge/", charge),
    path("limited/export/", LimitedExport.as_view()),
    # In front of the whole view: the DRF view's authentication is run to find the user.
    path("limited/outer/", concurrency_limited("api-outer", 1, per="user")(Export.as_view())),
    path("limited/page/", LimitedView.as_view()),
    path("limited/apage/", AsyncLimitedView.as_view()),
    path("limited/", include(router.urls)),
]

RULE = {"name": "exports", "path": r"^/exports/", "limit": 1, "per": "user"}


@pytest.fixture(autouse=True)
def _fresh_clients() -> Iterator[None]:
    connection.reset()
    yield
    connection.reset()


@pytest.fixture
def throttled() -> Iterator[None]:
    with override_settings(
        MIDDLEWARE=[*settings.MIDDLEWARE, MW],
        REDISLOCK={**settings.REDISLOCK, "THROTTLE": [RULE]},
    ):
        yield


@pytest.fixture(params=["client", "async_client"])
def send(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """GET ``url`` from one address (127.0.0.1), with headers and a session's cookies."""

    def sync_send(url: str, headers: dict[str, str] | None = None, cookies: Any = None) -> Any:
        client = Client(raise_request_exception=False)
        if cookies is not None:
            client.cookies = cookies
        return client.get(url, headers=headers or {})

    def async_send(url: str, headers: dict[str, str] | None = None, cookies: Any = None) -> Any:
        async def go() -> Any:
            client = AsyncClient(raise_request_exception=False)
            if cookies is not None:
                client.cookies = cookies
            try:
                return await client.get(url, headers=headers or {})
            finally:
                await close_async_clients()

        return async_to_sync(go)()

    return sync_send if request.param == "client" else async_send


@pytest.fixture
def users() -> dict[str, Any]:
    return {
        name: get_user_model().objects.create_user(name, password="pw") for name in ("alice", "bob")
    }


def credentials(kind: str, user: Any) -> dict[str, Any]:
    """The headers (and cookies) ``user`` authenticates with, in ``kind``."""
    if kind == "token":
        token = Token.objects.create(user=user)
        return {"headers": {"Authorization": f"Token {token.key}"}}
    if kind == "bearer":
        return {"headers": {"Authorization": f"Bearer {user.username}"}}
    client = Client()
    client.force_login(user)
    return {"cookies": client.cookies}


@pytest.mark.parametrize("kind", ["token", "bearer", "session"])
def test_two_users_from_one_address_one_limited_the_other_not(
    kind: str, send: Any, users: dict[str, Any], throttled: None
) -> None:
    """Fails before this change for token and bearer authentication: the middleware
    runs before DRF authenticates, so both users were one address's requests."""
    alice, bob = (credentials(kind, users[name]) for name in ("alice", "bob"))
    url = f"/exports/{kind}/"
    with hold_permits(f"throttle:exports:user:u:{users['alice'].pk}", 1):
        refused = send(url, **alice)
        served = send(url, **bob)
    assert refused.status_code == 429
    assert served.status_code == 200, served.content
    assert served.json() == {"user": "bob"}
    # The address's own semaphore is not theirs: holding it refuses neither.
    with hold_permits("throttle:exports:user:ip:127.0.0.1", 1):
        assert send(url, **alice).json() == {"user": "alice"}
        assert send(url, **bob).json() == {"user": "bob"}
        assert send("/exports/plain/").status_code == 429  # an anonymous client


@pytest.mark.parametrize("kind", ["token", "bearer"])
def test_a_bad_token_is_answered_by_drf_and_takes_no_permit(
    kind: str, send: Any, throttled: None, r: redis.Redis
) -> None:
    header = "Token not-a-token" if kind == "token" else "Bearer nobody"
    with hold_permits("throttle:exports:user:ip:127.0.0.1", 1):
        response = send(f"/exports/{kind}/", {"Authorization": header})
    assert response.status_code == 401


@pytest.mark.parametrize(
    ("url", "header"),
    [
        ("/exports/plain/", "Authorization"),
        ("/exports/plain/", "X-Api-Key"),
        ("/exports/self-checked/", "X-Api-Key"),
        # Credentials of a kind the view's authentication classes do not take.
        ("/exports/token/", "X-Api-Key"),
    ],
)
def test_credentials_nothing_accepts_are_refused_not_counted_per_address(
    url: str, header: str, send: Any, throttled: None
) -> None:
    """Fails before this change: counted per address, whoever sent them."""
    response = send(url, {header: "someone-elses-key"})
    if url == "/exports/token/":
        # A view that needs a user answers an anonymous request by itself.
        assert response.status_code == 401
        return
    assert response.status_code == 500
    assert "Retry-After" not in response
    assert response["Content-Type"] == "application/problem+json"
    problem = json.loads(response.content)
    assert problem["code"] == "caller_unknown"
    assert problem["detail"].startswith("The server cannot tell who sent")


def caller_by_api_key(request: Any) -> str | None:
    return request.headers.get("X-Api-Key")


def test_the_caller_setting_names_clients_the_library_cannot_see(send: Any) -> None:
    named = {**settings.REDISLOCK, "THROTTLE": [RULE], "CALLER": f"{__name__}.caller_by_api_key"}
    with (
        override_settings(MIDDLEWARE=[*settings.MIDDLEWARE, MW], REDISLOCK=named),
        hold_permits("throttle:exports:user:c:acme", 1),
    ):
        assert send("/exports/self-checked/", {"X-Api-Key": "acme"}).status_code == 429
        assert send("/exports/self-checked/", {"X-Api-Key": "other"}).json() == {"account": "other"}
        assert send("/exports/plain/").status_code == 200  # None: the address


def test_the_caller_setting_scopes_idempotency_keys_too() -> None:
    charges.clear()

    def post(api_key: str) -> Any:
        return Client(raise_request_exception=False).post(
            "/charge/", headers={"Idempotency-Key": "same", "X-Api-Key": api_key}
        )

    assert post("acme").status_code == 500  # credentials nothing here accepts
    named = {**settings.REDISLOCK, "CALLER": f"{__name__}.caller_by_api_key"}
    with override_settings(REDISLOCK=named):
        assert post("acme").json() == {"charge": 1}
        assert post("other").json() == {"charge": 2}
        assert post("acme")[REPLAYED_HEADER] == "true"
    assert charges == ["acme", "other"]


def test_caller_of_sees_what_the_view_will_see(users: dict[str, Any], rf: Any) -> None:
    """One function answers for the middleware, the decorators and the idempotency scope."""
    token = Token.objects.create(user=users["alice"])
    request = rf.get("/exports/token/", headers={"Authorization": f"Token {token.key}"})
    view = Export.as_view()
    assert caller_of(request, view) == f"u:{users['alice'].pk}"
    assert caller_of(rf.get("/"), view) == "ip:127.0.0.1"
    with pytest.raises(CallerUnknown):
        caller_of(rf.get("/", headers={"X-Api-Key": "k"}))


# -- concurrency_limited on handlers ---------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("/limited/export/", "api-export"),
        ("/limited/sets/", "api-list"),
        ("/limited/sets/7/report/", "api-report"),
        ("/limited/outer/", "api-outer"),
    ],
)
def test_concurrency_limited_on_drf_handlers_counts_per_user(
    url: str, rule: str, send: Any, users: dict[str, Any]
) -> None:
    """Fails before this change: AttributeError (the view instance has no META), a 500."""
    alice, bob = (credentials("token", users[name]) for name in ("alice", "bob"))
    with hold_permits(f"throttle:{rule}:user:u:{users['alice'].pk}", 1):
        refused = send(url, **alice)
        served = send(url, **bob)
    assert refused.status_code == 429 and refused["Retry-After"] == "1"
    assert served.status_code == 200 and served.json()["user"] == "bob"
    assert send(url, **alice).json()["user"] == "alice"


@pytest.mark.parametrize(
    ("url", "rule"), [("/limited/page/", "page"), ("/limited/apage/", "apage")]
)
def test_concurrency_limited_on_django_view_handlers(
    url: str, rule: str, send: Any, users: dict[str, Any]
) -> None:
    alice, bob = (credentials("session", users[name]) for name in ("alice", "bob"))
    with hold_permits(f"throttle:{rule}:user:u:{users['alice'].pk}", 1):
        assert send(url, **alice).status_code == 429
        assert send(url, **bob).json() == {"user": "bob"}
    assert send(url, **alice).json() == {"user": "alice"}


def test_a_handler_that_raises_gives_its_permit_back(
    send: Any, users: dict[str, Any], r: redis.Redis
) -> None:
    alice = credentials("token", users["alice"])
    assert send("/limited/export/?boom=1", **alice).status_code == 500
    assert send("/limited/export/", **alice).status_code == 200
