"""The tutorial's purchase view with ``REDISLOCK["ENABLED"] = False`` (docs/tutorial.rst).

With locks off ``current_fence()`` is None: ``fenced_get`` and ``fenced_update``
are a plain ``get()`` and ``update()`` and leave the NOT NULL ``fence`` column
as it is, so the view sells as before. Storing the token by hand is where None
would fail; ``fence or 0`` is what the page says to store.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import IntegrityError, transaction
from django.test import RequestFactory, override_settings

from django_redislock import current_fence, redis_locked
from tests.testapp.models import Order, Product

pytestmark = pytest.mark.django_db

VIEWS = Path(__file__).resolve().parents[1] / "docs" / "tutorial" / "mysite" / "shop" / "views.py"


def _tutorial_views() -> Any:
    """The page's shop/views.py, on the test app's models of the same shape."""
    source = VIEWS.read_text()
    assert "from .models import Order, Product" in source
    module = types.ModuleType("tutorial_shop_views")
    code = source.replace("from .models import", "from tests.testapp.models import")
    exec(compile(code, str(VIEWS), "exec"), module.__dict__)
    return module


@pytest.mark.parametrize("enabled", [False, True])
def test_the_purchase_view_sells_with_locks_on_and_off(enabled: bool) -> None:
    buy = _tutorial_views().buy
    product = Product.objects.create(name="Poster", stock=2)
    with override_settings(REDISLOCK={**settings.REDISLOCK, "ENABLED": enabled}):
        for left in (1, 0):
            response = buy(RequestFactory().post("/"), product_id=product.pk)
            assert response.status_code == 200, response.content
            assert b'"stock": %d' % left in response.content
        assert buy(RequestFactory().post("/"), product_id=product.pk).status_code == 410
    product.refresh_from_db()
    assert product.stock == 0 and Order.objects.count() == 2
    # Locks off: the NOT NULL fence column is left as it was; on: the last token.
    assert (product.fence > 0) is enabled


def test_a_token_stored_by_hand_needs_a_value_when_locks_are_off() -> None:
    product = Product.objects.create(name="Poster", stock=1)

    @redis_locked("purchase:{pk}")
    def store(pk: int, *, fallback: bool) -> None:
        fence = current_fence()
        assert fence is None
        Product.objects.filter(pk=pk).update(fence=(fence or 0) if fallback else fence)

    with override_settings(REDISLOCK={**settings.REDISLOCK, "ENABLED": False}):
        with pytest.raises(IntegrityError), transaction.atomic():
            store(product.pk, fallback=False)
        store(product.pk, fallback=True)
    product.refresh_from_db()
    assert product.fence == 0
