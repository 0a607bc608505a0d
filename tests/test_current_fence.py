"""``current_fence()``: the token of the current lock, None when locks are off."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import override_settings

import django_redislock
from django_redislock import current_fence, redis_lock, redis_locked
from tests.test_decorators import Get, make_get
from tests.testapp.models import Order, Product

pytestmark = pytest.mark.urls("tests.urls_locked")


@pytest.fixture(params=["client", "async_client"])
def get(request: pytest.FixtureRequest) -> Get:
    return make_get(request)


@pytest.mark.parametrize("view", ["buy-current-fence", "abuy-current-fence"])
@pytest.mark.django_db(transaction=True)
def test_quick_start_view_with_locks_on_stores_the_fence(get: Get, view: str) -> None:
    product = Product.objects.create(name="p", stock=2)
    response = get(f"/{view}/{product.pk}/")
    assert response.status_code == 200, response.content
    fence = json.loads(response.content)["fence"]
    assert isinstance(fence, int) and fence > 0
    product.refresh_from_db()
    assert (product.stock, product.fence) == (1, fence)
    assert Order.objects.count() == 1


@pytest.mark.parametrize("view", ["buy-current-fence", "abuy-current-fence"])
@pytest.mark.django_db(transaction=True)
@override_settings(REDISLOCK={"ENABLED": False})
def test_quick_start_view_with_locks_off_answers_200(get: Get, view: str) -> None:
    # current_lock() is None here: the Quick start's ``current_lock().fence``
    # answered 500. current_fence() gives None, and fenced_update a plain update.
    product = Product.objects.create(name="p", stock=2)
    response = get(f"/{view}/{product.pk}/")
    assert response.status_code == 200, response.content
    assert json.loads(response.content)["fence"] is None
    product.refresh_from_db()
    assert (product.stock, product.fence) == (1, 0)


def test_inside_a_block_it_is_the_locks_fence() -> None:
    with redis_lock("fence-block") as lock:
        assert lock is not None
        assert current_fence() == lock.fence
        assert isinstance(lock.fence, int)


def test_inside_a_decorated_function_it_is_the_locks_fence() -> None:
    seen: dict[str, Any] = {}

    @redis_locked("fence-fn:{n}")
    def work(n: int) -> None:
        seen["fence"] = current_fence()
        seen["lock"] = django_redislock.current_lock()

    work(1)
    assert seen["fence"] is not None and seen["fence"] == seen["lock"].fence


def test_outside_any_lock_it_raises_naming_the_fix() -> None:
    with pytest.raises(RuntimeError) as info:
        current_fence()
    message = str(info.value)
    assert "outside any lock" in message
    assert "@redis_locked(" in message and "redis_lock(" in message
    assert "REDISLOCK['ENABLED']" in message


@override_settings(REDISLOCK={"ENABLED": False})
def test_outside_any_lock_with_locks_off_it_is_none() -> None:
    assert current_fence() is None


def test_exported_lazily() -> None:
    assert "current_fence" in django_redislock.__all__
    assert django_redislock.current_fence is current_fence
