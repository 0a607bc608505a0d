"""Every code block of docs/drf.rst, run as a DRF project against the tutorial's models.

The page's blocks are fragments (they use ``Product`` and ``Order`` without
importing them, and each uses the names of the ones before):
tests/test_docs_blocks.py only compiles them. Here they run in order in one
namespace holding the test app's ``Product`` and ``Order`` (the tutorial's
fields: tests/test_docs_views.py), and the page's own ``urlpatterns`` are this
module's URLconf: real DRF, real authentication, real Redis and database.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import signing
from django.test import AsyncClient, Client, override_settings
from rest_framework.authtoken.models import Token

from django_redislock import connection, get_lock
from django_redislock.idempotency import REPLAYED_HEADER
from django_redislock.testing import hold_lock, hold_permits, local_unique_tasks
from tests.test_decorators import close_async_clients
from tests.test_docs_blocks import blocks
from tests.testapp.models import Order, Product

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "drf.rst"
BLOCKS = [b for b in blocks(PAGE) if b.language == "python"]
SETTINGS = [b for b in BLOCKS if b.marker == "settings"]
CODE = [b for b in BLOCKS if b.marker == "fragment"]

page: dict[str, Any] = {"__name__": "docs_drf", "Product": Product, "Order": Order}
for _block in CODE:
    exec(compile(_block.text, _block.where, "exec"), page)  # noqa: S102 - our own docs
page_settings: dict[str, Any] = {}
exec(compile(SETTINGS[0].text, SETTINGS[0].where, "exec"), page_settings)  # noqa: S102

urlpatterns = page["urlpatterns"]
pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(transaction=True)]


def test_every_block_of_the_page_runs_here() -> None:
    assert len(SETTINGS) == 1 and len(CODE) == 6
    assert len(BLOCKS) == len(SETTINGS) + len(CODE)
    for name in ("SignedBearerAuthentication", "PurchaseView", "ProductViewSet", "OrderList"):
        assert name in page


def test_the_test_project_is_configured_as_the_page_says() -> None:
    """DRF binds DEFAULT_THROTTLE_CLASSES when it is imported: the suite's settings
    hold the page's, so the page's views are throttled as the page says."""
    assert page_settings["REST_FRAMEWORK"] == settings.REST_FRAMEWORK


@pytest.fixture(autouse=True)
def _settings() -> Iterator[None]:
    connection.reset()
    with override_settings(REDISLOCK={**settings.REDISLOCK, **page_settings["REDISLOCK"]}):
        yield
    connection.reset()


@pytest.fixture
def users() -> dict[str, Any]:
    return {
        name: get_user_model().objects.create_user(name, password="pw") for name in ("alice", "bob")
    }


def credentials(kind: str, user: Any) -> dict[str, Any]:
    """How ``user`` authenticates: a DRF token, a session, or the page's bearer token."""
    if kind == "token":
        return {"headers": {"Authorization": f"Token {Token.objects.create(user=user).key}"}}
    if kind == "bearer":
        return {"headers": {"Authorization": f"Bearer {signing.dumps({'user': user.pk})}"}}
    client = Client()
    client.force_login(user)
    return {"cookies": client.cookies}


@pytest.fixture(params=["client", "async_client"])
def send(request: pytest.FixtureRequest) -> Callable[..., Any]:
    def sync_send(
        method: str, url: str, who: dict[str, Any], data: Any = None, **headers: str
    ) -> Any:
        client = Client(raise_request_exception=False)
        if "cookies" in who:
            client.cookies = who["cookies"]
        body = (
            {} if data is None else {"data": json.dumps(data), "content_type": "application/json"}
        )
        return getattr(client, method)(url, headers={**who.get("headers", {}), **headers}, **body)

    def async_send(
        method: str, url: str, who: dict[str, Any], data: Any = None, **headers: str
    ) -> Any:
        async def go() -> Any:
            client = AsyncClient(raise_request_exception=False)
            if "cookies" in who:
                client.cookies = who["cookies"]
            body = (
                {}
                if data is None
                else {"data": json.dumps(data), "content_type": "application/json"}
            )
            try:
                return await getattr(client, method)(
                    url, headers={**who.get("headers", {}), **headers}, **body
                )
            finally:
                await close_async_clients()

        return async_to_sync(go)()

    return sync_send if request.param == "client" else async_send


@pytest.mark.parametrize("kind", ["token", "session", "bearer"])
def test_a_purchase_is_locked_fenced_and_idempotent(
    kind: str, send: Any, users: dict[str, Any]
) -> None:
    who = credentials(kind, users["alice"])
    product = Product.objects.create(name="poster", stock=2)
    url = f"/api/products/{product.pk}/purchase/"
    first = send("post", url, who, **{"Idempotency-Key": "k1"})
    assert first.status_code == 201, first.content
    assert first.json()["fence"] > 0  # the lock's token, written on the row
    # A retry is replayed without waiting for the product's lock (idempotency outermost).
    with hold_lock(f"purchase:{product.pk}"):
        again = send("post", url, who, **{"Idempotency-Key": "k1"})
    assert again.status_code == 201 and again[REPLAYED_HEADER] == "true"
    assert again.content == first.content
    assert send("post", url, who, **{"Idempotency-Key": "k2"}).status_code == 201
    assert send("post", url, who, **{"Idempotency-Key": "k3"}).status_code == 410
    assert Product.objects.get().stock == 0 and Order.objects.count() == 2


def test_a_bad_bearer_token_is_refused_by_the_pages_class(send: Any) -> None:
    product = Product.objects.create(name="poster", stock=2)
    refused = send(
        "post", f"/api/products/{product.pk}/purchase/", {"headers": {"Authorization": "Bearer x"}}
    )
    assert refused.status_code == 401
    assert Product.objects.get().stock == 2


def test_the_restock_action_takes_the_purchases_lock_and_its_scope(
    send: Any, users: dict[str, Any]
) -> None:
    who = credentials("token", users["alice"])
    product = Product.objects.create(name="poster", stock=0)
    url = f"/api/products/{product.pk}/restock/"
    assert send("post", url, who, {"units": 3}).json() == {"stock": 3}
    assert Product.objects.get().stock == 3 and Product.objects.get().fence > 0
    with hold_permits("throttle:restocks", 4, wait=None):
        refused = send("post", url, who, {"units": 3})  # waits 2 s for a permit, then 429
    assert refused.status_code == 429 and refused["Retry-After"] == "1"
    assert Product.objects.get().stock == 3


def test_the_export_action_is_limited_per_user(send: Any, users: dict[str, Any]) -> None:
    alice, bob = (credentials("bearer", users[name]) for name in ("alice", "bob"))
    Product.objects.create(name="poster", stock=1)
    with hold_permits(f"throttle:product-export:user:u:{users['alice'].pk}", 1):
        assert send("get", "/api/products/export/", alice).status_code == 429
        assert send("get", "/api/products/export/", bob).json() == [
            {"id": Product.objects.get().pk, "name": "poster", "stock": 1}
        ]


def test_an_order_sends_its_receipt_at_commit_once(send: Any, users: dict[str, Any]) -> None:
    who = credentials("session", users["alice"])
    product = Product.objects.create(name="poster", stock=1)
    with local_unique_tasks():
        created = send("post", "/api/orders/", who, {"product": product.pk})
        assert created.status_code == 201, created.content
        order_id = created.json()["id"]
        # The task ran, and keeps its key: the receipt is never sent again.
        receipt = get_lock(f"unique:receipt:{order_id}")
        assert receipt.client.exists(receipt.keys.lease)


def test_the_orders_export_is_throttled_per_user(send: Any, users: dict[str, Any]) -> None:
    alice, bob = (credentials("token", users[name]) for name in ("alice", "bob"))
    with hold_permits(f"throttle:exports:user:u:{users['alice'].pk}", 1):
        refused = send("get", "/api/orders/", alice)
        assert send("get", "/api/orders/", bob).json() == []
    assert refused.status_code == 429 and refused["Retry-After"] == "1"
    assert refused.json()["detail"].startswith("Request was throttled")


def test_with_the_library_off_the_handlers_run_as_they_are(
    send: Any, users: dict[str, Any]
) -> None:
    who = credentials("token", users["alice"])
    product = Product.objects.create(name="poster", stock=1)
    with hold_permits(f"throttle:exports:user:u:{users['alice'].pk}", 1):
        assert send("get", "/api/orders/", who).status_code == 429
        with override_settings(REDISLOCK={**settings.REDISLOCK, "ENABLED": False}):
            bought = send("post", f"/api/products/{product.pk}/purchase/", who)
            restocked = send("post", f"/api/products/{product.pk}/restock/", who, {"units": 2})
            listed = send("get", "/api/orders/", who)
    assert bought.status_code == 201 and restocked.json() == {"stock": 2}
    assert listed.status_code == 200
    assert Product.objects.get().fence == 0
