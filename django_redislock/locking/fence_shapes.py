"""Which way a fenced write reaches the row that holds the fence, for every shape of queryset.

Django compiles ``queryset.update()`` in one of three ways
(``SQLUpdateCompiler.pre_sql_setup``):

* One table and no ancestor's field to write: ``UPDATE t SET ... WHERE <the filters>``. The
  fence's condition is in the WHERE of the statement that writes the row, and every database
  evaluates it against the row's latest committed version once it holds the row's lock:
  PostgreSQL re-checks it after waiting for a concurrent writer, InnoDB's UPDATE reads the
  latest version, SQLite lets one writer in at a time. Such a write goes as it is
  (``Route.ONE_ROW``, ``Route.ONE_TABLE``).
* A join (in a filter, an annotation, a manager's default filter):
  ``UPDATE t ... WHERE id IN (SELECT U0.id FROM t U0 JOIN ... WHERE <the filters>)``, or on
  MySQL ids pre-selected by a plain read. The condition is read in the sub-select's snapshot:
  after waiting for a newer holder's write, PostgreSQL re-checks only ``id IN (...)``, and the
  stale holder writes over it.
* Multi-table inheritance writing an ancestor's field (the fence itself, when it lives in a
  parent's table): ids pre-selected by a plain read, then one UPDATE per table by
  ``id IN (ids)``, with no fence condition in any statement that writes.

The last two are ``Route.LOCKED``: in a transaction the keys of the queryset's rows are read,
the rows that hold their fences are locked with ``SELECT ... FOR UPDATE`` (which waits for a
writer still in its transaction and reads the latest committed version), and the write goes
through only if none of them holds a newer token. The decision is read from the query Django
built, as Django itself decides, so nothing is sent.

A few shapes have no rows for a fence to guard, or are ones Django's ``update()`` cannot
write; they are refused with a ``TypeError`` that names the form that works, before anything
reaches the database.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.db.models import sql
from django.db.models.expressions import Col
from django.db.models.lookups import Exact
from django.db.models.sql.where import AND

__all__ = ["FenceHolder", "Route", "fence_holder", "names_one_row", "route"]

# The form that always works, named by every refusal: the keys of the rows, read first.
_BY_KEYS = "Model.objects.filter(pk__in=list(queryset.values_list('pk', flat=True)))"


class Route(enum.Enum):
    ONE_ROW = "one row"  # one UPDATE; a check for a newer token only when it wrote nothing
    ONE_TABLE = "one table"  # the UPDATE, then the check, in one transaction
    LOCKED = "locked"  # keys, a locking read of the fences, then Django's update()


@dataclass(frozen=True)
class FenceHolder:
    """Where the fence of a queryset's rows is stored."""

    model: type[models.Model]  # the concrete model whose table has the fence column
    key: str  # the name, on the queryset's model, of that table's primary key


def route(queryset: Any, field: str, updates: dict[str, Any], caller: str) -> Route:
    """The way ``caller`` writes ``updates`` and the fence ``field`` through ``queryset``.

    ``TypeError`` for a shape that is refused, before anything is sent.
    """
    _refuse_what_is_not_a_table_of_rows(queryset, caller)
    fence_holder(queryset, field, caller)
    query = queryset.query
    several_tables = False
    if queryset.model._meta.concrete_model._meta.parents:
        # As update() builds it: a parent's field becomes a related update of its table.
        # (Only multi-table inheritance has any; the hot path skips building the query.)
        writing: Any = query.chain(sql.UpdateQuery)
        writing.add_update_values({field: 0, **updates})
        several_tables = bool(writing.related_updates)
    # Django's own test (pre_sql_setup): a join, even one only an annotation or values()
    # uses, moves the WHERE into a sub-select.
    one_table = not several_tables and query.count_active_tables() <= 1
    where = query.where
    if where.contains_over_clause:
        raise TypeError(
            f"{caller}(): the queryset filters on a window function, which an UPDATE "
            f"cannot evaluate; pass {_BY_KEYS}"
        )
    if one_table and where.contains_aggregate:
        raise TypeError(
            f"{caller}(): the queryset filters on an aggregate of its own table "
            "(annotate(n=Count(...)).filter(n__...)), which Django's update() would put "
            f"in the UPDATE's WHERE; pass {_BY_KEYS}"
        )
    if not one_table:
        return Route.LOCKED
    return Route.ONE_ROW if names_one_row(queryset) else Route.ONE_TABLE


def fence_holder(queryset: Any, field: str, caller: str) -> FenceHolder:
    """The table that holds ``field`` for ``queryset``'s model: its own or an ancestor's."""
    meta = queryset.model._meta.concrete_model._meta
    try:
        fence = meta.get_field(field)
    except FieldDoesNotExist:
        fence = None
    if (
        fence is None
        or not getattr(fence, "concrete", False)
        or fence.is_relation
        or fence.primary_key
    ):
        raise TypeError(
            f"{caller}(): field={field!r} must name a column of {meta.object_name} or of a "
            "parent model it inherits from (an integer field that stores the fence), not "
            "a relation, a lookup or a field of another model"
        )
    holder = fence.model._meta.concrete_model
    if holder is meta.concrete_model or all(
        step.join_field.primary_key for step in meta.get_path_to_parent(holder)
    ):
        # Its own table, or a parent on the primary key's chain: the same key values.
        return FenceHolder(holder, "pk")
    # A second parent (multiple inheritance), reached through a link that is not the key.
    return FenceHolder(holder, holder._meta.pk.name)


def names_one_row(queryset: Any) -> bool:
    """Whether ``queryset``'s filter pins one row: ``unique_field=value`` ANDed in.

    Read from the query Django built, so nothing is sent. Anything else (OR,
    negation, ``__in``, a unique field reached through a join or compared
    with an expression) answers False, which only costs the check after the
    UPDATE.
    """
    query = queryset.query
    where = query.where
    if where.connector != AND or where.negated or query.is_sliced or query.combinator:
        return False
    base = query.base_table
    for child in where.children:
        if isinstance(child, Exact) and isinstance(child.lhs, Col):
            column = child.lhs
            # A value, not an expression: ``pk=F("other")`` compares each row
            # with itself and can match many.
            value = child.rhs is not None and not hasattr(child.rhs, "resolve_expression")
            if column.alias == base and column.target.unique and value:
                return True
    return False


def _refuse_what_is_not_a_table_of_rows(queryset: Any, caller: str) -> None:
    """TypeError for what names no rows a fence can guard, or that update() cannot write."""
    if not isinstance(queryset, models.QuerySet):
        form = "Model.objects.all()" if isinstance(queryset, models.Manager) else "a QuerySet"
        raise TypeError(f"{caller}() takes a QuerySet, not {queryset!r}: pass {form}")
    query = queryset.query
    if query.is_sliced:
        raise TypeError(
            f"{caller}(): a sliced queryset (queryset[:n]) cannot be updated; pass {_BY_KEYS}"
        )
    if query.combinator:
        raise TypeError(
            f"{caller}(): a queryset combined with {query.combinator}() cannot be updated; "
            f"fence each queryset, or pass {_BY_KEYS}"
        )
    if isinstance(query.group_by, tuple) and not any(
        isinstance(column, Col) and column.target.primary_key for column in query.group_by
    ):
        # values("shelf").annotate(Count(...)): each result stands for a group of rows.
        raise TypeError(
            f"{caller}(): the queryset groups its rows (values() before an aggregate), so its "
            f"results are groups, not rows; pass {_BY_KEYS}"
        )
    if query.extra_tables:
        raise TypeError(
            f"{caller}(): extra(tables=...) names tables that an UPDATE cannot read; "
            f"pass {_BY_KEYS}"
        )
