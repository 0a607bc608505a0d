"""The shop's views: purchases and carts with and without locks, a heavy report, a status page.

Purchases are JSON endpoints for scripts and other services, so they are
exempt from CSRF; a shop with browser sessions would check a token instead.
"""

from __future__ import annotations

import asyncio
import json
import time

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import BadRequest
from django.db import transaction
from django.db.models import Count, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from django_redis import get_redis_connection

from django_redislock import current_fence, redis_locked
from django_redislock.connection import get_client
from django_redislock.core.ops.inspection import list_locks
from django_redislock.fencing import fenced_get, fenced_update
from django_redislock.idempotency import idempotent
from django_redislock.locking.factories import keyspace
from shop.models import Order, Product


def _pay() -> None:
    """Stands in for the slow middle of a purchase (a payment provider call)."""
    time.sleep(settings.SHOP_PURCHASE_DELAY)


def _lock_wait_ms(request: HttpRequest) -> str:
    # From the request reaching Django to the view running, which for a
    # locked view is (almost all) the time spent waiting for the lock.
    arrived = getattr(request, "arrived", None)
    return "" if arrived is None else f"{(time.monotonic() - arrived) * 1000:.1f}"


def _sold_out(product: Product) -> JsonResponse:
    return JsonResponse({"error": "sold out", "product": product.pk}, status=410)


def _bought(order: Order, stock: int, lock_wait_ms: str = "") -> JsonResponse:
    response = JsonResponse({"order": order.pk, "product": order.product_id, "stock": stock})
    if lock_wait_ms:
        response["X-Lock-Wait-Ms"] = lock_wait_ms
    return response


def _sell(products: QuerySet[Product], product: Product, fence: int) -> Order:
    """Write a sale made under the lock: stock and order together, or neither.

    If this holder's lease ran out while it worked and a newer holder has
    written since, ``fenced_update`` raises ``StaleFence`` and nothing is
    written; ``redis_locked`` turns that into a 503 with ``Retry-After``.
    """
    with transaction.atomic():
        fenced_update(products, fence, stock=product.stock - 1)
        return Order.objects.create(product=product, fence=fence)


@csrf_exempt
@require_POST
@idempotent
@redis_locked("purchase:{product_id}")
def buy(request: HttpRequest, product_id: int) -> HttpResponse:
    """Buy one unit. One purchase per product at a time, across every worker.

    A client may send ``Idempotency-Key`` and retry (after a timeout, a
    dropped connection) without buying twice: a retry while the purchase
    runs gets 409, one after it the first answer again (``@idempotent``).
    """
    waited = _lock_wait_ms(request)
    fence = current_fence()
    products = Product.objects.filter(pk=product_id)
    # Claim the row as we read it: from now on the database refuses the
    # writes of any older holder, so nothing can change what we read.
    try:
        product = fenced_get(products, fence)
    except Product.DoesNotExist:
        raise Http404("No such product.") from None
    if product.stock <= 0:
        return _sold_out(product)
    _pay()
    order = _sell(products, product, fence)
    return _bought(order, product.stock - 1, waited)


@csrf_exempt
@require_POST
@idempotent
@redis_locked("purchase:{product_id}")
async def buy_async(request: HttpRequest, product_id: int) -> HttpResponse:
    """The same purchase as an async view; it shares the lock with ``buy``."""
    waited = _lock_wait_ms(request)
    fence = current_fence()
    products = Product.objects.filter(pk=product_id)
    try:
        product = await sync_to_async(fenced_get)(products, fence)
    except Product.DoesNotExist:
        raise Http404("No such product.") from None
    if product.stock <= 0:
        return _sold_out(product)
    await asyncio.sleep(settings.SHOP_PURCHASE_DELAY)
    order = await sync_to_async(_sell)(products, product, fence)
    return _bought(order, product.stock - 1, waited)


@csrf_exempt
@require_POST
def buy_unsafe(request: HttpRequest, product_id: int) -> HttpResponse:
    """The purchase as naive code writes it: read, pay, write back. Do not copy.

    Two requests that read the same stock both sell, and the second write
    overwrites the first: units are sold that the stock never had.
    """
    product = get_object_or_404(Product, pk=product_id)
    if product.stock <= 0:
        return _sold_out(product)
    _pay()
    product.stock -= 1  # from a value read before the payment: stale by now
    product.save(update_fields=["stock"])
    order = Order.objects.create(product=product)
    return _bought(order, product.stock)


# A cart locks one name per product: a client that lists twenty products
# keeps twenty purchases waiting, so a checkout takes at most this many.
MAX_CART = 20


def _cart(request: HttpRequest) -> list[int]:
    """The product ids of a checkout, from a body such as ``{"products": [3, 1, 2]}``."""
    try:
        products = json.loads(request.body)["products"]
    except (ValueError, KeyError, TypeError):
        raise BadRequest('Send a JSON body such as {"products": [3, 1, 2]}.') from None
    if (
        not isinstance(products, list)
        or not 0 < len(products) <= MAX_CART
        or not all(type(pk) is int for pk in products)
        or len(set(products)) != len(products)
    ):
        raise BadRequest(f'"products" must list 1 to {MAX_CART} distinct product ids.')
    return products


def _cart_locks(request: HttpRequest) -> list[str]:
    """One lock per product, named as ``buy`` names its lock: a cart and a
    single purchase of the same product exclude each other."""
    return [f"purchase:{pk}" for pk in _cart(request)]


@csrf_exempt
@require_POST
@idempotent
@redis_locked(_cart_locks)
def checkout(request: HttpRequest) -> HttpResponse:
    """Buy one unit of each product in the cart, or nothing.

    The products are locked all together, in whatever order the client lists
    them, without deadlocking against other carts. Each row is fenced with
    the token of its own product's lock. Sold out on any product: 410, and
    nothing is bought. ``Idempotency-Key`` works as for ``buy``.
    """
    waited = _lock_wait_ms(request)
    ids = _cart(request)
    fences = {pk: current_fence(f"purchase:{pk}") for pk in ids}
    # Claim every row before reading it, as buy does.
    for pk, fence in fences.items():
        if not fenced_update(Product.objects.filter(pk=pk), fence):
            raise Http404(f"No product {pk}.")
    products = Product.objects.in_bulk(ids)
    sold_out = [pk for pk in ids if products[pk].stock <= 0]
    if sold_out:
        return JsonResponse({"error": "sold out", "products": sold_out}, status=410)
    _pay()
    # Every sale or none: a stale fence on any row rolls back the others.
    # No other locked writer touches these rows now, so their order is free.
    with transaction.atomic():
        orders = [_sell(Product.objects.filter(pk=pk), products[pk], fences[pk]) for pk in ids]
    response = JsonResponse(
        {
            "orders": [order.pk for order in orders],
            "products": ids,
            "stock": [products[pk].stock - 1 for pk in ids],
        }
    )
    if waited:
        response["X-Lock-Wait-Ms"] = waited
    return response


@csrf_exempt
@require_POST
def checkout_unsafe(request: HttpRequest) -> HttpResponse:
    """The cart as naive code writes it: read, pay, write in a transaction. Do not copy.

    It oversells as ``buy_unsafe`` does, charges every retry again, and two
    carts that write the same products in opposite orders each wait for a
    row the other has written: PostgreSQL ends one of them ("deadlock
    detected") and its customer gets a 500.
    """
    ids = _cart(request)
    products = Product.objects.in_bulk(ids)
    if len(products) != len(ids):
        raise Http404("No such product.")
    sold_out = [pk for pk in ids if products[pk].stock <= 0]
    if sold_out:
        return JsonResponse({"error": "sold out", "products": sold_out}, status=410)
    _pay()
    with transaction.atomic():
        orders = []
        for pk in ids:
            product = products[pk]
            product.stock -= 1  # read before the payment: stale by now
            product.save(update_fields=["stock"])
            orders.append(Order.objects.create(product=product))
    return JsonResponse(
        {
            "orders": [order.pk for order in orders],
            "products": ids,
            "stock": [products[pk].stock for pk in ids],
        }
    )


def _in_flight_key() -> str:
    return f"{settings.SHOP_REDIS_PREFIX}:reports:in-flight"


@require_GET
def sales_report(request: HttpRequest) -> HttpResponse:
    """A deliberately heavy report. The throttling middleware admits two at a time.

    Each response says how many reports were running when it started
    (``X-In-Flight``, counted in Redis across all workers), so a client can
    check that the limit held.
    """
    redis = get_redis_connection("default")
    key = _in_flight_key()
    with redis.pipeline() as pipe:
        # The TTL only matters if a worker dies mid-report: the count heals.
        pipe.incr(key).expire(key, 60)
        in_flight = pipe.execute()[0]
    try:
        time.sleep(settings.SHOP_REPORT_DELAY)
        rows = list(
            Product.objects.annotate(orders_count=Count("orders"))
            .order_by("pk")
            .values("pk", "name", "stock", "orders_count")
        )
    finally:
        redis.decr(key)
    response = JsonResponse({"products": rows})
    response["X-In-Flight"] = str(in_flight)
    return response


@require_GET
def index(request: HttpRequest) -> HttpResponse:
    """Products, their stock and orders, and the locks held right now."""
    products = Product.objects.annotate(orders_count=Count("orders")).order_by("pk")
    locks = list_locks(get_client(), keyspace())
    return render(request, "shop/index.html", {"products": products, "locks": locks})


@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    """Ready when the database and Redis both answer."""
    Product.objects.exists()
    get_redis_connection("default").ping()
    return HttpResponse("ok\n", content_type="text/plain")
