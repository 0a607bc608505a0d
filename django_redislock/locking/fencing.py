"""Fencing tokens in ORM writes: the database refuses a holder whose lease ran out.

A lock's lease can run out while its holder still works (a long GC pause, a
stalled network, a lost Redis key). The next holder then gets a larger
fencing token. If every write through the lock stores the token it was made
under, and only succeeds where the stored token is not larger, the late
holder's write is refused by the database itself::

    @redis_locked("purchase:{product_id}")
    def purchase(product_id):
        fence = current_fence()
        qs = Product.objects.filter(pk=product_id)
        product = fenced_get(qs, fence)      # claim the row as it is read
        fenced_update(qs, fence, stock=product.stock - 1)

``fence <= token`` (not ``<``) lets one holder write the same row several
times. Claiming the row as it is read closes the remaining gap: from the
claim on, writes of every older holder are refused, so nothing older can
change what this holder read. How a write reaches the rows that hold the
fences depends on how Django compiles the queryset's UPDATE: the routes are
chosen in ``fence_shapes.py``.
"""

from __future__ import annotations

from typing import Any, TypeGuard, TypeVar

from django.db import connections, models, transaction
from django.db.models import sql
from django.db.models.query import ModelIterable

from ..conf import conf
from ..core import LockLost
from .fence_shapes import Route, fence_holder, route

__all__ = ["FencedQuerySet", "FencedQuerySetMixin", "StaleFence", "fenced_get", "fenced_update"]

M = TypeVar("M", bound=models.Model)


class StaleFence(LockLost):
    """A write carried an older fencing token than one already stored.

    The writer's lease ran out and a newer holder has written since. A
    ``LockLost`` (so ``except LockLost`` covers it); the update was rolled back.
    """

    def __init__(self, message: str, *, fence: int, model: type[models.Model]) -> None:
        super().__init__(message)
        self.fence = fence
        self.model = model


def fenced_update(
    queryset: models.QuerySet[Any], fence: int | None, *, field: str = "fence", **updates: Any
) -> int:
    """``queryset.update(**updates)``, refused if a newer lock holder wrote first.

    Stores ``fence`` in ``field`` of every updated row, and updates only rows
    whose stored token is not larger. If any row of ``queryset`` holds a
    larger token, nothing is updated and ``StaleFence`` is raised. Returns the
    number of rows updated (0 when ``queryset`` matches no row).

    A queryset on one table that names one row (an exact match on its primary
    key or another unique field, as ``filter(pk=...)``) costs one statement
    when the write goes through: the UPDATE, with no transaction of its own; a
    second one runs only when it updated nothing, to tell "no such row" (0)
    from "a newer holder wrote" (``StaleFence``). Any other queryset on one
    table costs two (the UPDATE, then a check for newer tokens) in a
    transaction of its own when the caller has none. On MySQL and MariaDB the
    check inside a transaction is a locking read (``SELECT ... FOR UPDATE``),
    which reads the rows as last committed at every isolation level,
    REPEATABLE READ included.

    A queryset that joins (a filter, an annotation or a manager's default
    filter through a relation) or writes through multi-table inheritance is
    one Django compiles into a sub-select or pre-selected ids, where a fence
    condition is not re-checked against a newer holder's write: there the
    keys of its rows are read, the rows that hold their fences are locked
    (``SELECT ... FOR UPDATE``), and ``update()`` runs only if none holds a
    newer token, all in one transaction. A shape that names no rows to fence
    or that ``update()`` cannot write (a slice, ``union()``, ``values()``
    before an aggregate, ``extra(tables=...)``, a filter on a window
    function or on an aggregate of its own table) is refused with
    ``TypeError`` before anything is sent.

    Inside a transaction, ``StaleFence`` marks the whole transaction for
    rollback, as a lost lock does: a holder whose lease ran out commits
    nothing. At PostgreSQL's REPEATABLE READ and SERIALIZABLE a row changed
    since the transaction's snapshot is refused by the database itself, with
    the serialization failure Django raises as ``OperationalError``.

    ``fence=None`` is accepted only while ``REDISLOCK['ENABLED']`` is False
    (no lock, so no token): then it is a plain ``update()``.
    """
    if not _is_token(fence, "fenced_update"):
        return queryset.update(**updates) if updates else queryset.count()
    if field in updates:
        raise TypeError(
            f"fenced_update(): {field!r} is the fence field and is set from fence=; "
            "remove it from the updates"
        )
    way = route(queryset, field, updates, "fenced_update")
    if way is Route.LOCKED:
        return _write_locked(queryset, fence, field, updates)
    mine = queryset.filter(**{f"{field}__lte": fence})
    if way is Route.ONE_ROW:
        # One row: the UPDATE alone is all or nothing, and when it updates
        # that row no row of the queryset can hold a newer token.
        updated = mine.update(**{field: fence}, **updates)
        if updated or not _newer_token_stored(queryset, field, fence):
            return updated
        raise _refused(queryset, fence)
    # All or nothing without a savepoint: on its own, this is one transaction;
    # inside the caller's, StaleFence dooms that whole transaction (Django marks
    # it for rollback), so a partial update never commits, and neither does
    # anything else the stale holder wrote in it. A savepoint would cost two
    # more round trips on every call, only to let a holder whose lease ran out
    # commit the rest of its work.
    with transaction.atomic(using=queryset.db, savepoint=False):
        updated = mine.update(**{field: fence}, **updates)
        if _newer_token_stored(queryset, field, fence):
            raise _stale(queryset, fence)
    return updated


def _write_locked(
    queryset: models.QuerySet[Any], fence: int, field: str, updates: dict[str, Any]
) -> int:
    """Lock the rows that hold the fences of ``queryset``'s rows, then ``update()``.

    The keys come first, from a plain read (materialised, so that the locking
    read names rows by key only: with a join, PostgreSQL's FOR UPDATE re-checks
    only the locked table's row after a wait). The locking read then waits for
    a newer holder still in its transaction and reads its committed token.
    Once locked, no other fenced write reaches those rows before this
    transaction ends, so Django's update() may select them as it likes.
    """
    holder = fence_holder(queryset, field, "fenced_update")
    with transaction.atomic(using=queryset.db, savepoint=False):
        reading = queryset.order_by().values_list("pk", holder.key)
        reading.query.select_for_update = False  # the fence rows are the ones to lock
        keys = dict(reading)
        if not keys:
            return 0
        fences = dict(
            models.QuerySet(holder.model, using=queryset.db)
            .filter(pk__in=set(keys.values()))
            .order_by("pk")  # one order for every caller: no deadlock between two
            .select_for_update()
            .values_list("pk", field)
        )
        if any(stored > fence for stored in fences.values()):
            raise _stale(queryset, fence)
        # A row deleted since the read is gone from the lock's answer: not written.
        rows = [pk for pk, key in keys.items() if key in fences]
        if not rows:
            return 0
        return queryset.filter(pk__in=rows).update(**{field: fence}, **updates)


def fenced_get(queryset: models.QuerySet[M], fence: int | None, *, field: str = "fence") -> M:
    """Claim the one row of ``queryset`` for this holder, and return it.

    What ``fenced_update(queryset, fence)`` then ``queryset.get()`` do, so
    that from the claim on the database refuses the writes of every older
    holder and nothing older can change what was read. Raises
    ``queryset.model.DoesNotExist`` when no row matches, ``StaleFence`` when a
    newer holder wrote the row (inside a transaction, that dooms it, as
    ``fenced_update`` does), and ``MultipleObjectsReturned`` as ``get()`` does.

    One statement where the database returns the rows an UPDATE wrote
    (``UPDATE ... RETURNING``: PostgreSQL, SQLite 3.35 and later), the
    queryset is on one table and names one row (an exact match on its
    primary key or another unique field, as ``filter(pk=...)``) and it reads
    plain instances. Otherwise (MySQL, MariaDB, ``values()``, ``annotate()``,
    ``select_related()``, ``only()``, joins, multi-table inheritance...)
    ``fenced_update()`` and then, when it claimed a row, ``get()``, whose
    result it returns. A shape ``fenced_update()`` refuses is refused here
    too, with ``TypeError``. ``fence=None`` is accepted only while
    ``REDISLOCK['ENABLED']`` is False: then it is a plain ``get()``.
    """
    if not _is_token(fence, "fenced_get"):
        return queryset.get()
    if (
        route(queryset, field, {}, "fenced_get") is Route.ONE_ROW
        and _reads_whole_instances(queryset)
        and _returns_from_update(queryset.db)
    ):
        rows = _claim_returning(queryset.filter(**{f"{field}__lte": fence}), {field: fence})
        if rows:
            return rows[0]  # one row at most: Route.ONE_ROW
        if _newer_token_stored(queryset, field, fence):
            raise _refused(queryset, fence)
        raise _does_not_exist(queryset)
    if not fenced_update(queryset, fence, field=field):
        # Nothing claimed and nothing newer: no row matches as last committed.
        # get() would read the transaction's snapshot on MySQL under
        # REPEATABLE READ, where a row a newer holder deleted is still found.
        raise _does_not_exist(queryset)
    # The claimed rows: the UPDATE read them as last committed, and from then
    # on every read in this transaction sees this holder's own version.
    return queryset.get()


def _newer_token_stored(queryset: models.QuerySet[Any], field: str, fence: int) -> bool:
    """Whether a row of ``queryset``, as last committed, holds a token above ``fence``.

    Inside a transaction on MySQL and MariaDB a plain SELECT reads the
    transaction's snapshot under REPEATABLE READ (taken at its first read,
    maybe before the newer holder committed; READ COMMITTED is per statement):
    there the check would find nothing newer, and a stale holder's refused
    UPDATE would pass for "no such row" or commit half its rows. A locking
    read (``FOR UPDATE``) reads the last committed version at every InnoDB
    isolation level, and waits for a writer still in its transaction. The
    rows it locks are the ones this holder meant to write anyway. Elsewhere
    a plain read: PostgreSQL at REPEATABLE READ and above refuses, in the
    UPDATE itself, a row changed since the snapshot (a serialization
    failure); SQLite lets one writer in at a time.
    """
    newer = queryset.filter(**{f"{field}__gt": fence})
    connection = connections[queryset.db]
    if connection.vendor == "mysql" and not connection.get_autocommit():
        # Outside a transaction each statement reads what has committed, and
        # Django refuses select_for_update() there.
        newer = newer.select_for_update()
    return newer.exists()


def _is_token(fence: int | None, caller: str) -> TypeGuard[int]:
    """Whether ``fence`` is a token to write; False for ``None`` while locks
    are off (no lock, so no token); TypeError for anything else."""
    if fence is None:
        if conf.ENABLED:
            raise TypeError(
                f"{caller}() needs the lock's fencing token: pass current_fence() "
                "(or lock.fence) from inside the lock"
            )
        return False
    if isinstance(fence, bool) or not isinstance(fence, int):
        raise TypeError(f"{caller}(): fence must be an int token, not {fence!r}")
    return True


def _reads_whole_instances(queryset: models.QuerySet[Any]) -> bool:
    """Whether ``get()`` would return a plain instance of one table: no
    ``values()``, ``annotate()``, ``select_related()``, ``only()``/``defer()``
    or ``extra()``, and no parent's table (multi-table inheritance), whose
    results the claim's RETURNING could not give as ``get()`` does."""
    query = queryset.query
    return (
        queryset._iterable_class is ModelIterable
        and not query.annotations
        and not query.select_related
        and not query.extra
        and query.deferred_loading == (frozenset(), True)
        and not queryset.model._meta.concrete_model._meta.parents
    )


def _returns_from_update(alias: str) -> bool:
    connection = connections[alias]
    if connection.vendor == "postgresql":
        return True
    # Django reads SQLite's RETURNING support (3.35+) into this flag.
    return connection.vendor == "sqlite" and connection.features.can_return_rows_from_bulk_insert


def _claim_returning(queryset: models.QuerySet[M], values: dict[str, Any]) -> list[M]:
    """``queryset.update(**values)`` that returns the updated rows as instances."""
    connection = connections[queryset.db]
    query: Any = queryset.query.chain(sql.UpdateQuery)
    query.add_update_values(values)
    query.clear_select_clause()
    update_sql, params = query.get_compiler(queryset.db).as_sql()
    meta = queryset.model._meta
    fields = meta.concrete_fields
    quote = connection.ops.quote_name
    returning = ", ".join(quote(str(f.column)) for f in fields)
    columns = [f.get_col(query.base_table) for f in fields]
    converters = [
        connection.ops.get_db_converters(column) + column.get_db_converters(connection)
        for column in columns
    ]
    with (
        transaction.mark_for_rollback_on_error(using=queryset.db),
        connection.cursor() as cursor,
    ):
        cursor.execute(f"{update_sql} RETURNING {returning}", params)
        rows = cursor.fetchall()
    names = [f.attname for f in fields]
    found = []
    for row in rows:
        values_read = list(row)
        for i, (column, convert) in enumerate(zip(columns, converters, strict=True)):
            for converter in convert:
                values_read[i] = converter(values_read[i], column, connection)
        found.append(queryset.model.from_db(queryset.db, names, values_read))
    return found


def _refused(queryset: models.QuerySet[Any], fence: int) -> StaleFence:
    """StaleFence for a write refused outside the general path's atomic
    block: the caller's transaction is marked for rollback, as leaving an
    atomic block without a savepoint on an error does."""
    connection = transaction.get_connection(queryset.db)
    if connection.in_atomic_block:
        connection.set_rollback(True)
    return _stale(queryset, fence)


def _does_not_exist(queryset: models.QuerySet[Any]) -> Exception:
    model: Any = queryset.model
    return model.DoesNotExist(f"{model._meta.object_name} matching query does not exist.")


def _stale(queryset: models.QuerySet[Any], fence: int) -> StaleFence:
    return StaleFence(
        f"{queryset.model.__name__} was written under a newer lock holder than "
        f"fence {fence}: this holder's lease ran out, and its write was refused",
        fence=fence,
        model=queryset.model,
    )


class FencedQuerySetMixin:
    """Adds ``.fenced_update(fence, **updates)`` and ``.fenced_get(fence)`` to a QuerySet class."""

    def fenced_update(self, fence: int | None, *, field: str = "fence", **updates: Any) -> int:
        return fenced_update(self, fence, field=field, **updates)  # type: ignore[arg-type]

    def fenced_get(self, fence: int | None, *, field: str = "fence") -> Any:
        return fenced_get(self, fence, field=field)  # type: ignore[arg-type]


class FencedQuerySet(FencedQuerySetMixin, models.QuerySet[M]):
    """``Model.objects = FencedQuerySet.as_manager()`` for ``.fenced_update()``."""
