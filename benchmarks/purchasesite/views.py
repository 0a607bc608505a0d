"""One purchase of one unit of a hot product, written five ways, each traced.

* ``sfu``: ``select_for_update()`` in a transaction; the row lock is the lock.
* ``cond``: a conditional ``UPDATE ... SET stock = stock - 1 WHERE stock > 0``
  in a transaction; the row lock lasts from the UPDATE to the commit.
* ``locked``: ``@redis_locked`` with fenced updates, as the README's Quick
  start writes it (claim, read, work, then stock and order in a transaction).
* ``lean``: the same lock and fencing in three statements and one commit
  (``docs/choosing.rst``, "The lean shape").
* ``unsafe``: read, work, write back, no lock: it must lose updates.

``page`` is not a purchase: the product page of another product, which the
bystanders of ``benchmarks.purchase --bystanders`` read during the sale.

``slow_ms`` milliseconds of "external call" run inside each critical section.
Each response carries an ``X-Trace`` header: when the critical section began
and ended (wall clock, so the load generator can line up sections from
different processes), when and how long the database connection was opened
and whether inside the critical section, and the statements and commits run.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from django.db import connections, transaction
from django.db.backends.postgresql.base import DatabaseWrapper
from django.db.models import F
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse

from django_redislock import current_fence, redis_locked
from django_redislock.fencing import StaleFence, fenced_get, fenced_update
from django_redislock.signals import lock_acquired, lock_released

from .models import Order, Product

_local = threading.local()


def _trace() -> dict[str, Any]:
    found: dict[str, Any] | None = getattr(_local, "trace", None)
    if found is None:
        found = _local.trace = {}
    return found


# -- tracing -----------------------------------------------------------------------------
_connect = DatabaseWrapper.connect


def _timed_connect(self: DatabaseWrapper) -> None:
    t0 = time.perf_counter()
    try:
        _connect(self)
    finally:
        trace = _trace()
        trace["connect_ms"] = trace.get("connect_ms", 0.0) + (time.perf_counter() - t0) * 1000
        trace["connect_in_cs"] = trace.get("in_cs", False)


DatabaseWrapper.connect = _timed_connect  # type: ignore[method-assign]

_commit = DatabaseWrapper._commit


def _timed_commit(self: DatabaseWrapper) -> None:
    t0 = time.perf_counter()
    try:
        _commit(self)
    finally:
        trace = _trace()
        trace["tx"] = trace.get("tx", 0) + 1
        trace["commit_ms"] = trace.get("commit_ms", 0.0) + (time.perf_counter() - t0) * 1000


DatabaseWrapper._commit = _timed_commit  # type: ignore[method-assign]


def _timer(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
    t0 = time.perf_counter()
    try:
        return execute(sql, params, many, context)
    finally:
        trace = _trace()
        trace["q"] = trace.get("q", 0) + 1
        trace["q_ms"] = trace.get("q_ms", 0.0) + (time.perf_counter() - t0) * 1000


def _cs_start() -> None:
    trace = _trace()
    trace["in_cs"] = True
    trace["cs0"] = time.time()


def _cs_end() -> None:
    trace = _trace()
    trace["in_cs"] = False
    trace["cs1"] = time.time()


def _on_acquired(sender: Any, name: str, **kwargs: Any) -> None:
    _cs_start()


def _on_released(sender: Any, name: str, **kwargs: Any) -> None:
    _cs_end()


lock_acquired.connect(_on_acquired, dispatch_uid="bench-acquired")
lock_released.connect(_on_released, dispatch_uid="bench-released")


def _slow(slow_ms: int) -> None:
    """The external call (a payment provider): it waits on the network, off the GIL."""
    if slow_ms:
        time.sleep(slow_ms / 1000)


def _sold_out() -> JsonResponse:
    return JsonResponse({"error": "sold out"}, status=410)


def _bought(order: Order) -> JsonResponse:
    return JsonResponse({"order": order.pk})


# -- the purchases ---------------------------------------------------------------------------
def buy_sfu(request: HttpRequest, slow_ms: int, pk: int) -> HttpResponse:
    with transaction.atomic():
        product = Product.objects.select_for_update().get(pk=pk)
        _cs_start()
        if product.stock <= 0:
            return _sold_out()
        _slow(slow_ms)
        product.stock -= 1
        product.save(update_fields=["stock"])
        order = Order.objects.create(product=product)
    _cs_end()
    return _bought(order)


def buy_cond(request: HttpRequest, slow_ms: int, pk: int) -> HttpResponse:
    with transaction.atomic():
        if not Product.objects.filter(pk=pk, stock__gt=0).update(stock=F("stock") - 1):
            return _sold_out()
        _cs_start()
        _slow(slow_ms)
        order = Order.objects.create(product_id=pk)
    _cs_end()
    return _bought(order)


@redis_locked("purchase:{pk}")
def buy_locked(request: HttpRequest, slow_ms: int, pk: int) -> HttpResponse:
    # The Quick start's view, line for line (the slow call where its work would be).
    fence = current_fence()
    with transaction.atomic():
        products = Product.objects.filter(pk=pk)
        try:
            product = fenced_get(products, fence)  # claim the row as it is read
        except Product.DoesNotExist:
            raise Http404("No such product.") from None
        if product.stock <= 0:
            return _sold_out()
        _slow(slow_ms)
        fenced_update(products, fence, stock=product.stock - 1)
        order = Order.objects.create(product=product, fence=fence)
    return _bought(order)


def _stale(fence: int) -> StaleFence:
    return StaleFence(
        f"product written under a newer lock holder than fence {fence}", fence=fence, model=Product
    )


@redis_locked("purchase:{pk}")
def buy_lean(request: HttpRequest, slow_ms: int, pk: int) -> HttpResponse:
    # The lean shape of docs/choosing.rst: same lock, same fencing, three
    # statements and one commit.
    fence = current_fence()
    products = Product.objects.filter(pk=pk)
    if not products.filter(fence__lte=fence, stock__gt=0).update(fence=fence):
        product = products.first()
        if product is None:
            raise Http404("No such product.")
        if product.fence > fence:
            raise _stale(fence)
        return _sold_out()
    _slow(slow_ms)
    with transaction.atomic(using=products.db):
        if not products.filter(fence=fence).update(stock=F("stock") - 1):
            raise _stale(fence)
        order = Order.objects.create(product_id=pk, fence=fence)
    return _bought(order)


def buy_unsafe(request: HttpRequest, slow_ms: int, pk: int) -> HttpResponse:
    product = Product.objects.get(pk=pk)
    if product.stock <= 0:
        return _sold_out()
    _slow(slow_ms)
    product.stock -= 1  # read before the call: stale by now
    product.save(update_fields=["stock"])
    order = Order.objects.create(product=product)
    return _bought(order)


VIEWS = {
    "sfu": buy_sfu,
    "cond": buy_cond,
    "locked": buy_locked,
    "lean": buy_lean,
    "unsafe": buy_unsafe,
}


def page(request: HttpRequest, pk: int) -> HttpResponse:
    """The product page of another product: a bystander of the sale, which
    needs a database connection of the same processes and nothing else."""
    product = Product.objects.filter(pk=pk).values("id", "stock").first()
    if product is None:
        raise Http404("No such product.")
    return JsonResponse(product)


def buy(request: HttpRequest, variant: str, slow_ms: int, pk: int) -> HttpResponse:
    view = VIEWS.get(variant)
    if view is None:
        raise Http404(variant)
    conn = connections["default"]
    if not getattr(conn, "_bench_timed", False):
        conn.execute_wrappers.append(_timer)
        conn._bench_timed = True  # type: ignore[attr-defined]
    trace = _local.trace = {"t0": time.time()}
    try:
        response = view(request, slow_ms, pk)
    finally:
        _local.trace = None
    trace.pop("in_cs", None)
    response["X-Trace"] = json.dumps(trace, separators=(",", ":"))
    return response
