"""Views under test for the decorator: locked, unlocked and deliberately naive."""

from __future__ import annotations

import threading
import time

from asgiref.sync import sync_to_async
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.decorators import method_decorator
from django.views import View

from django_redislock import LockLost, current_fence, current_lock, get_lock, redis_locked
from django_redislock.fencing import fenced_update

from .models import Order, Product

# Widens the read-then-write window so that an unprotected purchase races.
RACE_PAUSE = 0.05


def _lock_info() -> dict[str, object]:
    lock = current_lock()
    return {"name": lock.name if lock else None, "fence": lock.fence if lock else None}


def _buy(db: str, product_id: int) -> HttpResponse:
    product = Product.objects.using(db).get(pk=product_id)
    if product.stock <= 0:
        return JsonResponse({"bought": False}, status=410)
    time.sleep(RACE_PAUSE)
    Product.objects.using(db).filter(pk=product_id).update(stock=product.stock - 1)
    Order.objects.using(db).create(product_id=product_id)
    return JsonResponse({"bought": True})


@redis_locked("purchase:{db}:{product_id}", timeout=30, wait=30)
def purchase(request: HttpRequest, db: str, product_id: int) -> HttpResponse:
    return _buy(db, product_id)


@redis_locked("purchase:{db}:{product_id}", timeout=30, wait=30)
def purchase_own_atomic(request: HttpRequest, db: str, product_id: int) -> HttpResponse:
    with transaction.atomic(using=db):
        return _buy(db, product_id)


# The unlocked control's buyers meet here between their read and their write
# (the test sets it): every one of them reads the same stock, so the control
# oversells whatever the scheduling.
UNLOCKED_MEETING: threading.Barrier | None = None


def purchase_unlocked(request: HttpRequest, db: str, product_id: int) -> HttpResponse:
    meeting = UNLOCKED_MEETING
    assert meeting is not None, "the test sets UNLOCKED_MEETING"
    product = Product.objects.using(db).get(pk=product_id)
    if product.stock <= 0:
        return JsonResponse({"bought": False}, status=410)
    meeting.wait()
    Product.objects.using(db).filter(pk=product_id).update(stock=product.stock - 1)
    Order.objects.using(db).create(product_id=product_id)
    return JsonResponse({"bought": True})


def purchase_naive(request: HttpRequest, db: str, product_id: int) -> HttpResponse:
    # The mistake the decorator exists to avoid: under ATOMIC_REQUESTS the
    # lock goes back before Django commits the request's transaction.
    with get_lock(f"purchase:{db}:{product_id}", timeout=30, wait=30):
        response = _buy(db, product_id)
    time.sleep(RACE_PAUSE)  # work between release and commit (rendering, middleware)
    return response


@redis_locked("purchase:{db}:{product_id}", timeout=30, wait=30)
def purchase_fenced(request: HttpRequest, db: str, product_id: int) -> HttpResponse:
    lock = current_lock()
    assert lock is not None and lock.fence is not None
    qs = Product.objects.using(db).filter(pk=product_id)
    fenced_update(qs, lock.fence)
    product = qs.get()
    if product.stock <= 0:
        return JsonResponse({"bought": False}, status=410)
    fenced_update(qs, lock.fence, stock=product.stock - 1)
    Order.objects.using(db).create(product_id=product_id)
    return JsonResponse({"bought": True, "fence": lock.fence})


# -- behaviour views --------------------------------------------------------------------
@redis_locked("item:{name}", wait=0)
def item(request: HttpRequest, name: str) -> HttpResponse:
    return JsonResponse(_lock_info())


@redis_locked("item:{name}", wait=0)
async def aitem(request: HttpRequest, name: str) -> HttpResponse:
    return JsonResponse(_lock_info())


@redis_locked("item:{name}", wait=0, fail_open=True)
def item_fail_open(request: HttpRequest, name: str) -> HttpResponse:
    return JsonResponse(_lock_info())


@redis_locked("item:{name}", wait=0, fail_open=True)
async def aitem_fail_open(request: HttpRequest, name: str) -> HttpResponse:
    return JsonResponse(_lock_info())


def _busy_page(request: HttpRequest, name: str) -> HttpResponse:
    return HttpResponse("come back later", status=423)


@redis_locked("item:{name}", wait=0, on_busy=_busy_page)
def item_custom_busy(request: HttpRequest, name: str) -> HttpResponse:
    return JsonResponse(_lock_info())


@redis_locked("item:{name}", wait=0, on_busy=_busy_page)
async def aitem_custom_busy(request: HttpRequest, name: str) -> HttpResponse:
    return JsonResponse(_lock_info())


class Boom(Exception):
    pass


@redis_locked("item:{name}", wait=0)
def item_boom(request: HttpRequest, name: str) -> HttpResponse:
    raise Boom(name)


@redis_locked("item:{name}", wait=0)
async def aitem_boom(request: HttpRequest, name: str) -> HttpResponse:
    raise Boom(name)


@redis_locked("item:{name}", timeout=0.3, wait=0)
def item_outlives_lease(request: HttpRequest, name: str) -> HttpResponse:
    Product.objects.create(name=name, stock=1)
    time.sleep(0.5)
    return JsonResponse(_lock_info())


@redis_locked("item:{name}", wait=0)
def item_user(request: HttpRequest, name: str) -> HttpResponse:
    return JsonResponse(_lock_info())


@redis_locked("cart:{request.user.pk}", wait=0)
async def acart(request: HttpRequest) -> HttpResponse:
    return JsonResponse(_lock_info())


# -- class-based views --------------------------------------------------------------------
class DispatchLocked(View):
    @redis_locked("cbv:{pk}", wait=0)
    def dispatch(self, request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        return super().dispatch(request, *args, **kwargs)

    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        return JsonResponse(_lock_info())

    def post(self, request: HttpRequest, pk: int) -> HttpResponse:
        Product.objects.create(name=f"cbv-{pk}", stock=1)
        raise Boom("after write")


class SelfLocked(View):
    @redis_locked("cbv:{self.kwargs[pk]}", wait=0)
    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        return JsonResponse(_lock_info())


class SelfLockedThenFails(View):
    """Under ATOMIC_REQUESTS Django's transaction wraps the locked handler and
    rolls back when the rest of the view fails."""

    def dispatch(self, request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        super().dispatch(request, *args, **kwargs)
        raise Boom("after the locked handler")

    @redis_locked("cbv:{self.kwargs[pk]}", timeout=30, wait=0)
    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        Product.objects.create(name=f"cbv-{pk}", stock=1)
        return JsonResponse(_lock_info())


@method_decorator(redis_locked("cbv:{pk}", wait=0), name="dispatch")
class MethodDecorated(View):
    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        return JsonResponse(_lock_info())


@method_decorator(redis_locked("cbv:{self.kwargs[pk]}", wait=0), name="get")
class MethodDecoratedSelf(View):
    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        return JsonResponse(_lock_info())


class AsyncHandler(View):
    @redis_locked("cbv:{pk}", wait=0)
    async def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        return JsonResponse(_lock_info())


# A hook for tests that need to stop a holder in the middle of its view.
inside = threading.Event()
proceed = threading.Event()


@redis_locked("item:{name}", wait=0)
def item_gated(request: HttpRequest, name: str) -> HttpResponse:
    inside.set()
    proceed.wait(10)
    return JsonResponse(_lock_info())


@redis_locked("item:{name}", wait=0)
async def aitem_db(request: HttpRequest, name: str) -> HttpResponse:
    await sync_to_async(Product.objects.create)(name=name, stock=1)
    return JsonResponse(_lock_info())


@redis_locked("purchase:{db}:{product_id}", timeout=30, wait=30)
async def apurchase(request: HttpRequest, db: str, product_id: int) -> HttpResponse:
    return await sync_to_async(_buy)(db, product_id)


# Stops a holder after its write, while a test takes its lock away.
lost_inside = threading.Event()
lost_proceed = threading.Event()


def _write_and_pause(name: str) -> None:
    Product.objects.create(name=name, stock=1)
    lost_inside.set()
    lost_proceed.wait(10)


@redis_locked("item:{name}", timeout=1, renew=True, wait=0)
def item_lost_midway(request: HttpRequest, name: str) -> HttpResponse:
    _write_and_pause(name)
    return JsonResponse(_lock_info())


def _write_all_or_nothing(name: str) -> None:
    # What an async view does to commit only under its lock.
    with transaction.atomic():
        _write_and_pause(name)
        lock = current_lock()
        if lock is None or not lock.held:
            raise LockLost(f"lock {name!r} lost before commit")


@redis_locked("item:{name}", timeout=1, renew=True, wait=0)
async def aitem_lost_midway(request: HttpRequest, name: str) -> HttpResponse:
    await sync_to_async(_write_all_or_nothing)(name)
    return JsonResponse(_lock_info())


# -- the Quick start's view, written with current_fence() ---------------------------------
def _buy_fenced(product_id: int, fence: int | None) -> HttpResponse:
    products = Product.objects.filter(pk=product_id)
    if not fenced_update(products, fence):
        return JsonResponse({"error": "no such product"}, status=404)
    product = products.get()
    if product.stock <= 0:
        return JsonResponse({"error": "sold out"}, status=410)
    with transaction.atomic():
        fenced_update(products, fence, stock=product.stock - 1)
        order = Order.objects.create(product=product)
    return JsonResponse({"order": order.pk, "fence": fence})


@redis_locked("purchase:{product_id}")
def buy_current_fence(request: HttpRequest, product_id: int) -> HttpResponse:
    return _buy_fenced(product_id, current_fence())


@redis_locked("purchase:{product_id}")
async def abuy_current_fence(request: HttpRequest, product_id: int) -> HttpResponse:
    return await sync_to_async(_buy_fenced)(product_id, current_fence())
