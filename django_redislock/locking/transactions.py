"""The lock must outlive the database transaction of the work it protects.

A sync view is marked so that Django's ``ATOMIC_REQUESTS`` does not wrap it
from outside; the decorator opens those atomic blocks itself, inside the
lock (lock, atomic, view, commit or rollback, release). A call made inside a
transaction someone else opened runs in a savepoint, and its lock waits for
that transaction to end (``deferred.py``).

With ``REDISLOCK['CONNECT_EARLY']``, the database connections the call will
work in are opened before it waits for the lock: with Django's default
``CONN_MAX_AGE = 0`` a request connects at its first query, which for a
locked view would be inside the lock, so every purchase of a hot product
would also pay for a connect while the next buyers wait. Which databases: the
ones whose transaction the decorator opens, and the ones this decorated
callable connected to during an earlier call in this process (a view that
never touches a database never gets a connection it would not have opened).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Container, Iterable
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from ..conf import conf

log_connect = logging.getLogger("django_redislock.connect")


class _EveryAlias(frozenset[str]):
    """``_non_atomic_requests`` containing every alias.

    Django wraps a view in ``atomic`` for ``ATOMIC_REQUESTS`` from outside any
    decorator, so the lock would be released before the commit. Marked with
    this, Django leaves the view alone and the decorator opens the atomic
    block itself, inside the lock.
    """

    def __contains__(self, alias: object) -> bool:
        return True


EVERY_ALIAS = _EveryAlias()


def in_user_transaction(alias: str) -> bool:
    conn = connections[alias]
    # As with atomic(durable=True): the transaction a TestCase wraps each test
    # in does not count, or every locked call in a test would wait for a
    # commit that never comes.
    return conn.in_atomic_block and len(conn.atomic_blocks) > _testcase_depth(conn)


def _testcase_depth(conn: BaseDatabaseWrapper) -> int:
    """How many of ``conn``'s atomic blocks, from the outermost, a TestCase opened.

    Django flags the blocks ``TestCase`` (and pytest-django's ``django_db``)
    wraps a class and a test in with ``_from_testcase``; ``atomic(durable=True)``
    reads the same flag to let a durable block open right inside them. The
    count goes up to the innermost flagged block: 0 outside a TestCase.
    """
    depth = 0
    for index, block in enumerate(conn.atomic_blocks, 1):
        if getattr(block, "_from_testcase", False):
            depth = index
    return depth


class OutermostInTest:
    """In a TestCase, the block that production would run as the transaction.

    A TestCase's own blocks never commit, so the first block the test's code
    opens on top of them stands for the transaction: a lock waiting for that
    transaction is released when this block ends, committed or rolled back.
    It is known by its depth and its savepoint id (a savepoint's name is new
    each time), so the same ``Atomic`` entered again at the same depth (a
    decorated function called twice) is a new block. A block opened with
    ``savepoint=False`` has no savepoint id: only its depth and identity tell.
    """

    __slots__ = ("block", "depth", "sid", "sid_index")

    def __init__(self, conn: BaseDatabaseWrapper, depth: int) -> None:
        self.depth = depth
        self.block = conn.atomic_blocks[depth]
        # The outermost block has a savepoint entry only if it was entered
        # with autocommit already off; every block inside it has one.
        self.sid_index = depth - (len(conn.atomic_blocks) - len(conn.savepoint_ids))
        self.sid = (
            conn.savepoint_ids[self.sid_index]
            if 0 <= self.sid_index < len(conn.savepoint_ids)
            else None
        )

    def open(self, conn: BaseDatabaseWrapper) -> bool:
        blocks = conn.atomic_blocks
        if len(blocks) <= self.depth or blocks[self.depth] is not self.block:
            return False
        if self.sid is None:
            return True
        ids = conn.savepoint_ids
        return 0 <= self.sid_index < len(ids) and ids[self.sid_index] == self.sid


def outermost_in_test(conn: BaseDatabaseWrapper) -> OutermostInTest | None:
    """The block standing for ``conn``'s transaction in a TestCase; None outside one.

    Outside a TestCase (in production, in a ``TransactionTestCase``) the
    transaction itself ends the wait, at its commit or rollback.
    """
    depth = _testcase_depth(conn)
    if depth == 0 or len(conn.atomic_blocks) <= depth:
        return None
    return OutermostInTest(conn, depth)


# The databases each decorated callable connected to while it ran, by thread:
# a stack, as decorated calls nest.
_connecting = threading.local()


def _on_connection_created(sender: Any, connection: Any, **kwargs: Any) -> None:
    stack: list[set[str]] | None = getattr(_connecting, "stack", None)
    if stack:
        stack[-1].add(connection.alias)


connection_created.connect(_on_connection_created, dispatch_uid="django_redislock.connect")


@dataclasses.dataclass
class Transactions:
    opens: list[str]  # aliases to open an atomic block for, inside the lock
    outer: list[str]  # aliases already inside a transaction someone else opened
    # Aliases this callable connected to in earlier calls (kept on its wrapper).
    learned: set[str] = dataclasses.field(default_factory=set)

    @classmethod
    def for_call(cls, wrapper: Any, func: Any, is_view: bool) -> Transactions:
        skip: set[str] = set(getattr(func, "_non_atomic_requests", ()))
        own = getattr(wrapper, "_non_atomic_requests", EVERY_ALIAS)
        if not isinstance(own, _EveryAlias):
            # non_atomic_requests applied outside this decorator replaced the mark.
            skip.update(own)
        learned = wrapper.__dict__.setdefault("_redislock_databases", set())
        return cls.around(skip, is_view, learned)

    @classmethod
    def around(cls, skip: Container[str], is_view: bool, learned: set[str]) -> Transactions:
        """The blocks to open around one call: a view's ``ATOMIC_REQUESTS`` but
        the aliases in ``skip``, and a savepoint in any transaction already open.
        ``learned`` is kept by the caller from call to call (see ``connect_early``)."""
        opens: list[str] = []
        outer: list[str] = []
        for alias in connections:
            if in_user_transaction(alias):
                outer.append(alias)
                opens.append(alias)  # a savepoint: a failed call leaves nothing behind
            elif (
                is_view
                and connections.settings[alias].get("ATOMIC_REQUESTS")
                and (alias not in skip)
            ):
                opens.append(alias)
        return cls(opens, outer, learned)

    def connect_early(self) -> None:
        """Open, before the lock is waited for, the connections the call will use.

        ``CONNECT_EARLY = True``: the databases whose transaction the
        decorator opens, and those the callable connected to in an earlier
        call. A list names the databases; ``False``, none.
        """
        early = conf.CONNECT_EARLY
        if early is True:
            connect_early([*self.opens, *sorted(self.learned)])
        elif early:
            connect_early(early)

    def atomic(self) -> _Atomic:
        """The call's atomic blocks (``opens``), with the databases it connects
        to meanwhile noted (``learned``; see ``connect_early``)."""
        return _Atomic(self)


class _Atomic:
    """``Transactions.atomic``: a class, not a generator, and no ExitStack when
    no block opens (a plain function, a view without ``ATOMIC_REQUESTS``): it
    is entered on every decorated call."""

    __slots__ = ("atomics", "connected", "stack", "txn")

    def __init__(self, txn: Transactions) -> None:
        self.txn = txn

    def __enter__(self) -> None:
        self.stack: list[set[str]] = _connecting.__dict__.setdefault("stack", [])
        self.connected: set[str] = set()
        self.stack.append(self.connected)
        self.atomics: contextlib.ExitStack | None = None
        if not self.txn.opens:
            return
        try:
            with contextlib.ExitStack() as atomics:  # a block that fails to open
                for alias in self.txn.opens:  # closes those opened before it
                    atomics.enter_context(transaction.atomic(using=alias))
                self.atomics = atomics.pop_all()
        except BaseException:
            self._done()
            raise

    def __exit__(self, *exc_info: Any) -> bool:
        try:
            return self.atomics is not None and bool(self.atomics.__exit__(*exc_info))
        finally:
            self._done()

    def _done(self) -> None:
        self.stack.pop()
        connected = self.connected
        if connected:
            self.txn.learned.update(connected)
            if self.stack:  # an enclosing call's lock covered this work too
                self.stack[-1].update(connected)


def connect_early(aliases: Iterable[str]) -> None:
    """``ensure_connection()`` on each alias; a no-op for one already open.

    Waiting with an idle connection open costs a connection per waiting
    thread, as persistent connections (``CONN_MAX_AGE``) always do; it holds
    no transaction, row lock or snapshot. Any failure (a database that cannot
    be reached, database access refused in a test) is left for the call's own
    first query to meet: connecting early must never change what a call does.
    """
    for alias in dict.fromkeys(aliases):
        if alias not in connections.settings or (
            connections.settings[alias].get("ENGINE") == "django.db.backends.dummy"
        ):
            continue
        conn = connections[alias]
        try:
            # With CONN_HEALTH_CHECKS, the check of a persistent connection
            # (and its replacement) happens here too, not at the first query.
            conn.close_if_health_check_failed()
            conn.ensure_connection()
        except Exception as exc:
            log_connect.debug("could not connect to %r before the lock: %s", alias, exc)


def opted_out(view: Any) -> frozenset[str]:
    """The aliases ``view`` opted out of ``ATOMIC_REQUESTS`` for, through every wrapper.

    A locked or idempotent wrapper says "every alias" only because it opens
    the blocks itself; the view under it may still want them.
    """
    found: set[str] = set()
    layer, depth = view, 0
    while layer is not None and depth < 32:
        own = getattr(layer, "__dict__", {}).get("_non_atomic_requests")
        if own is not None and not isinstance(own, type(EVERY_ALIAS)):
            found.update(own)
        layer, depth = getattr(layer, "__wrapped__", None), depth + 1
    return frozenset(found)
