"""Testing locked views with Django's test runner (``manage.py test``)."""

from __future__ import annotations

from django.test import SimpleTestCase, TestCase, override_settings

from django_redislock.testing import (
    RedisLockTestMixin,
    hold_lock,
    hold_permits,
    locks_disabled,
)
from tests.testapp.models import Order, Product


@override_settings(ROOT_URLCONF="tests.urls_locked")
class PurchaseTests(RedisLockTestMixin, SimpleTestCase):
    # The mixin gives each test its own key prefix and, after the test,
    # fails it if a lock, a permit or a waiter was left behind.

    def test_busy_purchase_answers_409(self):
        with hold_lock("purchase:default:1"):
            response = self.client.post("/purchase/default/1/")

        self.assertEqual(response.status_code, 409)
        self.assertIn("Retry-After", response.headers)

    async def test_busy_async_view_answers_409(self):
        async with hold_lock("item:shelf"):
            response = await self.async_client.get("/aitem/shelf/")

        self.assertEqual(response.status_code, 409)

    def test_free_view_runs(self):
        response = self.client.get("/item/shelf/")

        self.assertEqual(response.json()["name"], "item:shelf")

    @locks_disabled()
    def test_with_locks_off_the_view_runs_unlocked(self):
        response = self.client.get("/item/shelf/")

        self.assertEqual(response.json()["name"], None)


@override_settings(ROOT_URLCONF="tests.urls_locked")
class PurchaseDatabaseTests(RedisLockTestMixin, TestCase):
    def test_purchase_writes_and_gives_its_lock_back(self):
        product = Product.objects.create(name="lamp", stock=1)

        response = self.client.post(f"/purchase/default/{product.pk}/")

        self.assertEqual(response.status_code, 200)
        self.assertEqual(Order.objects.filter(product=product).count(), 1)
        # The mixin's check, after the test, finds the lock given back.


@override_settings(ROOT_URLCONF="tests.urls_throttle")
class ThrottleTests(RedisLockTestMixin, SimpleTestCase):
    def test_full_semaphore_answers_503(self):
        with hold_permits("throttle:deco", 1):
            response = self.client.get("/deco/")

        self.assertEqual(response.status_code, 503)

    def test_with_locks_off_nothing_is_throttled(self):
        with hold_permits("throttle:deco", 1), locks_disabled():
            response = self.client.get("/deco/")

        self.assertEqual(response.status_code, 200)
