"""``IdempotencyMiddleware``: what only the middleware has, for paths of ``IDEMPOTENCY["PATHS"]``.

The idempotency scenarios themselves run through both forms in
``tests/test_idempotency_forms.py``; here, what the middleware adds: a
decorated view under it, paths it leaves alone, its place in ``MIDDLEWARE``
and its checks, through both request paths, ``Client`` (the sync chain) and
``AsyncClient`` (the async chain, ``__acall__``), against the real Redis and
database.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import AsyncClient, Client, override_settings
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from django_redislock.checks import check_settings
from django_redislock.idempotency import (
    MIDDLEWARE_PATH,
    REPLAYED_HEADER,
    IdempotencyMiddleware,
    idempotent,
)
from tests.test_idempotency import records
from tests.testapp.models import Order, Product

AUTH = "django.contrib.auth.middleware.AuthenticationMiddleware"

pytestmark = pytest.mark.urls("tests.test_idempotency_middleware")

runs: list[str] = []


@csrf_exempt
def pay(request: HttpRequest) -> HttpResponse:
    runs.append("pay")
    product = Product.objects.get(name="tea")
    order = Order.objects.create(product=product)
    return JsonResponse({"order": order.pk, "seen": request.body.decode()}, status=201)


@csrf_exempt
@idempotent
def decorated(request: HttpRequest) -> HttpResponse:
    # Under the middleware's lock already: the decorator must step aside,
    # not wait for (or 409 against) the lock of its own request.
    runs.append("decorated")
    return JsonResponse({"ok": True})


@csrf_exempt
def elsewhere(request: HttpRequest) -> HttpResponse:
    runs.append("elsewhere")
    return JsonResponse({"ok": True})


urlpatterns = [
    path("mw/pay/", pay),
    path("mw/decorated/", decorated),
    path("other/", elsewhere),
]

RULES = {"IDEMPOTENCY": {"PATHS": [r"^/mw/"]}}


@pytest.fixture(autouse=True)
def with_middleware() -> Iterator[None]:
    runs.clear()
    with override_settings(MIDDLEWARE=[*settings.MIDDLEWARE, MIDDLEWARE_PATH], REDISLOCK=RULES):
        yield


@pytest.fixture(params=["client", "async_client"])
def send(request: pytest.FixtureRequest) -> Any:
    """POST with a key through the sync chain or the async one."""

    def sync_send(url: str, key: str = "m-1", body: str = "{}") -> Any:
        return Client(raise_request_exception=False).post(
            url, body, content_type="application/json", headers={"Idempotency-Key": key}
        )

    async def _async_send(url: str, key: str, body: str) -> Any:
        return await AsyncClient(raise_request_exception=False).post(
            url, body, content_type="application/json", headers={"Idempotency-Key": key}
        )

    def async_send(url: str, key: str = "m-1", body: str = "{}") -> Any:
        return async_to_sync(_async_send)(url, key, body)

    return sync_send if request.param == "client" else async_send


def test_a_decorated_view_under_the_middleware_runs_once(send: Any) -> None:
    assert send("/mw/decorated/").status_code == 200
    assert send("/mw/decorated/")[REPLAYED_HEADER] == "true"
    assert runs == ["decorated"]


def test_other_paths_are_left_alone(send: Any, r: redis.Redis) -> None:
    assert send("/other/").status_code == 200
    assert send("/other/").status_code == 200
    assert runs == ["elsewhere", "elsewhere"]
    assert records(r) == []


@pytest.mark.django_db(transaction=True)
def test_atomic_requests_have_committed_before_the_store(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_redislock.idempotency import claim as idempotency_claim

    Product.objects.create(name="tea", stock=5)
    monkeypatch.setitem(connections.settings["default"], "ATOMIC_REQUESTS", True)
    at_store: list[Any] = []
    real = idempotency_claim.write_record

    def write(client: Any, keys: Any, record: dict[bytes, bytes], *args: Any) -> bool:
        if record.get(b"state") == b"done":  # the store: the transaction is over
            at_store.append((connections["default"].in_atomic_block, Order.objects.count()))
        return real(client, keys, record, *args)

    original_create = Order.objects.create

    def create(**kwargs: Any) -> Order:
        assert connections["default"].in_atomic_block
        return original_create(**kwargs)

    monkeypatch.setattr(idempotency_claim, "write_record", write)
    monkeypatch.setattr(Order.objects, "create", create)
    response = Client().post(
        "/mw/pay/", "{}", content_type="application/json", headers={"Idempotency-Key": "c"}
    )
    assert response.status_code == 201
    assert at_store == [(False, 1)]  # committed, and the order stands
    assert [r.hget(key, "state") for key in records(r)] == [b"done"]


# -- checks -----------------------------------------------------------------------------------
def _ids(middleware: list[str], idempotency: dict[str, Any]) -> list[str]:
    with override_settings(MIDDLEWARE=middleware, REDISLOCK={"IDEMPOTENCY": idempotency}):
        return [m.id for m in check_settings() if "06" in m.id]


def test_paths_without_the_middleware_is_an_error() -> None:
    ids = _ids([AUTH], {"PATHS": [r"^/api/"]})
    assert ids == ["django_redislock.E067"]
    assert _ids([AUTH, MIDDLEWARE_PATH], {"PATHS": [r"^/api/"]}) == []
    assert _ids([AUTH], {}) == []


CSRF = "django.middleware.csrf.CsrfViewMiddleware"


def test_a_process_view_after_the_middleware_is_an_error_and_it_refuses_to_start() -> None:
    """It runs the views it serves from its own process_view: a later one (CSRF's!)
    would be skipped for them."""
    assert _ids([AUTH, MIDDLEWARE_PATH, CSRF], {"PATHS": ["^/"]}) == ["django_redislock.E068"]
    assert _ids([CSRF, AUTH, MIDDLEWARE_PATH], {"PATHS": ["^/"]}) == []
    with (
        override_settings(MIDDLEWARE=[AUTH, MIDDLEWARE_PATH, CSRF]),
        pytest.raises(ImproperlyConfigured, match="must come after .*CsrfViewMiddleware"),
    ):
        IdempotencyMiddleware(lambda request: HttpResponse())


def test_the_middleware_before_authentication_warns_for_user_scope() -> None:
    assert _ids([MIDDLEWARE_PATH, AUTH], {"PATHS": ["^/"]}) == ["django_redislock.W060"]
    assert _ids([MIDDLEWARE_PATH], {"PATHS": ["^/"]}) == ["django_redislock.W060"]
    assert _ids([MIDDLEWARE_PATH, AUTH], {"PATHS": ["^/"], "SCOPE": "ip"}) == []


@pytest.mark.parametrize(
    ("paths", "needle"),
    [
        ("^/api/", "must be a list of regular expressions"),
        ([3], "must hold regular expression strings"),
        (["(unclosed"], "is not a regular expression"),
    ],
)
def test_bad_paths_are_reported(paths: Any, needle: str) -> None:
    with override_settings(REDISLOCK={"IDEMPOTENCY": {"PATHS": paths}}):
        messages = [m for m in check_settings() if m.id == "django_redislock.E066"]
    assert len(messages) == 1
    assert needle in messages[0].msg


def test_async_chain_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    # The AsyncClient goes through __acall__ (every middleware here is async-capable).
    called: list[str] = []
    original = IdempotencyMiddleware.__acall__

    async def spy(self: Any, request: Any) -> Any:
        called.append(request.path)
        return await original(self, request)

    monkeypatch.setattr(IdempotencyMiddleware, "__acall__", spy)

    async def go() -> int:
        response = await AsyncClient().post("/mw/decorated/", headers={"Idempotency-Key": "a"})
        return response.status_code

    assert asyncio.run(go()) == 200
    assert called == ["/mw/decorated/"]


def test_the_documented_middleware_settings_pass_the_checks() -> None:
    """docs/idempotency.rst, The middleware rule: its settings block, run and checked
    with its MIDDLEWARE (which the docs-wide settings test does not apply)."""
    import re
    import textwrap
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "idempotency.rst").read_text()
    section = text.split("\nThe middleware rule\n", 1)[1]
    block = re.search(r"\.\. code-block:: python\n\n((?:    .*\n|\n)+)", section)
    assert block is not None
    namespace: dict[str, Any] = {}
    exec(textwrap.dedent(block.group(1)), namespace)  # noqa: S102 - the project's own docs
    assert MIDDLEWARE_PATH in namespace["MIDDLEWARE"]
    with override_settings(MIDDLEWARE=namespace["MIDDLEWARE"], REDISLOCK=namespace["REDISLOCK"]):
        assert [m for m in check_settings() if m.level >= 30] == []
