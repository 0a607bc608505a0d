"""docs/choosing.rst: the lean locked purchase it recommends is correct, and as lean as it says.

The view is taken from the page itself (the code block after "The lean
shape"), run against real SQLite and PostgreSQL under a real Redis lock:
concurrent buyers never oversell, a holder whose lease ran out has its sale
refused, and an uncontended purchase sends the statements the page counts.

It also sells out: the claim fails on a product without stock, and on one
that does not exist.
"""

from __future__ import annotations

import re
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connections
from django.http import Http404
from django.test import RequestFactory, override_settings
from django.test.utils import CaptureQueriesContext

from tests.test_decorators import force_release
from tests.testapp.models import Order, Product

DOC = (Path(__file__).resolve().parents[1] / "docs" / "choosing.rst").read_text()
ALIASES = [
    "default",
    pytest.param(
        "postgres",
        marks=pytest.mark.skipif(
            "postgres" not in settings.DATABASES, reason="PostgreSQL not reachable"
        ),
    ),
]
ALL_DBS = ["default", "postgres"] if "postgres" in settings.DATABASES else ["default"]
db_all = pytest.mark.django_db(transaction=True, databases=ALL_DBS)


def lean_view_source() -> str:
    after = DOC.split("The lean shape", 1)[1]
    block = re.search(r"\.\. code-block:: python\n\n((?:    .*\n|\n)+)", after)
    assert block is not None, "no code block after 'The lean shape' in docs/choosing.rst"
    return textwrap.dedent(block.group(1))


def lean_view(pay: Callable[[Any], None]) -> Callable[..., Any]:
    namespace: dict[str, Any] = {"Product": Product, "Order": Order, "pay": pay}
    exec(compile(lean_view_source(), "docs/choosing.rst", "exec"), namespace)
    return namespace["buy"]  # type: ignore[no-any-return]


class Router:
    """Sends every query to one alias: the page's view names no database."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return self.alias

    db_for_write = db_for_read


@pytest.fixture
def on(request: pytest.FixtureRequest) -> Iterator[str]:
    alias: str = request.param
    with override_settings(DATABASE_ROUTERS=[Router(alias)]):
        yield alias


def post(view: Callable[..., Any], product_id: int) -> Any:
    return view(RequestFactory().post(f"/buy/{product_id}/"), product_id=product_id)


@db_all
@pytest.mark.parametrize("on", ALIASES, indirect=True)
def test_the_lean_view_never_oversells(on: str) -> None:
    stock, buyers = 5, 10
    product = Product.objects.create(name="widget", stock=stock)
    start = threading.Barrier(buyers, timeout=30)
    statuses: list[Any] = []

    def pay(product_id: int) -> None:
        threading.Event().wait(0.02)  # the window a lost update needs

    view = lean_view(pay)

    def buyer() -> None:
        try:
            start.wait()
            status: Any = post(view, product.pk).status_code
        except Exception as exc:  # recorded, so a failure shows what happened
            status = repr(exc)
        finally:
            connections.close_all()
        statuses.append(status)

    threads = [threading.Thread(target=buyer) for _ in range(buyers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a buyer hung"
    assert sorted(statuses) == [200] * stock + [410] * (buyers - stock)
    product.refresh_from_db()
    assert (product.stock, Order.objects.filter(product=product).count()) == (0, stock)


@db_all
@pytest.mark.parametrize("on", ALIASES, indirect=True)
def test_the_lean_view_refuses_the_sale_of_a_holder_whose_lease_ran_out(on: str) -> None:
    product = Product.objects.create(name="widget", stock=3)
    name = f"purchase:{product.pk}"
    newer: list[int] = []

    def newer_buyer() -> None:
        try:
            newer.append(post(lean_view(lambda product_id: None), product.pk).status_code)
        finally:
            connections.close_all()

    def pay(product_id: int) -> None:
        # While the first buyer pays, its lease is taken away and a newer
        # holder claims the row and sells.
        force_release(name)
        thread = threading.Thread(target=newer_buyer)
        thread.start()
        thread.join(60)

    response = post(lean_view(pay), product.pk)
    assert newer == [200]
    assert response.status_code == 503  # StaleFence is a LockLost: the view's 503
    product.refresh_from_db()
    assert (product.stock, Order.objects.filter(product=product).count()) == (2, 1)


@db_all
@pytest.mark.parametrize("on", ALIASES, indirect=True)
def test_the_lean_view_sends_three_statements(on: str) -> None:
    """The page: "three statements (claim, sale, order) and one commit"."""
    assert "three statements (claim, sale, order) and one commit" in " ".join(DOC.split())
    product = Product.objects.create(name="widget", stock=1)
    with CaptureQueriesContext(connections[on]) as queries:
        assert post(lean_view(lambda product_id: None), product.pk).status_code == 200
    sql = [q["sql"].split()[0].upper() for q in queries.captured_queries]
    # Django logs each COMMIT; SQLite's BEGIN too (psycopg sends PostgreSQL's itself).
    assert sql.count("COMMIT") == 1, sql
    assert [s for s in sql if s not in ("BEGIN", "COMMIT")] == ["UPDATE", "UPDATE", "INSERT"], sql


@db_all
@pytest.mark.parametrize("on", ALIASES, indirect=True)
def test_the_lean_view_answers_sold_out_and_not_found(on: str) -> None:
    product = Product.objects.create(name="widget", stock=0)
    view = lean_view(lambda product_id: None)
    assert post(view, product.pk).status_code == 410
    with pytest.raises(Http404):
        post(view, product.pk + 1000)
    assert not Order.objects.exists()
