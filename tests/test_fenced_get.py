"""fenced_get(): claim one row for the lock's holder and read it, in one statement."""

from __future__ import annotations

import datetime
import decimal
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections, transaction
from django.db.models import F
from django.db.transaction import TransactionManagementError
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_redislock.fencing import FencedQuerySet, StaleFence, fenced_get
from django_redislock.locking.fencing import _returns_from_update
from tests.test_db_consistency import ALIASES, ALL_DBS
from tests.testapp.models import Order, Product, Ticket

pytestmark = pytest.mark.django_db(transaction=True, databases=ALL_DBS)


def _statements(alias: str, call: Callable[[], Any]) -> tuple[Any, list[str]]:
    with CaptureQueriesContext(connections[alias]) as seen:
        result = call()
    return result, [q["sql"].split()[0].upper() for q in seen.captured_queries]


def _fields(obj: Any) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


@pytest.mark.parametrize("alias", ALIASES)
def test_it_claims_and_reads_the_row_in_one_statement(alias: str) -> None:
    products = Product.objects.using(alias)
    a = products.create(name="a", stock=3, fence=5)
    got, statements = _statements(alias, lambda: fenced_get(products.filter(pk=a.pk), 7))
    one = ["UPDATE"] if _returns_from_update(alias) else ["UPDATE", "SELECT"]  # SQLite < 3.35
    assert statements == one
    assert isinstance(got, Product)
    assert _fields(got) == {"id": a.pk, "name": "a", "stock": 3, "fence": 7}
    assert got._state.db == alias and not got._state.adding
    assert products.get(pk=a.pk).fence == 7
    # The same holder may claim again; in a transaction it is still one statement.
    with transaction.atomic(using=alias):
        again, statements = _statements(alias, lambda: fenced_get(products.filter(pk=a.pk), 7))
    assert statements == one and _fields(again) == _fields(got)


@pytest.mark.parametrize("alias", ALIASES)
def test_values_come_back_in_the_types_get_gives(alias: str) -> None:
    tickets = Ticket.objects.using(alias)
    t = tickets.create(
        code="t-1",
        sold_at=datetime.datetime(2026, 11, 25, 19, 0, 1, 250000, tzinfo=datetime.timezone.utc),
        paid=True,
        price=decimal.Decimal("12.50"),
        uid=uuid.UUID("12345678-1234-5678-1234-567812345678"),
    )
    got = fenced_get(tickets.filter(code="t-1"), 9)  # a unique field names one row too
    read = tickets.get(pk=t.pk)
    assert _fields(got) == _fields(read)
    assert {k: type(v) for k, v in _fields(got).items()} == {
        k: type(v) for k, v in _fields(read).items()
    }
    assert got.fence == 9


@pytest.mark.parametrize("alias", ALIASES)
def test_a_newer_holder_s_row_is_refused_and_dooms_the_transaction(alias: str) -> None:
    products = Product.objects.using(alias)
    a = products.create(name="a", stock=1, fence=9)
    with pytest.raises(StaleFence) as info:
        fenced_get(products.filter(pk=a.pk), 7)
    assert info.value.fence == 7 and info.value.model is Product
    with transaction.atomic(using=alias):
        products.filter(pk=a.pk).update(name="written by a stale holder")
        with pytest.raises(StaleFence):
            fenced_get(products.filter(pk=a.pk), 7)
        with pytest.raises(TransactionManagementError):
            products.count()
    assert products.get(pk=a.pk).name == "a" and products.get(pk=a.pk).fence == 9


@pytest.mark.parametrize("alias", ALIASES)
def test_no_row_raises_does_not_exist(alias: str) -> None:
    products = Product.objects.using(alias)
    with pytest.raises(Product.DoesNotExist):
        fenced_get(products.filter(pk=-1), 7)


@pytest.mark.parametrize("alias", ALIASES)
def test_other_querysets_claim_then_get(alias: str) -> None:
    products = Product.objects.using(alias)
    a = products.create(name="same", stock=1, fence=1)
    got, statements = _statements(alias, lambda: fenced_get(products.filter(name="same"), 7))
    assert got.pk == a.pk and got.fence == 7
    assert [s for s in statements if s not in ("BEGIN", "COMMIT")] == ["UPDATE", "SELECT", "SELECT"]
    products.create(name="same", stock=1)
    with pytest.raises(Product.MultipleObjectsReturned):
        fenced_get(products.filter(name="same"), 8)


def test_a_database_without_update_returning_claims_then_gets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    features = type(connections["default"].features)
    monkeypatch.setattr(features, "can_return_rows_from_bulk_insert", False)
    a = Product.objects.create(name="a", stock=1)
    got, statements = _statements("default", lambda: fenced_get(Product.objects.filter(pk=a.pk), 7))
    assert statements == ["UPDATE", "SELECT"] and got.fence == 7


def test_queryset_method_errors_and_locks_off() -> None:
    a = Product.objects.create(name="q", stock=3)
    assert FencedQuerySet(model=Product).filter(pk=a.pk).fenced_get(4).fence == 4
    with pytest.raises(TypeError, match="current_fence"):
        fenced_get(Product.objects.filter(pk=a.pk), None)
    with pytest.raises(TypeError, match="must be an int"):
        fenced_get(Product.objects.filter(pk=a.pk), "5")  # type: ignore[arg-type]
    with override_settings(REDISLOCK={"ENABLED": False}):
        assert fenced_get(Product.objects.filter(pk=a.pk), None).fence == 4


@pytest.mark.parametrize(
    ("shape", "expect"),
    [
        (lambda qs: qs.values("name", "fence"), {"name": "a", "fence": 7}),
        (lambda qs: qs.values_list("fence", flat=True), 7),
        (lambda qs: qs.annotate(twice=F("stock") * 2), 6),
        (lambda qs: qs.only("name"), "a"),
    ],
    ids=["values", "values_list", "annotate", "only"],
)
def test_querysets_that_read_more_or_less_than_an_instance_get_what_get_gives(
    shape: Callable[[Any], Any], expect: Any
) -> None:
    a = Product.objects.create(name="a", stock=3)
    got, statements = _statements(
        "default", lambda: fenced_get(shape(Product.objects.filter(pk=a.pk)), 7)
    )
    assert [s for s in statements if s not in ("BEGIN", "COMMIT")] == ["UPDATE", "SELECT"]
    if isinstance(expect, (dict, int)) and not isinstance(got, Product):
        assert got == expect
    elif hasattr(got, "twice"):
        assert got.twice == expect
    else:
        assert got.name == expect and got.get_deferred_fields() == {"stock", "fence"}


def test_select_related_and_extra_are_read_by_get() -> None:
    from django_redislock.locking.fencing import _reads_whole_instances

    orders = Order.objects.filter(pk=1)
    assert _reads_whole_instances(orders)
    assert not _reads_whole_instances(orders.select_related("product"))
    assert not _reads_whole_instances(orders.extra(select={"one": "1"}))
    assert not _reads_whole_instances(orders.defer("product"))
