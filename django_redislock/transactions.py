"""The lock must outlive the database transaction of the work it protects.

A sync view is marked so that Django's ``ATOMIC_REQUESTS`` does not wrap it
from outside; the decorator opens those atomic blocks itself, inside the
lock (lock, atomic, view, commit or rollback, release). A call made inside a
transaction someone else opened runs in a savepoint, and its lock waits for
that transaction to end (``deferred.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from django.db import connections, transaction

from .core.base import LockBase
from .core.exceptions import LockLost


class _EveryAlias(frozenset[str]):
    """``_non_atomic_requests`` containing every alias.

    Django wraps a view in ``atomic`` for ``ATOMIC_REQUESTS`` from outside any
    decorator, so the lock would be released before the commit. Marked with
    this, Django leaves the view alone and the decorator opens the atomic
    block itself, inside the lock.
    """

    def __contains__(self, alias: object) -> bool:
        return True


_EVERY_ALIAS = _EveryAlias()


def _in_user_transaction(alias: str) -> bool:
    conn = connections[alias]
    if not conn.in_atomic_block:
        return False
    # As with atomic(durable=True): the transaction a TestCase wraps each test
    # in does not count, or every locked call in a test would wait for a
    # commit that never comes.
    return any(not getattr(block, "_from_testcase", False) for block in conn.atomic_blocks)


@dataclasses.dataclass
class _Transactions:
    opens: list[str]  # aliases to open an atomic block for, inside the lock
    outer: list[str]  # aliases already inside a transaction someone else opened

    @classmethod
    def for_call(cls, wrapper: Any, func: Any, is_view: bool) -> _Transactions:
        skip: set[str] = set(getattr(func, "_non_atomic_requests", ()))
        own = getattr(wrapper, "_non_atomic_requests", _EVERY_ALIAS)
        if not isinstance(own, _EveryAlias):
            # non_atomic_requests applied outside this decorator replaced the mark.
            skip.update(own)
        opens: list[str] = []
        outer: list[str] = []
        for alias in connections:
            if _in_user_transaction(alias):
                outer.append(alias)
                opens.append(alias)  # a savepoint: a failed call leaves nothing behind
            elif (
                is_view
                and connections.settings[alias].get("ATOMIC_REQUESTS")
                and (alias not in skip)
            ):
                opens.append(alias)
        return cls(opens, outer)

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for alias in self.opens:
                stack.enter_context(transaction.atomic(using=alias))
            yield


def _lost_before_commit(lock: LockBase) -> LockLost:
    return LockLost(
        f"lock {lock.name!r} ran out before its transaction could commit; the work was "
        "rolled back (raise the timeout or pass renew=True)"
    )
