"""A deferred lock is released when its transaction commits, whatever the other hooks do.

A locked call made inside a transaction someone else opened keeps its lock
until that transaction ends (``django_redislock/locking/deferred.py``). Django runs a
transaction's ``on_commit`` hooks in order after the commit; a hook that
raises (not registered ``robust``) stops the ones after it, and the exception's
traceback keeps them referenced for as long as it lives. The lock's release
must not wait for either: each test below checks the lock is free right after
the commit, while the exception is still held.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections, transaction
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client
from django.urls import path

from django_redislock import redis_locked
from tests.helpers import is_free
from tests.test_decorators import close_async_clients
from tests.testapp.models import Product

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls(__name__)]


class HookFailed(Exception):
    pass


def fail() -> None:
    raise HookFailed("an on_commit hook failed")


@redis_locked("charge:{n}", timeout=1, wait=0)
def charge(n: int, *, hook_inside: bool = False) -> None:
    Product.objects.create(name=f"charge-{n}", stock=1)
    if hook_inside:
        transaction.on_commit(fail)


@redis_locked("renewed-charge:{n}", timeout=1, renew=True, wait=0)
def renewed_charge(n: int, *, hook_inside: bool = False) -> None:
    Product.objects.create(name=f"renewed-charge-{n}", stock=1)
    if hook_inside:
        transaction.on_commit(fail)


@pytest.fixture(autouse=True)
def _no_leftover_pending() -> Iterator[None]:
    yield
    from django_redislock.locking import deferred

    deferred._pending().clear()


CHARGES: dict[bool, tuple[str, Callable[..., None]]] = {
    False: ("charge", charge),
    True: ("renewed-charge", renewed_charge),
}


@contextlib.contextmanager
def raising(robust: bool) -> Iterator[Any]:
    """``pytest.raises(HookFailed)``, or nothing for a robust hook (Django logs it)."""
    if robust:
        yield None
    else:
        with pytest.raises(HookFailed) as info:
            yield info


@pytest.mark.parametrize("renew", [False, True], ids=["lease", "renewed"])
@pytest.mark.parametrize(
    "where", ["before", "inside", "robust-before"], ids=lambda where: f"hook-{where}"
)
def test_released_at_commit_when_another_hook_fails(renew: bool, where: str) -> None:
    prefix, call = CHARGES[renew]
    robust = where == "robust-before"
    with raising(robust) as info, transaction.atomic():
        if where != "inside":
            transaction.on_commit(fail, robust=robust)
        call(1, hook_inside=where == "inside")
        assert not is_free(f"{prefix}:1")
    # The data committed; the lock went with the commit, not with the
    # exception (still alive here), and not a lease later.
    assert Product.objects.filter(name=f"{prefix}-1").count() == 1
    assert is_free(f"{prefix}:1")
    del info


def test_every_lock_is_released_when_a_hook_between_their_calls_fails() -> None:
    with pytest.raises(HookFailed) as info, transaction.atomic():
        charge(2)
        transaction.on_commit(fail)
        renewed_charge(2)
    assert is_free("charge:2")
    assert is_free("renewed-charge:2")
    del info


# -- through a request -------------------------------------------------------------------
def atomic_request_view(request: HttpRequest, n: int) -> HttpResponse:
    # ATOMIC_REQUESTS wraps this (undecorated) view: the locked call inside
    # is a call inside someone else's transaction.
    transaction.on_commit(fail)
    renewed_charge(n)
    return HttpResponse("ok")


def _charge_in_a_transaction(n: int) -> None:
    with transaction.atomic():
        transaction.on_commit(fail)
        renewed_charge(n)


async def async_view(request: HttpRequest, n: int) -> HttpResponse:
    await sync_to_async(_charge_in_a_transaction)(n)
    return HttpResponse("ok")


urlpatterns = [
    path("atomic-request/<int:n>/", atomic_request_view),
    path("async/<int:n>/", async_view),
]


def test_released_when_a_hook_fails_after_an_atomic_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(connections.settings["default"], "ATOMIC_REQUESTS", True)
    # The test client re-raises the view's exception and keeps it.
    client = Client()
    with pytest.raises(HookFailed) as info:
        client.get("/atomic-request/3/")
    assert Product.objects.filter(name="renewed-charge-3").exists()
    assert is_free("renewed-charge:3")
    del info


async def test_released_when_a_hook_fails_in_an_async_view() -> None:
    client = AsyncClient()
    try:
        with pytest.raises(HookFailed) as info:
            await client.get("/async/4/")
        assert await sync_to_async(is_free)("renewed-charge:4")
        del info
    finally:
        await close_async_clients()
