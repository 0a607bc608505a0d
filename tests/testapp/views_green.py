"""A locked purchase for gunicorn's gevent worker (tests/test_green_threads.py).

Each purchase holds its lock longer than the lease (``REDISLOCK['TIMEOUT']``
in tests/green_settings.py): it keeps the lock only if renewal runs. ``buy``
waits as a view waits for a payment provider (``time.sleep``, cooperative
under gevent); ``buy_cpu`` computes instead, never yielding to the hub.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse

from django_redislock import current_fence, redis_locked
from django_redislock.fencing import fenced_get, fenced_update

from .models import Order, Product

HOLD = 0.8  # seconds a purchase holds its lock: more than the 0.6 s lease
SPIN = 1.6  # seconds buy_cpu computes: renewal cannot run meanwhile under gevent


def ok(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def _spin() -> None:
    end = time.perf_counter() + SPIN
    while time.perf_counter() < end:
        pass


def _sell(product_id: int, work: Callable[[], None]) -> HttpResponse:
    fence = current_fence()
    products = Product.objects.filter(pk=product_id)
    # Claim the row as we read it: from now on the database refuses the
    # writes of any older holder (fenced_update raises StaleFence: a 503).
    product = fenced_get(products, fence)
    if product.stock <= 0:
        return JsonResponse({"bought": False}, status=410)
    work()
    with transaction.atomic():
        fenced_update(products, fence, stock=product.stock - 1)
        Order.objects.create(product_id=product_id)
    return JsonResponse({"bought": True, "fence": fence})


@redis_locked("green:{product_id}")
def buy(request: HttpRequest, product_id: int) -> HttpResponse:
    return _sell(product_id, lambda: time.sleep(HOLD))


@redis_locked("green:{product_id}")
def buy_cpu(request: HttpRequest, product_id: int) -> HttpResponse:
    return _sell(product_id, _spin)
