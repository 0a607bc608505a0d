"""No queryset slips past the fence: every shape Django can build, on every database CI runs.

One table, ``SHAPES``, lists the querysets a fenced write can be given: joins both ways,
multi-table inheritance with the fence in the parent's, the child's or a second parent's
table, proxies, managers with default filters, subqueries, ``Q`` with OR, ``exclude()``,
``F()`` and annotations in the updates, ``distinct()``, ``values()``, ``using()``... and the
shapes that are refused. Each shape is tried, through ``fenced_update`` and (when it names one
row) ``fenced_get``, on SQLite, on PostgreSQL at READ COMMITTED, REPEATABLE READ and
SERIALIZABLE, and on MariaDB at READ COMMITTED and REPEATABLE READ:

* by a stale holder (token 7) while a newer holder (token 9), on a connection of its own, has
  written the row that holds the fence and keeps its transaction open until the stale holder's
  statement waits for it (PostgreSQL's ``pg_locks``, InnoDB's monitor output) or is done;
* by a stale holder inside a transaction that read something before the newer holder
  committed (a REPEATABLE READ snapshot from before that commit);
* by the current holder: the write goes through, with the statements its route costs.

Each cell asserts the same thing: the stale holder's call fails, with ``StaleFence`` (at
PostgreSQL's REPEATABLE READ and SERIALIZABLE, inside a transaction, with the serialization
failure the database raises first; on SQLite, on the route that reads before it writes, maybe
with "database is locked"), or, for a shape that is refused, with ``TypeError`` before any
statement; nothing of the stale holder's commits; the stored token is the newer holder's. A
test runs every cell of one database and one situation, and names the cells that fail: a flush
of the test database per cell would cost more than the cells.
"""

from __future__ import annotations

import queue
import re
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import OperationalError, connections, models, transaction
from django.db.models import Count, Exists, F, FilteredRelation, OuterRef, Q, Subquery, Window
from django.db.models.functions import RowNumber
from django.test.utils import CaptureQueriesContext

from django_redislock.fencing import StaleFence, fenced_get, fenced_update
from tests.testapp.models import (
    Crate,
    InStockItem,
    Item,
    Label,
    Lid,
    LiddedItem,
    OpenShelfItem,
    Parcel,
    SealedCrate,
    Shelf,
)

BEFORE, STALE, NEWER = 5, 7, 9  # the stored token, the stale (or current) holder's, the newer's


# -- the rows of a cell --------------------------------------------------------------------
@dataclass
class Rows:
    """The rows of one cell: a target of one kind, and what its shapes filter by."""

    alias: str
    kind: str  # "item", "parcel" (fence in the parent's table), "crate" (in the child's), "lidded"
    target: models.Model
    other: Item | None = None  # a second item, on another shelf, for shapes of several rows

    @property
    def pk(self) -> Any:
        return self.target.pk

    def items(self) -> models.QuerySet[Item]:
        return Item.objects.using(self.alias)


# Where each kind keeps its fence: (model of the table, name of the field).
HOLDERS: dict[str, tuple[type[models.Model], str]] = {
    "item": (Item, "fence"),
    "parcel": (Item, "fence"),
    "crate": (SealedCrate, "fence"),
    "lidded": (Lid, "seal"),
}
TARGETS: dict[str, type[models.Model]] = {
    "item": Item,
    "parcel": Parcel,
    "crate": SealedCrate,
    "lidded": LiddedItem,
}
# The tables each kind writes, children first (as they are emptied).
TABLES: dict[str, list[type[models.Model]]] = {
    "item": [Label, Item, Shelf],
    "parcel": [Parcel, Item, Shelf],
    "crate": [SealedCrate, Crate, Shelf],
    "lidded": [LiddedItem, Item, Lid, Shelf],
}


def make_rows(alias: str, kind: str) -> Rows:
    shelves = [Shelf(name="open"), Shelf(name="closed")]
    open_shelf, closed = Shelf.objects.using(alias).bulk_create(shelves)
    common = {"name": "t", "stock": 3, "shelf": open_shelf}
    if kind == "item":
        t = Item.objects.using(alias).create(**common, fence=BEFORE)
        labels = [Label(item=t, text="red"), Label(item=t, text="blue")]
        Label.objects.using(alias).bulk_create(labels)
        u = Item.objects.using(alias).create(name="u", stock=3, shelf=closed, fence=BEFORE)
        return Rows(alias, kind, t, u)
    if kind == "parcel":
        return Rows(
            alias, kind, Parcel.objects.using(alias).create(**common, fence=BEFORE, code="c")
        )
    if kind == "crate":
        crate = SealedCrate.objects.using(alias).create(name="t", stock=3, fence=BEFORE, code="c")
        return Rows(alias, kind, crate)
    lidded = LiddedItem.objects.using(alias).create(**common, seal=BEFORE, colour="c")
    return Rows(alias, kind, lidded)


def holder_of(rows: Rows) -> tuple[type[models.Model], Any, str]:
    """The row that holds the target's fence: (model, primary key, field)."""
    model, name = HOLDERS[rows.kind]
    key = rows.target.lid_ptr_id if rows.kind == "lidded" else rows.pk  # type: ignore[attr-defined]
    return model, key, name


def clear(alias: str, kind: str) -> None:
    connection = connections[alias]
    with connection.cursor() as cursor:
        for model in TABLES[kind]:
            cursor.execute(f"DELETE FROM {connection.ops.quote_name(model._meta.db_table)}")


def snapshot(rows: Rows) -> dict[tuple[str, Any], dict[str, Any]]:
    """Every row of the cell's tables, table by table (each table's own columns)."""
    found = {}
    for model in TABLES[rows.kind]:
        names = [f.attname for f in model._meta.local_concrete_fields]
        for row in model._base_manager.using(rows.alias).values(*names):
            found[(model._meta.db_table, row[model._meta.pk.attname])] = row
    return found


# -- the table of shapes --------------------------------------------------------------------
ONE_ROW, ONE_TABLE, LOCKED, REFUSED, NOTHING = "one row", "one table", "locked", "refused", "none"
# What the refusals name as the form that works.
BY_KEYS = "filter(pk__in=list(queryset.values_list('pk', flat=True)))"


def _stock(rows: Rows) -> dict[str, Any]:
    return {"stock": 1}


def _code(rows: Rows) -> dict[str, Any]:
    return {"code": "x"}


def _colour(rows: Rows) -> dict[str, Any]:
    return {"colour": "x"}


@dataclass(frozen=True)
class Shape:
    name: str
    build: Callable[[Rows], Any]
    route: str  # the statements a current holder's write costs (ONE_ROW, ...) or REFUSED
    kind: str = "item"
    updates: Callable[[Rows], dict[str, Any]] = _stock
    expect: dict[str, Any] = field(default_factory=lambda: {"stock": 1})  # the target, after
    writes: int = 1  # rows a current holder's write updates (the target, and ``other``)
    get: bool = False  # names one row: fenced_get too
    refusal: str = ""  # what the TypeError names of the shape
    form: str = BY_KEYS  # the form that works, which the TypeError names too
    covers: tuple[str, ...] = ()


def _on(model: type[models.Model]) -> Callable[[Rows], Any]:
    return lambda r: model.objects.using(r.alias)  # type: ignore[attr-defined]


SHAPES = [
    # One table, one row: one statement.
    Shape("pk", lambda r: r.items().filter(pk=r.pk), ONE_ROW, get=True, covers=("using()",)),
    Shape(
        "using after the filter",
        lambda r: Item.objects.filter(pk=r.pk).using(r.alias),
        ONE_ROW,
        covers=("using()",),
    ),
    Shape(
        "F() in the updates",
        lambda r: r.items().filter(pk=r.pk),
        ONE_ROW,
        updates=lambda r: {"stock": F("stock") - 1},
        expect={"stock": 2},
        covers=("F() in the updates",),
    ),
    Shape(
        "subquery in the updates",
        lambda r: r.items().filter(pk=r.pk),
        ONE_ROW,
        updates=lambda r: {
            "name": Subquery(Shelf.objects.filter(pk=OuterRef("shelf_id")).values("name")[:1])
        },
        expect={"name": "open"},
        covers=("subquery",),
    ),
    Shape(
        "annotation in the filter and the updates",
        lambda r: r.items().annotate(double=F("stock") * 2).filter(pk=r.pk, double__gte=6),
        ONE_ROW,
        updates=lambda r: {"stock": F("double")},
        expect={"stock": 6},
        covers=("annotation", "F() in the updates"),
    ),
    Shape(
        "distinct",
        lambda r: r.items().filter(pk=r.pk).distinct(),
        ONE_ROW,
        get=True,
        covers=("distinct()",),
    ),
    Shape(
        "values",
        lambda r: r.items().filter(pk=r.pk).values("name", "fence"),
        ONE_ROW,
        get=True,
        covers=("values()",),
    ),
    Shape(
        "select_related",
        lambda r: r.items().filter(pk=r.pk).select_related("shelf"),
        ONE_ROW,
        get=True,
        covers=("select_related()",),
    ),
    Shape(
        "order_by through a join",
        lambda r: r.items().filter(pk=r.pk).order_by("shelf__name"),
        ONE_ROW,
        get=True,
        covers=("order_by()",),
    ),
    Shape(
        "extra where",
        lambda r: r.items().filter(pk=r.pk).extra(where=["stock >= 0"]),
        ONE_ROW,
        get=True,
        covers=("extra()",),
    ),
    Shape(
        "proxy with a default filter",
        lambda r: _on(InStockItem)(r).filter(pk=r.pk),
        ONE_ROW,
        get=True,
        covers=("proxy", "manager with a default filter"),
    ),
    Shape(
        "child's fence, child's fields",
        lambda r: _on(SealedCrate)(r).filter(pk=r.pk),
        ONE_ROW,
        kind="crate",
        updates=_code,
        expect={"code": "x"},
        get=True,
        covers=("multi-table inheritance, fence in the child",),
    ),
    # One table, any rows: the UPDATE, then the check.
    Shape(
        "pk__in a list", lambda r: r.items().filter(pk__in=[r.pk, r.other.pk]), ONE_TABLE, writes=2
    ),
    Shape(
        "pk__in a subquery",
        lambda r: r.items().filter(
            pk__in=Label.objects.using(r.alias).filter(text="red").values("item_id")
        ),
        ONE_TABLE,
        covers=("pk__in a subquery",),
    ),
    Shape(
        "pk__in a subquery of the same table through a join",
        lambda r: r.items().filter(pk__in=r.items().filter(shelf__name="open").values("pk")),
        ONE_TABLE,
        covers=("pk__in a subquery",),
    ),
    Shape(
        "Q with OR",
        lambda r: r.items().filter(Q(pk=r.pk) | Q(name="u")),
        ONE_TABLE,
        writes=2,
        covers=("Q with OR",),
    ),
    Shape("exclude", lambda r: r.items().exclude(name="u"), ONE_TABLE, covers=("exclude()",)),
    Shape(
        "exclude through a reverse join",
        lambda r: r.items().exclude(labels__text="green"),
        ONE_TABLE,
        writes=2,
        covers=("exclude()", "reverse join"),
    ),
    Shape(
        "Exists()",
        lambda r: r.items().filter(Exists(Label.objects.filter(item=OuterRef("pk"), text="red"))),
        ONE_TABLE,
        covers=("subquery",),
    ),
    Shape(
        "child's fence, several rows",
        lambda r: _on(SealedCrate)(r).filter(pk__in=[r.pk]),
        ONE_TABLE,
        kind="crate",
        updates=_code,
        expect={"code": "x"},
        covers=("multi-table inheritance, fence in the child",),
    ),
    # Joins and inheritance: the fences locked first.
    Shape(
        "pk and a forward join",
        lambda r: r.items().filter(pk=r.pk, shelf__name="open"),
        LOCKED,
        get=True,
        covers=("forward join",),
    ),
    Shape(
        "forward join",
        lambda r: r.items().filter(shelf__name="open"),
        LOCKED,
        covers=("forward join",),
    ),
    Shape(
        "reverse join",
        lambda r: r.items().filter(labels__text="red"),
        LOCKED,
        covers=("reverse join",),
    ),
    Shape(
        "reverse join, distinct",
        lambda r: r.items().filter(labels__text__in=["red", "blue"]).distinct(),
        LOCKED,
        covers=("reverse join", "distinct()"),
    ),
    Shape(
        "Q with OR through a join",
        lambda r: r.items().filter(Q(pk=r.pk) | Q(labels__text="green")),
        LOCKED,
        covers=("Q with OR", "reverse join"),
    ),
    Shape(
        "annotation through a join",
        lambda r: r.items().annotate(shelf_name=F("shelf__name")).filter(pk=r.pk),
        LOCKED,
        get=True,
        covers=("annotation", "forward join"),
    ),
    Shape(
        "aggregate through a join",
        lambda r: r.items().annotate(n=Count("labels")).filter(n__gte=2),
        LOCKED,
        get=True,
        covers=("annotation", "reverse join"),
    ),
    Shape(
        "aggregate through a join, then values()",
        lambda r: r.items().annotate(n=Count("labels")).filter(n__gte=2).values("name"),
        LOCKED,
        get=True,
        covers=("annotation", "values()", "reverse join"),
    ),
    Shape(
        "alias() through a join",
        lambda r: r.items().alias(shelf_name=F("shelf__name")).filter(shelf_name="open"),
        LOCKED,
        covers=("annotation", "forward join"),
    ),
    Shape(
        "FilteredRelation",
        lambda r: (
            r.items()
            .annotate(open_shelf=FilteredRelation("shelf", condition=Q(shelf__name="open")))
            .filter(open_shelf__isnull=False)
        ),
        LOCKED,
        covers=("forward join",),
    ),
    Shape(
        "values_list through a join",
        lambda r: r.items().filter(pk=r.pk).values_list("shelf__name"),
        LOCKED,
        get=True,
        covers=("values()", "forward join"),
    ),
    Shape(
        "proxy whose default filter joins",
        lambda r: _on(OpenShelfItem)(r).filter(pk=r.pk),
        LOCKED,
        get=True,
        covers=("proxy", "manager with a default filter", "forward join"),
    ),
    Shape(
        "parent queryset through the child's link",
        lambda r: r.items().filter(parcel__code="c"),
        LOCKED,
        kind="parcel",
        covers=("multi-table inheritance, fence in the parent", "reverse join"),
    ),
    Shape(
        "parent's fence, child's fields",
        lambda r: _on(Parcel)(r).filter(pk=r.pk),
        LOCKED,
        kind="parcel",
        updates=_code,
        expect={"code": "x"},
        get=True,
        covers=("multi-table inheritance, fence in the parent",),
    ),
    Shape(
        "parent's fence, parent's fields",
        lambda r: _on(Parcel)(r).filter(pk=r.pk),
        LOCKED,
        kind="parcel",
        covers=("multi-table inheritance, fence in the parent",),
    ),
    Shape(
        "parent's fence, filter on the parent",
        lambda r: _on(Parcel)(r).filter(shelf__name="open"),
        LOCKED,
        kind="parcel",
        updates=_code,
        expect={"code": "x"},
        covers=("multi-table inheritance, fence in the parent", "forward join"),
    ),
    Shape(
        "child's fence, parent's fields",
        lambda r: _on(SealedCrate)(r).filter(pk=r.pk),
        LOCKED,
        kind="crate",
        covers=("multi-table inheritance, fence in the child",),
    ),
    Shape(
        "child's fence, filter on the parent",
        lambda r: _on(SealedCrate)(r).filter(name="t"),
        LOCKED,
        kind="crate",
        updates=_code,
        expect={"code": "x"},
        get=True,
        covers=("multi-table inheritance, fence in the child",),
    ),
    Shape(
        "second parent's fence",
        lambda r: _on(LiddedItem)(r).filter(pk=r.pk),
        LOCKED,
        kind="lidded",
        updates=_colour,
        expect={"colour": "x"},
        get=True,
        covers=("multiple inheritance",),
    ),
    Shape(
        "second parent's fence, first parent's fields",
        lambda r: _on(LiddedItem)(r).filter(pk=r.pk),
        LOCKED,
        kind="lidded",
        covers=("multiple inheritance",),
    ),
    # No row.
    Shape("none()", lambda r: r.items().none(), NOTHING, writes=0),
    # Refused before anything is sent.
    Shape(
        "slice",
        lambda r: r.items().filter(pk=r.pk)[:1],
        REFUSED,
        get=True,
        refusal="sliced",
        covers=("slice",),
    ),
    Shape(
        "union()",
        lambda r: r.items().filter(pk=r.pk).union(r.items().filter(pk=r.pk)),
        REFUSED,
        get=True,
        refusal="union()",
        covers=("union()",),
    ),
    Shape(
        "intersection()",
        lambda r: r.items().filter(pk=r.pk).intersection(r.items().filter(pk=r.pk)),
        REFUSED,
        get=True,
        refusal="intersection()",
    ),
    Shape(
        "difference()",
        lambda r: r.items().filter(pk=r.pk).difference(r.items().filter(pk=r.other.pk)),
        REFUSED,
        get=True,
        refusal="difference()",
    ),
    Shape(
        "values() before an aggregate",
        lambda r: r.items().values("shelf").annotate(n=Count("id")).filter(n__gte=1),
        REFUSED,
        get=True,
        refusal="groups its rows",
    ),
    Shape(
        "aggregate of its own table",
        lambda r: r.items().annotate(n=Count("id")).filter(n__gte=1, pk=r.pk),
        REFUSED,
        get=True,
        refusal="aggregate of its own table",
    ),
    Shape(
        "extra tables",
        lambda r: r.items().extra(
            tables=["testapp_shelf"],
            where=["testapp_shelf.id = testapp_item.shelf_id", "testapp_shelf.name = 'open'"],
        ),
        REFUSED,
        get=True,
        refusal="extra(tables=...)",
        covers=("extra()",),
    ),
    Shape(
        "window function",
        lambda r: r.items().annotate(n=Window(RowNumber(), order_by="pk")).filter(n=1),
        REFUSED,
        get=True,
        refusal="window function",
    ),
    Shape(
        "a manager",
        lambda r: Item.objects.db_manager(r.alias),
        REFUSED,
        get=True,
        refusal="takes a QuerySet",
        form="Model.objects.all()",
    ),
    Shape(
        "raw()",
        lambda r: r.items().raw("SELECT * FROM testapp_item"),
        REFUSED,
        get=True,
        refusal="takes a QuerySet",
        form="pass a QuerySet",
    ),
]

CELLS = [(s, op) for s in SHAPES for op in ("update", "get") if op == "update" or s.get]
# A stale holder needs a row to be refused on.
STALE_CELLS = [(s, op) for s, op in CELLS if s.writes]


def test_the_table_covers_what_django_can_express() -> None:
    covered = {c for s in SHAPES for c in s.covers}
    assert covered >= {
        "forward join",
        "reverse join",
        "multi-table inheritance, fence in the parent",
        "multi-table inheritance, fence in the child",
        "multiple inheritance",
        "proxy",
        "pk__in a subquery",
        "Q with OR",
        "exclude()",
        "F() in the updates",
        "annotation",
        "distinct()",
        "manager with a default filter",
        "using()",
        "values()",
        "select_related()",
        "order_by()",
        "extra()",
    }
    assert len({s.name for s in SHAPES}) == len(SHAPES)
    # docs/guarantees.rst, "Fencing through every queryset", counts them.
    guarantees = (Path(__file__).parents[1] / "docs" / "guarantees.rst").read_text()
    assert f"one table of {len(SHAPES)} shapes" in " ".join(guarantees.split())
    assert {s.route for s in SHAPES} == {ONE_ROW, ONE_TABLE, LOCKED, REFUSED, NOTHING}


@pytest.mark.django_db
@pytest.mark.parametrize("op", ["update", "get"])
@pytest.mark.parametrize("name", ["shelf", "shelf__name", "labels", "id", "colour"])
def test_a_fence_field_that_is_no_column_of_the_model_is_refused(name: str, op: str) -> None:
    """A relation, a lookup, a reverse relation, the primary key, a field of a child model."""
    with (
        CaptureQueriesContext(connections["default"]) as sent,
        pytest.raises(TypeError, match=rf"^fenced_{op}\(\): field='{name}' must name a column"),
    ):
        (fenced_get if op == "get" else fenced_update)(Item.objects.filter(pk=1), 7, field=name)
    assert sent.captured_queries == []


def call(shape: Shape, op: str, rows: Rows, fence: int) -> Any:
    queryset = shape.build(rows)
    name = HOLDERS[shape.kind][1]
    if op == "get":
        return fenced_get(queryset, fence, field=name)
    return fenced_update(queryset, fence, field=name, **shape.updates(rows))


# -- the databases ---------------------------------------------------------------------------
def _database(alias: str, base: str) -> Any:
    if alias not in settings.DATABASES:
        return pytest.param(alias, marks=pytest.mark.skip(reason=f"{alias} not reachable"))
    # Django sets up "default" first, whichever other database a test asks for.
    databases = list(dict.fromkeys(["default", base, alias]))
    return pytest.param(alias, marks=pytest.mark.django_db(transaction=True, databases=databases))


BACKENDS = [
    _database("default", "default"),
    *[_database(a, "postgres") for a in ["postgres", *settings.POSTGRES_ISOLATION_LEVELS]],
    *[_database(a, "mysql") for a in ["mysql", "mysql_repeatable_read"]],
]
SERVERS = BACKENDS[1:]  # where a second connection commits while a transaction is open

SNAPSHOT_LEVELS = set(settings.POSTGRES_ISOLATION_LEVELS)


def assert_refusal(outcome: Exception | None, shape: Shape, op: str) -> None:
    """A TypeError that names the caller, the shape and the form that works."""
    assert isinstance(outcome, TypeError), repr(outcome)
    message = str(outcome)
    assert message.startswith(f"fenced_{op}()"), message
    assert shape.refusal in message and shape.form in message, message


def assert_refused(
    alias: str, outcome: Exception | None, shape: Shape, op: str, *, in_transaction: bool
) -> None:
    """The stale holder's call failed as it must on ``alias``. ``in_transaction``: whether its
    statements ran in a transaction (the caller's, or the route's own)."""
    if shape.route == REFUSED:
        assert_refusal(outcome, shape, op)
        return
    vendor = connections[alias].vendor
    if alias in SNAPSHOT_LEVELS and in_transaction:
        # The database refuses first, and Django's error goes through (docs/guarantees.rst).
        assert isinstance(outcome, OperationalError), repr(outcome)
        assert getattr(outcome.__cause__, "sqlstate", None) == "40001", repr(outcome.__cause__)
    elif vendor == "sqlite" and shape.route == LOCKED and isinstance(outcome, OperationalError):
        # It read first: SQLite refuses its write while the newer holder's is open.
        assert "database is locked" in str(outcome)
    else:
        # Also at PostgreSQL's stricter levels for a statement outside any transaction:
        # psycopg sends it at the server's default level (READ COMMITTED).
        assert isinstance(outcome, StaleFence), repr(outcome)


def attempt(work: Callable[[], Any]) -> tuple[Any, Exception | None]:
    """What ``work()`` returned, or the exception it raised."""
    try:
        return work(), None
    except Exception as exc:
        return None, exc


# -- a newer holder's write in flight --------------------------------------------------------
class Flight:
    """One write of the newer holder: token 9 in the row that holds the fence, in a transaction
    kept open until the stale holder's statement waits for that row, or the stale call is done."""

    def __init__(self, rows: Rows, stale: Any) -> None:
        self.rows, self.stale = rows, stale  # stale: the stale holder's connection on the server
        self.in_flight, self.stale_issued, self.stale_done, self.landed = (
            threading.Event() for _ in range(4)
        )
        self.failed: BaseException | None = None

    def fly(self) -> None:
        alias = self.rows.alias
        model, key, name = holder_of(self.rows)
        try:
            with transaction.atomic(using=alias):
                queryset = model.objects.using(alias).filter(pk=key)  # type: ignore[attr-defined]
                assert fenced_update(queryset, NEWER, field=name) == 1
                self.in_flight.set()
                self._until_the_stale_holder_waits_or_is_done()
        except BaseException as exc:  # recorded, so a failure shows what happened
            self.failed = exc
        finally:
            self.in_flight.set()
            self.landed.set()

    def land(self) -> None:
        """Let the newer holder commit (if it has not yet), and wait until it has."""
        self.stale_done.set()
        assert self.landed.wait(60), "the newer holder hung"
        assert self.failed is None, repr(self.failed)

    def _until_the_stale_holder_waits_or_is_done(self) -> None:
        vendor = connections[self.rows.alias].vendor
        deadline = time.monotonic() + 60  # a bound on a broken test, not a timing assumption
        while not self.stale_done.is_set():
            if self._stale_waits(vendor):
                return
            assert time.monotonic() < deadline, "the stale holder neither waited nor finished"
            self.stale_done.wait(0.005)

    def _stale_waits(self, vendor: str) -> bool:
        if vendor == "sqlite":
            # No lock table to read: the stale holder has sent a statement, which SQLite's
            # writer lock holds off until this transaction ends (bounded by the busy
            # timeout, Python's 5 s) or fails at once.
            return self.stale_issued.is_set()
        with connections[self.rows.alias].cursor() as cursor:
            if vendor == "postgresql":
                cursor.execute(
                    "SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted", [self.stale]
                )
                return cursor.fetchone() is not None
            # Not INNODB_TRX: InnoDB refreshes it only when nobody read it for 0.1 s, so a
            # poller (or another test's) can keep reading a row from before the wait began.
            cursor.execute("SHOW ENGINE INNODB STATUS")
            status = cursor.fetchone()[2]
        thread = re.compile(rf"\b(?:MariaDB|MySQL) thread id {self.stale},")
        return any(
            "LOCK WAIT" in transaction and thread.search(transaction)
            for transaction in status.split("\n---TRANSACTION ")
        )


class NewerHolder:
    """A thread with a database connection of its own, which flies the newer holder's writes,
    cell after cell (one connection for all: opening one per cell would cost more)."""

    def __init__(self) -> None:
        self.flights: queue.Queue[Flight | None] = queue.Queue()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def write(self, rows: Rows, stale: Any = None) -> Flight:
        flight = Flight(rows, stale)
        self.flights.put(flight)
        assert flight.in_flight.wait(60), "the newer holder did not start"
        return flight

    def close(self) -> None:
        self.flights.put(None)
        self.thread.join(60)
        assert not self.thread.is_alive()

    def _serve(self) -> None:
        try:
            while (flight := self.flights.get()) is not None:
                flight.fly()
        finally:
            connections.close_all()


def backend_id(alias: str) -> Any:
    """The id the server gives this thread's connection on ``alias``, as its lock views name it."""
    connection = connections[alias]
    connection.ensure_connection()
    if connection.vendor == "postgresql":
        return connection.connection.info.backend_pid
    if connection.vendor == "mysql":
        return connection.connection.thread_id()
    return None


def stale_while_newer_in_flight(rows: Rows, shape: Shape, op: str, newer: NewerHolder) -> None:
    before = snapshot(rows)
    flight = newer.write(rows, backend_id(rows.alias))

    def issued(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        flight.stale_issued.set()
        return execute(sql, params, many, context)

    connection = connections[rows.alias]
    with connection.execute_wrapper(issued), CaptureQueriesContext(connection) as sent:
        _, outcome = attempt(lambda: call(shape, op, rows, STALE))
    flight.land()
    # The one-row route sends its UPDATE outside any transaction; the others open their own.
    assert_refused(rows.alias, outcome, shape, op, in_transaction=shape.route != ONE_ROW)
    if shape.route == REFUSED:
        assert sent.captured_queries == []
    model, key, name = holder_of(rows)
    before[(model._meta.db_table, key)][name] = NEWER
    assert snapshot(rows) == before  # the newer holder's token, nothing of the stale one's


def stale_after_newer_committed(rows: Rows, shape: Shape, op: str, newer: NewerHolder) -> None:
    before = snapshot(rows)
    alias = rows.alias
    sent = CaptureQueriesContext(connections[alias])

    def stale_transaction() -> None:
        with transaction.atomic(using=alias):
            # A read of another table: the snapshot of REPEATABLE READ predates the commit.
            assert Shelf.objects.using(alias).filter(name="open").exists()
            newer.write(rows).land()
            Shelf.objects.using(alias).create(name="the stale holder's own write")
            with sent:
                call(shape, op, rows, STALE)

    _, outcome = attempt(stale_transaction)
    assert_refused(alias, outcome, shape, op, in_transaction=True)
    if shape.route == REFUSED:
        assert sent.captured_queries == []
    elif alias in SNAPSHOT_LEVELS:
        # The serialization failure's retry: its snapshot has the newer holder's commit.
        def retry() -> None:
            with transaction.atomic(using=alias):
                call(shape, op, rows, STALE)

        _, outcome = attempt(retry)
        assert isinstance(outcome, StaleFence), repr(outcome)
    model, key, name = holder_of(rows)
    before[(model._meta.db_table, key)][name] = NEWER
    assert snapshot(rows) == before


# -- the current holder ----------------------------------------------------------------------
def statements(sent: CaptureQueriesContext) -> list[str]:
    """The statements sent, but for the transaction's own (SQLite sends them as statements)."""
    return [q["sql"] for q in sent.captured_queries if q["sql"].upper() not in ("BEGIN", "COMMIT")]


def assert_route(alias: str, shape: Shape, op: str, sent: list[str]) -> None:
    verbs = [s.split()[0].upper() for s in sent]
    read = ["SELECT"] if op == "get" else []  # fenced_get's get(), where it runs one
    if shape.route == ONE_ROW:
        assert verbs in (["UPDATE"], ["UPDATE", *read]), sent
    elif shape.route == ONE_TABLE:
        assert verbs == ["UPDATE", "SELECT", *read], sent
    elif shape.route == NOTHING:
        assert verbs == [], sent
    else:
        # The keys, the locking read of the fences, then Django's own update (on MariaDB or
        # with multi-table inheritance it selects the ids itself first).
        locks = connections[alias].features.has_select_for_update
        assert verbs[:2] == ["SELECT", "SELECT"], sent
        assert ("FOR UPDATE" in sent[1]) is locks and "FOR UPDATE" not in sent[0], sent
        writes = verbs[2 : len(verbs) - len(read)]
        assert "UPDATE" in writes and not any("FOR UPDATE" in s for s in sent[2:]), sent


def current_holder_writes(rows: Rows, shape: Shape, op: str, newer: Any) -> None:
    alias = rows.alias
    with CaptureQueriesContext(connections[alias]) as sent:
        got, outcome = attempt(lambda: call(shape, op, rows, STALE))
    if shape.route == REFUSED:
        assert_refusal(outcome, shape, op)
        assert statements(sent) == []
        # The form the refusal names writes the same rows.
        if shape.form == BY_KEYS:
            keys = list(shape.build(rows).values_list("pk", flat=True))
            assert fenced_update(rows.items().filter(pk__in=keys), STALE, stock=1) == len(keys)
        return
    assert outcome is None, "".join(traceback.format_exception(outcome))
    assert_route(alias, shape, op, statements(sent))
    model, key, name = holder_of(rows)
    if op == "get":
        assert got is not None
    else:
        assert got == shape.writes
    if not shape.writes:
        return
    target = TARGETS[shape.kind]._base_manager.using(alias).get(pk=rows.pk)
    assert getattr(target, name) == STALE
    if op == "update":
        assert {k: getattr(target, k) for k in shape.expect} == shape.expect
    if shape.writes == 2:
        assert rows.other is not None
        rows.other.refresh_from_db()
        assert rows.other.fence == STALE


# -- the matrix ------------------------------------------------------------------------------
Cell = Callable[[Rows, Shape, str, NewerHolder], None]


def run_cells(alias: str, cells: list[tuple[Shape, str]], cell: Cell) -> None:
    """Every cell on ``alias``, each on rows of its own; the failures, named, at the end."""
    failed = []
    newer = NewerHolder()
    try:
        for shape, op in cells:
            try:
                cell(make_rows(alias, shape.kind), shape, op, newer)
            except Exception as exc:
                failed.append(f"{shape.name} / {op}: {''.join(traceback.format_exception(exc))}")
            finally:
                clear(alias, shape.kind)
    finally:
        newer.close()
    assert not failed, f"{len(failed)} of {len(cells)} cells failed:\n" + "\n".join(failed)


@pytest.mark.parametrize("alias", BACKENDS)
def test_a_stale_holder_is_refused_while_a_newer_holders_write_is_in_flight(alias: str) -> None:
    run_cells(alias, STALE_CELLS, stale_while_newer_in_flight)


@pytest.mark.parametrize("alias", SERVERS)
def test_a_stale_holder_is_refused_after_a_newer_holder_committed(alias: str) -> None:
    """Inside a transaction that read before the commit (SQLite: its read would hold off the
    newer holder's commit, so this cannot happen there)."""
    run_cells(alias, STALE_CELLS, stale_after_newer_committed)


@pytest.mark.parametrize("alias", BACKENDS)
def test_a_current_holder_writes_through_every_shape(alias: str) -> None:
    run_cells(alias, CELLS, current_holder_writes)
