"""Every code block of docs/views.rst, run against the tutorial's models.

The blocks are fragments (they use ``Product`` and ``Order`` without
importing them): tests/test_docs_blocks.py only compiles them. Here each one
runs in a namespace that holds the test app's ``Product`` and ``Order``,
which have the fields of the tutorial's (checked below), under a real Redis
lock and a real database.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser
from django.db import models
from django.test import RequestFactory

from django_redislock.testing import hold_lock
from tests.test_docs_blocks import Block, blocks
from tests.testapp.models import Order, Product

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "views.rst"
TUTORIAL = ROOT / "docs" / "tutorial" / "mysite" / "shop"
BLOCKS = [b for b in blocks(PAGE) if b.language == "python"]


def _block(first_line: str) -> Block:
    found = [b for b in BLOCKS if first_line in b.text]
    assert len(found) == 1, f"docs/views.rst: {len(found)} blocks with {first_line!r}"
    return found[0]


def _run(block: Block, **names: Any) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "docs_views", **names}
    exec(compile(block.text, block.where, "exec"), namespace)  # noqa: S102 - our own docs
    return namespace


def _fields(path: Path, model: str) -> set[str]:
    """The fields a model of the tutorial's models.py declares."""
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == model)
    return {
        target.id
        for statement in node.body
        if isinstance(statement, ast.Assign)
        for target in statement.targets
        if isinstance(target, ast.Name)
    }


def _model_fields(model: type[models.Model]) -> set[str]:
    return {f.name for f in model._meta.get_fields()}


def test_every_block_of_the_page_has_a_test() -> None:
    tested = {"def purchase(request, product_id)", "def cart_locks(", "class DocumentView(View)"}
    assert len(BLOCKS) == len(tested), [b.where for b in BLOCKS]
    for first in tested:
        _block(first)


def test_the_test_models_have_the_tutorials_fields() -> None:
    models_py = TUTORIAL / "models.py"
    # "created" is the tutorial's timestamp, which no block reads.
    assert _fields(models_py, "Product") <= _model_fields(Product)
    assert _fields(models_py, "Order") - {"created"} <= _model_fields(Order)


@pytest.mark.django_db(transaction=True)
def test_the_first_block_locks_each_product_and_each_cart() -> None:
    namespace = _run(_block("def purchase(request, product_id)"), Product=Product)
    product = Product.objects.create(name="poster", stock=1)
    request = RequestFactory().post("/")
    assert namespace["purchase"](request, product_id=product.pk) is None  # the body is "..."
    with hold_lock(f"purchase:{product.pk}"):
        assert namespace["purchase"](request, product_id=product.pk).status_code == 409
    request.user = AnonymousUser()
    with hold_lock("cart:None"):
        assert asyncio.run(namespace["checkout"](request)).status_code == 409


def _cart(*products: Product) -> Any:
    request = RequestFactory().post("/checkout/1")
    request.session = {"cart:1": [p.pk for p in products]}  # type: ignore[attr-defined]
    return request


@pytest.fixture
def checkout() -> Any:
    return _run(_block("def cart_locks("), Product=Product, Order=Order)["checkout"]


def _stock(*products: Product) -> list[tuple[int, int]]:
    return [
        (p.stock, p.fence)
        for p in Product.objects.filter(pk__in=[x.pk for x in products]).order_by("pk")
    ]


@pytest.mark.django_db(transaction=True)
def test_the_cart_sells_each_product_once(checkout: Any) -> None:
    first = Product.objects.create(name="poster", stock=2)
    second = Product.objects.create(name="mug", stock=1)
    response = checkout(_cart(first, second), cart_id=1)
    assert response.status_code == 200, response.content
    assert [stock for stock, _ in _stock(first, second)] == [1, 0]
    assert Order.objects.count() == 2
    assert checkout(_cart(first, second), cart_id=1).status_code == 410  # the mug is gone
    assert [stock for stock, _ in _stock(first, second)] == [1, 0]
    assert Order.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_stale_fence_on_any_product_rolls_the_whole_cart_back(checkout: Any) -> None:
    """The page: a stale fence on any product rolls back what was written for
    the products before it (without the atomic block, the first product was
    sold and the client told 503)."""
    first = Product.objects.create(name="poster", stock=2)
    second = Product.objects.create(name="mug", stock=2)
    # A newer holder of the mug's lock has written the row since.
    Product.objects.filter(pk=second.pk).update(fence=2**62)
    before = _stock(first, second)
    assert checkout(_cart(first, second), cart_id=1).status_code == 503
    assert _stock(first, second) == before
    assert not Order.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_cart_and_a_purchase_of_one_of_its_products_exclude_each_other(checkout: Any) -> None:
    """The cart locks the names the tutorial's purchase view locks."""
    views_py = (TUTORIAL / "views.py").read_text()
    assert '@redis_locked("purchase:{product_id}")' in views_py
    first = Product.objects.create(name="poster", stock=2)
    second = Product.objects.create(name="mug", stock=2)
    with hold_lock(f"purchase:{second.pk}"):  # a purchase of the mug is running
        assert checkout(_cart(first, second), cart_id=1).status_code == 409
    assert [stock for stock, _ in _stock(first, second)] == [2, 2]


@pytest.mark.django_db(transaction=True)
def test_the_class_based_views_lock_their_document() -> None:
    namespace = _run(_block("class DocumentView(View)"))
    request = RequestFactory().post("/doc/1")
    document = namespace["DocumentView"].as_view()
    other = namespace["OtherView"].as_view()
    assert document(request, pk=1).status_code == 405  # no post(): Django's answer
    assert other(request, pk=1) is None  # post() is "..."
    with hold_lock("doc:1"):
        assert document(request, pk=1).status_code == 409
        assert other(request, pk=1).status_code == 409
