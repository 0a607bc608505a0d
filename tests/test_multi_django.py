"""Several names through the Django layer: ``redis_lock([...])``, a decorator
whose key callable returns a list, fences per name, and carts that never
oversell against SQLite and PostgreSQL."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections, transaction

from django_redislock import (
    LockError,
    LockNotAcquired,
    current_fence,
    current_lock,
    get_lock,
    redis_lock,
    redis_locked,
)
from django_redislock.core import AsyncMultiLock, MultiLock
from django_redislock.fencing import fenced_update
from tests.helpers import is_free
from tests.test_db_consistency import ALL_DBS
from tests.testapp.models import Order, Product

RACE_PAUSE = 0.01


# -- redis_lock([...]) -------------------------------------------------------------------
def test_block_over_several_names() -> None:
    with redis_lock(["cart:b", "cart:a", "cart:b"]) as cart:
        assert isinstance(cart, MultiLock)
        assert cart.names == ("cart:a", "cart:b")
        assert current_lock() is cart
        assert not is_free("cart:a") and not is_free("cart:b")
        assert current_fence("cart:a") == cart.fence_of("cart:a")
        assert current_fence("cart:b") == cart.fence_of("cart:b")
        with pytest.raises(TypeError, match=r"several names \(cart:a, cart:b\).*current_fence"):
            current_fence()
        with pytest.raises(RuntimeError, match="outside any lock on 'cart:z'"):
            current_fence("cart:z")
        # A nested block on one of the names runs under the outer lock.
        with redis_lock("cart:a") as inner:
            assert inner is cart.locks["cart:a"]
            assert current_fence() == cart.fence_of("cart:a")
        # ... and one that needs a held name plus another is refused: taking
        # the other inside would wait while holding.
        with pytest.raises(LockError, match="already holds"), redis_lock(["cart:a", "cart:z"]):
            pass
        assert is_free("cart:z")
    assert is_free("cart:a") and is_free("cart:b")


def test_block_busy_names_the_lock_and_holds_nothing() -> None:
    holder = get_lock("busy:b", wait=0)
    assert holder.acquire()
    try:
        with (
            pytest.raises(LockNotAcquired, match="busy:a, busy:b"),
            redis_lock(["busy:a", "busy:b"], wait=0),
        ):
            pass
        assert is_free("busy:a")
    finally:
        holder.release()


@pytest.mark.parametrize("bad", [[], ["ok", 3], [""]])
def test_block_bad_names_fail_at_once(bad: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        redis_lock(bad)


async def test_async_block_over_several_names() -> None:
    async with redis_lock(["acart:2", "acart:1"]) as cart:
        assert isinstance(cart, AsyncMultiLock)
        assert cart.held and current_fence("acart:2") == cart.fence_of("acart:2")
    assert not cart.held


# -- the decorator -----------------------------------------------------------------------
@redis_locked(lambda items: [f"item:{i}" for i in items], wait=0)
def take_items(items: list[int]) -> dict[str, int | None]:
    return {f"item:{i}": current_fence(f"item:{i}") for i in items}


def test_decorator_with_a_list_of_names() -> None:
    fences = take_items([3, 1, 2])
    assert set(fences) == {"item:1", "item:2", "item:3"}
    assert all(isinstance(f, int) for f in fences.values())
    assert all(is_free(f"item:{i}") for i in (1, 2, 3))
    holder = get_lock("item:2", wait=0)
    assert holder.acquire()
    try:
        with pytest.raises(LockNotAcquired, match="item:1, item:2"):
            take_items([1, 2])
        assert is_free("item:1")
    finally:
        holder.release()


@redis_locked(lambda: ["fine", 7])
def bad_key_callable() -> None:
    pass


def test_a_key_callable_returning_a_bad_list_says_so() -> None:
    with pytest.raises(TypeError, match="lock key callable of .*bad_key_callable.*must be str"):
        bad_key_callable()


@redis_locked(lambda items: [f"async-item:{i}" for i in items], wait=0)
async def take_items_async(items: list[int]) -> list[int | None]:
    return [current_fence(f"async-item:{i}") for i in items]


async def test_async_decorator_with_a_list_of_names() -> None:
    fences = await take_items_async([5, 4])
    assert len(fences) == 2 and all(isinstance(f, int) for f in fences)


@pytest.mark.django_db(transaction=True)
def test_release_waits_for_the_outer_commit() -> None:
    with transaction.atomic():
        take_items([8, 9])
        assert not is_free("item:8") and not is_free("item:9")
    assert is_free("item:8") and is_free("item:9")


# -- carts against a real database -------------------------------------------------------
# PostgreSQL only: carts over different products write at the same time, which
# SQLite refuses ("database is locked") whatever lock the application takes.
needs_pg = pytest.mark.skipif("postgres" not in ALL_DBS, reason="PostgreSQL not reachable")


def _pause() -> None:
    time.sleep(RACE_PAUSE)  # the read-then-write window an unprotected cart races in


def _checkout(db: str, product_ids: list[int], between: Callable[[], object] = _pause) -> None:
    """Buy one of each product in the cart, or nothing if one is sold out.

    ``between`` runs after the read and before the writes."""
    products = {p.pk: p for p in Product.objects.using(db).filter(pk__in=product_ids)}
    if any(products[pk].stock <= 0 for pk in product_ids):
        return
    between()
    for pk in product_ids:
        fence = current_fence(f"product:{db}:{pk}") if current_lock() else None
        qs = Product.objects.using(db).filter(pk=pk)
        if fence is None:
            qs.update(stock=products[pk].stock - 1)
        else:
            fenced_update(qs, fence, stock=products[pk].stock - 1)
        Order.objects.using(db).create(product_id=pk)


@redis_locked(lambda db, product_ids: [f"product:{db}:{pk}" for pk in product_ids], wait=30)
def checkout(db: str, product_ids: list[int]) -> None:
    with transaction.atomic(using=db):
        _checkout(db, product_ids)


def checkout_unlocked(
    db: str, product_ids: list[int], between: Callable[[], object] = _pause
) -> None:
    with transaction.atomic(using=db):
        _checkout(db, product_ids, between)


def _run_carts(alias: str, buy: Any, buyers: int = 8, carts: int = 4) -> dict[str, Any]:
    products = [Product.objects.using(alias).create(name=f"p{i}", stock=6) for i in range(4)]
    ids = [p.pk for p in products]
    start = threading.Barrier(buyers, timeout=30)
    errors: list[str] = []

    def buyer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            start.wait()
            for _ in range(carts):
                cart = rng.sample(ids, rng.randint(2, 3))
                rng.shuffle(cart)  # names in a different order for every caller
                buy(alias, cart)
        except Exception as exc:
            errors.append(repr(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=buyer, args=(s,)) for s in range(buyers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    oversold = 0
    for p in products:
        sold = Order.objects.using(alias).filter(product_id=p.pk).count()
        left = Product.objects.using(alias).get(pk=p.pk).stock
        oversold += sold + left - 6
    return {"stuck": sum(t.is_alive() for t in threads), "errors": errors, "oversold": oversold}


@needs_pg
@pytest.mark.django_db(transaction=True, databases=ALL_DBS)
def test_carts_in_any_order_never_oversell_nor_deadlock() -> None:
    result = _run_carts("postgres", checkout)
    assert result == {"stuck": 0, "errors": [], "oversold": 0}


@needs_pg
@pytest.mark.django_db(transaction=True, databases=ALL_DBS)
def test_carts_without_the_lock_oversell() -> None:
    """The control: two carts of the same product both read it before either
    writes (a barrier between, where the race needs luck); without the lock
    each sells the unit it read, and one unit is sold twice."""
    product = Product.objects.using("postgres").create(name="p", stock=6)
    both_read = threading.Barrier(2, timeout=30)
    errors: list[str] = []

    def buyer() -> None:
        try:
            checkout_unlocked("postgres", [product.pk], between=both_read.wait)
        except Exception as exc:
            errors.append(repr(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=buyer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads) and errors == []
    sold = Order.objects.using("postgres").filter(product_id=product.pk).count()
    left = Product.objects.using("postgres").get(pk=product.pk).stock
    assert (sold, left) == (2, 5)  # two sold, one taken from the stock
