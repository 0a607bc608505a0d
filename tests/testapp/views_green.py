"""Locked purchases for gunicorn's gevent worker (tests/test_green_threads.py).

The test starts two gunicorn servers of one gevent worker each and sends
every request to the one it names, so no purchase depends on which worker
accepts it. Every wait here is for an event, never for a duration:

* ``buy`` holds its lock, yielding to the hub, until another purchase is
  queued for the same lock and the lease (``REDISLOCK['TIMEOUT']`` in
  tests/green_settings.py) has run out once since it was taken: it sells
  under contention and keeps the lock only because renewal ran.
* ``buy_cpu`` computes, never yielding, until the test opens a gate (a file):
  renewal cannot run meanwhile, and the lease runs out.
* ``buy_now`` sells at once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse

from django_redislock import current_fence, current_lock, redis_locked
from django_redislock.core.drivers.lock import Lock
from django_redislock.fencing import fenced_get, fenced_update

from .models import Order, Product

# A bound on every wait, so that a failing test never leaves a worker stuck.
GIVE_UP = 60.0


def ok(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def gate(product_id: int) -> Path:
    """The file the test creates to let ``buy_cpu`` of ``product_id`` go on."""
    return Path(os.environ["REDISLOCK_GREEN_GATES"]) / f"open-{product_id}"


def _until(done: Callable[[], bool], what: str, *, pause: Callable[[], None]) -> None:
    deadline = time.monotonic() + GIVE_UP
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting for {what}")
        pause()


def _hold_past_the_lease() -> None:
    lock = current_lock()
    assert isinstance(lock, Lock)
    lease_ran_out = time.monotonic() + lock.ttl
    _until(
        lambda: bool(lock.client.llen(lock.keys.queue)) and time.monotonic() > lease_ran_out,
        "a waiter, and the end of the first lease",
        pause=lambda: time.sleep(0.02),  # cooperative under gevent: the hub runs renewal
    )


def _compute_until_the_gate_opens(product_id: int) -> None:
    opened = gate(product_id)
    # os.path.exists is a plain system call, never a switch to the hub.
    _until(opened.exists, f"{opened}", pause=lambda: None)


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
    return _sell(product_id, _hold_past_the_lease)


@redis_locked("green:{product_id}")
def buy_cpu(request: HttpRequest, product_id: int) -> HttpResponse:
    return _sell(product_id, lambda: _compute_until_the_gate_opens(product_id))


@redis_locked("green:{product_id}")
def buy_now(request: HttpRequest, product_id: int) -> HttpResponse:
    return _sell(product_id, lambda: None)
