"""Idempotency keys in front of Django REST framework views: real DRF, real token auth.

* ``@idempotent`` on an ``APIView`` handler returning a DRF ``Response`` (which
  has no renderer until DRF finalizes it) stores and replays it.
* Keys are per user as DRF authenticates them (``TokenAuthentication``), for
  the middleware and for the decorator in front of the whole view: two users
  sending the same key and body from one address each get their own run.
* A plain view whose request carries an ``Authorization`` header Django
  cannot read is refused, never scoped by the (shared) address; so is a DRF
  view that lets anonymous requests in and reads its credentials by itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import AsyncClient, Client, override_settings
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.parsers import MultiPartParser
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from django_redislock.idempotency import MIDDLEWARE_PATH, REPLAYED_HEADER, idempotent
from tests.test_idempotency import records

pytestmark = [pytest.mark.urls("tests.test_idempotency_drf"), pytest.mark.django_db]

runs: list[str] = []


class Charge(APIView):
    authentication_classes = [TokenAuthentication]
    permission_classes = [IsAuthenticated]

    def post(self, request: Any) -> Response:
        runs.append(f"charge {request.user.username}")
        return Response({"user": request.user.username, "run": len(runs)}, status=201)


class DecoratedCharge(Charge):
    @idempotent
    def post(self, request: Any) -> Response:
        return super().post(request)


@api_view(["POST"])
@authentication_classes([TokenAuthentication])
@permission_classes([IsAuthenticated])
@idempotent
def charge_function(request: Any) -> Response:
    runs.append(f"function {request.user.username}")
    return Response({"user": request.user.username}, status=201)


class SelfChecked(APIView):
    """Reads its API key by itself: no DRF authentication class takes it."""

    authentication_classes: list[type] = []
    permission_classes = [AllowAny]

    def post(self, request: Any) -> Response:
        runs.append(f"self-checked {request.headers['X-Api-Key']}")
        return Response({"account": request.headers["X-Api-Key"]}, status=201)


class DecoratedSelfChecked(SelfChecked):
    @idempotent
    def post(self, request: Any) -> Response:
        return super().post(request)


@api_view(["POST"])
@authentication_classes([])
@permission_classes([AllowAny])
@idempotent
def self_checked_function(request: Any) -> Response:
    runs.append(f"self-checked {request.headers['X-Api-Key']}")
    return Response({"account": request.headers["X-Api-Key"]}, status=201)


class Receipt(APIView):
    """Parses a multipart upload with DRF's parser (Django's, behind DRF's stream)."""

    authentication_classes: list[type] = []
    permission_classes = [AllowAny]
    parser_classes = [MultiPartParser]

    def post(self, request: Any) -> Response:
        runs.append("receipt")
        upload = request.data["file"]
        digest = hashlib.sha256()
        for chunk in upload.chunks():
            digest.update(chunk)
        return Response({"size": upload.size, "sha256": digest.hexdigest()}, status=201)


class DecoratedReceipt(Receipt):
    @idempotent
    def post(self, request: Any) -> Response:
        return super().post(request)


@csrf_exempt
def plain(request: HttpRequest) -> HttpResponse:
    runs.append("plain")
    return JsonResponse({"ok": True}, status=201)


urlpatterns = [
    path("mw/charge/", Charge.as_view()),
    path("mw/plain/", plain),
    path("handler/charge/", DecoratedCharge.as_view()),
    path("function/charge/", charge_function),
    path("outer/charge/", idempotent(Charge.as_view())),
    path("mw/self-checked/", SelfChecked.as_view()),
    path("handler/self-checked/", DecoratedSelfChecked.as_view()),
    path("function/self-checked/", self_checked_function),
    path("outer/self-checked/", idempotent(SelfChecked.as_view())),
    path("mw/receipt/", Receipt.as_view()),
    path("handler/receipt/", DecoratedReceipt.as_view()),
    path("outer/receipt/", idempotent(Receipt.as_view())),
]


@pytest.fixture(autouse=True)
def _settings() -> Iterator[None]:
    runs.clear()
    with override_settings(
        MIDDLEWARE=[*settings.MIDDLEWARE, MIDDLEWARE_PATH],
        REDISLOCK={**settings.REDISLOCK, "IDEMPOTENCY": {"PATHS": ["^/mw/"]}},
    ):
        yield


@pytest.fixture
def token(django_user_model: Any) -> Callable[[str], str]:
    def make(username: str) -> str:
        user = django_user_model.objects.create(username=username)
        return str(Token.objects.create(user=user).key)

    return make


@pytest.fixture(params=["client", "async_client"])
def send(request: pytest.FixtureRequest) -> Callable[..., Any]:
    def sync_send(url: str, auth: str | None, key: str = "same-key") -> Any:
        headers = {"Idempotency-Key": key}
        if auth is not None:
            headers["Authorization"] = auth
        return Client(raise_request_exception=False).post(
            url, '{"amount": 5}', content_type="application/json", headers=headers
        )

    def async_send(url: str, auth: str | None, key: str = "same-key") -> Any:
        from asgiref.sync import async_to_sync

        headers = {"Idempotency-Key": key}
        if auth is not None:
            headers["Authorization"] = auth

        async def go() -> Any:
            return await AsyncClient(raise_request_exception=False).post(
                url, '{"amount": 5}', content_type="application/json", headers=headers
            )

        return async_to_sync(go)()

    return sync_send if request.param == "client" else async_send


URLS = ["/mw/charge/", "/handler/charge/", "/function/charge/", "/outer/charge/"]


@pytest.mark.parametrize("url", URLS)
def test_two_token_users_with_one_key_from_one_address_each_run_once(
    url: str, send: Any, token: Any
) -> None:
    """Fails before this change for the middleware and the outer decorator (the second
    user got the first one's stored response) and for the handler decorator (500)."""
    alice, bob = f"Token {token('alice')}", f"Token {token('bob')}"
    first_alice = send(url, alice)
    first_bob = send(url, bob)
    assert first_alice.status_code == first_bob.status_code == 201
    assert first_alice.json()["user"] == "alice"
    assert first_bob.json()["user"] == "bob"
    assert REPLAYED_HEADER not in first_bob
    again_alice, again_bob = send(url, alice), send(url, bob)
    assert again_alice[REPLAYED_HEADER] == again_bob[REPLAYED_HEADER] == "true"
    assert again_alice.content == first_alice.content
    assert again_bob.content == first_bob.content
    assert sorted(runs) == sorted(set(runs)) and len(runs) == 2


def test_a_drf_response_from_a_decorated_handler_is_stored_and_replayed(
    send: Any, token: Any, r: redis.Redis
) -> None:
    """Fails before this change: an AssertionError (no renderer yet), a 500 after the
    work ran, nothing stored, and every retry ran the work again."""
    alice = f"Token {token('alice')}"
    first = send("/handler/charge/", alice)
    assert first.status_code == 201
    assert first["Content-Type"] == "application/json"
    assert first.json() == {"user": "alice", "run": 1}
    again = send("/handler/charge/", alice)
    assert again.content == first.content
    assert again["Content-Type"] == "application/json"
    assert again[REPLAYED_HEADER] == "true"
    assert runs == ["charge alice"]
    assert len(records(r)) == 1


@pytest.mark.parametrize("url", URLS)
def test_a_bad_token_is_answered_by_drf_and_runs_nothing(
    url: str, send: Any, r: redis.Redis
) -> None:
    response = send(url, "Token not-a-token")
    assert response.status_code == 401
    assert runs == []
    assert records(r) == []


@pytest.mark.parametrize("url", URLS)
def test_credentials_no_authentication_class_accepts_are_left_to_the_view(
    url: str, send: Any, r: redis.Redis
) -> None:
    """A token of a kind the view does not take ("Bearer" to TokenAuthentication)
    on a view that needs a user: DRF answers 401 by itself, nothing runs."""
    response = send(url, "Bearer someone-elses-token")
    assert response.status_code == 401
    assert runs == []
    assert records(r) == []


@pytest.mark.parametrize("form", ["mw", "handler", "function", "outer"])
def test_a_drf_view_that_reads_its_credentials_itself_is_refused_not_scoped_by_address(
    form: str, r: redis.Redis
) -> None:
    """Two accounts, one key and body, one address, a DRF view that lets anonymous
    requests in and reads the API key by itself: before this change the second
    account received the first one's stored response (scoped by the address)."""

    def post(api_key: str) -> Any:
        return Client(raise_request_exception=False).post(
            f"/{form}/self-checked/",
            '{"amount": 5}',
            content_type="application/json",
            headers={"Idempotency-Key": "same-key", "X-Api-Key": api_key},
        )

    for api_key in ("alice-key", "bob-key"):
        refused = post(api_key)
        assert refused.status_code == 500
        # Every form, the middleware's too: rendered by DRF's exception handler.
        assert list(refused.json()) == ["detail"]
        assert "X-Api-Key header" in refused.json()["detail"]
    assert runs == []
    assert records(r) == []
    # A callable that names the account scopes each to its own key.
    scoped = {"IDEMPOTENCY": {"PATHS": ["^/mw/"], "SCOPE": f"{__name__}.scope_by_api_key"}}
    with override_settings(REDISLOCK={**settings.REDISLOCK, **scoped}):
        assert post("alice-key").json() == {"account": "alice-key"}
        assert post("bob-key").json() == {"account": "bob-key"}
        assert post("bob-key")[REPLAYED_HEADER] == "true"
    assert runs == ["self-checked alice-key", "self-checked bob-key"]


def scope_by_api_key(request: Any) -> str:
    return request.headers["X-Api-Key"]


def test_a_header_django_cannot_read_is_refused_not_scoped_by_address(
    send: Any, r: redis.Redis
) -> None:
    """A plain view behind the middleware, an API token Django does not know: the
    user cannot be known, and the shared address must not stand in for him."""
    response = send("/mw/plain/", "Bearer someone-elses-token")
    assert response.status_code == 500
    assert response.json()["error"] == "idempotency_scope_unknown"
    assert "SCOPE" in response.json()["detail"]
    assert runs == []
    assert records(r) == []
    # Without credentials the request is anonymous, scoped by its address.
    assert send("/mw/plain/", None).status_code == 201
    assert send("/mw/plain/", None)[REPLAYED_HEADER] == "true"


def scope_by_header(request: Any) -> str:
    return request.headers["Authorization"]


def test_a_scope_callable_names_the_client(send: Any) -> None:
    scoped = {"IDEMPOTENCY": {"PATHS": ["^/mw/"], "SCOPE": f"{__name__}.scope_by_header"}}
    with override_settings(REDISLOCK={**settings.REDISLOCK, **scoped}):
        assert send("/mw/plain/", "Bearer a").status_code == 201
        assert REPLAYED_HEADER not in send("/mw/plain/", "Bearer b")
        assert send("/mw/plain/", "Bearer a")[REPLAYED_HEADER] == "true"
    assert runs == ["plain", "plain"]


def test_every_credential_header_is_refused_not_scoped_by_address(r: redis.Redis) -> None:
    """Not only Authorization: an API key header (a default), and a header the project
    names, on a plain view that authenticates by itself (fails before this change:
    both were scoped by the shared address)."""

    def post(header: str, value: str) -> Any:
        return Client(raise_request_exception=False).post(
            "/mw/plain/",
            '{"amount": 5}',
            content_type="application/json",
            headers={"Idempotency-Key": "same-key", header: value},
        )

    refused = post("X-Api-Key", "someone-elses-key")
    assert refused.status_code == 500
    assert "X-Api-Key header" in refused.json()["detail"]
    assert post("X-Shop-Token", "t").status_code == 201  # not a credential header yet
    named = {"PATHS": ["^/mw/"], "CREDENTIAL_HEADERS": ["X-Shop-Token"]}
    with override_settings(REDISLOCK={**settings.REDISLOCK, "IDEMPOTENCY": named}):
        assert post("X-Shop-Token", "t").status_code == 500
    assert runs == ["plain"]


@pytest.mark.parametrize("where", ["mw", "handler", "outer"])
def test_an_upload_above_djangos_memory_limit_reaches_a_drf_parser(where: str) -> None:
    """Every APIView parses its own body: a 3 MB upload is served with a key as
    without one (fails before this change: 400, the fingerprint read request.body)."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    content = bytes(range(256)) * (3 * 1024 * 1024 // 256)

    def post(data: bytes, key: str | None) -> Any:
        headers = {} if key is None else {"Idempotency-Key": key}
        upload = SimpleUploadedFile("receipt.bin", data)
        return Client().post(f"/{where}/receipt/", {"file": upload}, headers=headers)

    without = post(content, None)
    first = post(content, "big")
    again = post(content, "big")
    reused = post(content[:-1] + b"!", "big")
    assert without.status_code == first.status_code == again.status_code == 201, first.content
    assert (
        first.json()
        == without.json()
        == {
            "size": len(content),
            "sha256": hashlib.sha256(content).hexdigest(),
        }
    )
    assert again[REPLAYED_HEADER] == "true" and again.content == first.content
    assert reused.status_code == 422
    assert runs == ["receipt"] * 2
