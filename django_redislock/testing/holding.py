"""Holding a lock or permits from outside the code under test: ``hold_lock``, ``hold_permits``.

A hold writes ``HOLD_LABEL`` into its owner metadata and registers its
tokens, so that ``leftovers`` knows them for the test's own.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from ..core import Lock, Semaphore

__all__ = [
    "HOLD_LABEL",
    "describe_owner",
    "hold_lock",
    "hold_permits",
    "hold_tokens",
    "in_open_transaction",
    "settle_transactions",
]

H = TypeVar("H")

# What a hold writes into the owner metadata, so a leftover report, the admin
# and ``manage.py redislocks list`` say where a lock came from.
HOLD_LABEL = "django_redislock.testing"

# The tokens of the holds currently open, and the wait caps they set: a hold
# is the test's own doing, not something the code under test left behind.
_registry_lock = threading.Lock()
_hold_tokens: set[str] = set()
_caps: dict[tuple[str, str], list[float]] = {}


def hold_tokens() -> frozenset[str]:
    """The tokens of the locks and permits the open holds hold."""
    with _registry_lock:
        return frozenset(_hold_tokens)


def describe_owner(label: str, host: str, pid: int | None, thread: str) -> str:
    where = f"{host or '?'} pid {pid if pid is not None else '?'} thread {thread or '?'}"
    return f"{label} on {where}" if label else where


def _cap(key: tuple[str, str], wait: float | None) -> None:
    if wait is None:
        return
    from ..locking.factories import cap_wait

    with _registry_lock:
        caps = _caps.setdefault(key, [])
        caps.append(wait)
        cap_wait(*key, min(caps))


def _uncap(key: tuple[str, str], wait: float | None) -> None:
    if wait is None:
        return
    from ..locking.factories import cap_wait

    with _registry_lock:
        caps = _caps.get(key, [])
        if wait in caps:
            caps.remove(wait)
        if caps:
            cap_wait(*key, min(caps))
        else:
            _caps.pop(key, None)
            cap_wait(*key, None)


def _check_hold_args(what: str, timeout: object, wait: object) -> tuple[float, float | None]:
    from ..core import check_seconds

    try:
        seconds = check_seconds("timeout", timeout, allow_zero=False)
        cap = None if wait is None else check_seconds("wait", wait, allow_zero=True)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{what}(): {exc}") from None
    return seconds, cap


def settle_transactions() -> None:
    """Release the locks this thread took in a transaction that has ended.

    In a TestCase, a locked call inside the test's ``transaction.atomic()``
    keeps its lock until that block ends; a block that sends nothing to the
    database as it ends (``savepoint=False``) is noticed here, before a hold
    or a leftover check looks.
    """
    from ..locking.deferred import settle

    settle()


def in_open_transaction(tokens: Iterable[str]) -> bool:
    """Whether one of ``tokens`` is a lock this thread holds until a
    transaction still open ends."""
    from ..locking.deferred import waiting_tokens

    return not waiting_tokens().isdisjoint(tokens)


_WAITING_FOR_BLOCK = (
    "taken by this thread in a transaction that is still open: a locked call inside "
    "transaction.atomic() keeps its lock until that transaction ends, and in a test it is "
    "released when the outermost transaction.atomic() block of the test ends. Hold the lock "
    "before that block begins or after it ends."
)


def _busy_message(what: str, name: str, kind: str, alias: str | None) -> str:
    detail = ""
    try:
        from ..connection import get_client
        from ..core import find_locks
        from ..locking.factories import keyspace

        rows, _missing = find_locks(get_client(alias), keyspace(), [name], kinds=(kind,), waiters=0)
        if rows:
            row = rows[0]
            detail = f" (held by {describe_owner(row.label, row.host, row.pid, row.thread)})"
            if in_open_transaction(h.token for h in row.holders):
                return f"{what}({name!r}): it is already held{detail}, {_WAITING_FOR_BLOCK}"
    except Exception:  # the message is a courtesy; the failure is the point
        pass
    return (
        f"{what}({name!r}): it is already held{detail}, so the test cannot hold it. "
        "A lock left by an earlier test or by a running server? Give each test its own "
        "keys with isolated_prefix() (pytest: the redislock_prefix fixture)."
    )


class _Hold(contextlib.AbstractContextManager[H]):
    """``async with`` for a hold: the same blocking enter and exit, on the loop.

    One round trip each, harmless in a test; and a handle is released only by
    the thread that acquired it, which a worker thread might not be.
    """

    async def __aenter__(self) -> H:
        return self.__enter__()

    async def __aexit__(self, *exc_info: Any) -> None:
        self.__exit__(*exc_info)

    def _hold(
        self, what: str, name: object, timeout: object, wait: object, alias: str | None
    ) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"{what}(): name must be a non-empty str, not {name!r}")
        self.name = name
        self.timeout, self.wait = _check_hold_args(what, timeout, wait)
        self.alias = alias


class hold_lock(_Hold["Lock"]):  # noqa: N801 - used like a function: ``with hold_lock("x")``
    """Hold the lock ``name`` as another process would, for the ``with`` block.

    The code under test finds the lock busy: a view decorated with
    ``redis_locked`` answers ``BUSY_STATUS`` (409) with ``Retry-After``,
    ``redis_lock`` raises ``LockNotAcquired``, a decorated function raises
    (or skips, or calls its ``on_busy``). This holds for code that runs in
    the test's own thread, as under Django's test client: the lock is taken
    through a separate handle that is never made current, so the thread
    does not re-enter it (which a ``with redis_lock(name)`` block in the
    test would do).

    ``wait`` (seconds, default 0) caps how long any call for ``name`` waits
    while the block runs, whatever ``wait`` the code asked for, so a test of
    the busy path is fast; None leaves waits alone (the call then waits its
    full wait, and is answered busy only after it). ``timeout`` is the
    hold's lease: a test killed midway leaves nothing for longer.

    Enter with ``with`` or ``async with``; either gives the core ``Lock``
    (taken with one blocking round trip, harmless in a test). Raises
    ``AssertionError`` when the lock is already held by someone else, and
    ``RedisUnavailable`` when Redis cannot be reached. Uses the prefix and
    cache alias in force when entered.
    """

    def __init__(
        self,
        name: str,
        *,
        timeout: float = 60.0,
        wait: float | None = 0.0,
        alias: str | None = None,
    ) -> None:
        self._hold("hold_lock", name, timeout, wait, alias)
        self.lock: Lock | None = None

    def __enter__(self) -> Lock:
        from ..locking.factories import get_lock

        if self.lock is not None:
            raise RuntimeError(f"hold_lock({self.name!r}) is already entered")
        settle_transactions()
        lock = get_lock(self.name, timeout=self.timeout, wait=0, alias=self.alias, label=HOLD_LABEL)
        if not lock.acquire():
            raise AssertionError(_busy_message("hold_lock", self.name, "lock", self.alias))
        assert lock.token is not None
        with _registry_lock:
            _hold_tokens.add(lock.token)
        _cap(("lock", self.name), self.wait)
        self.lock = lock
        return lock

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        from ..core import after_block

        lock, self.lock = self.lock, None
        assert lock is not None
        _uncap(("lock", self.name), self.wait)
        with _registry_lock:
            _hold_tokens.discard(lock.token or "")
        if lock.token is None:
            return  # the test released it itself
        # Lost while held (cleared by the code under test, expired): the
        # block's own exception, if any, says more.
        with after_block(exc_type):
            lock.release()


class hold_permits(_Hold["list[Semaphore]"]):  # noqa: N801 - used like a function
    """Hold ``count`` permits (default: all ``limit``) of the semaphore ``name``.

    With every permit taken, the code under test finds the semaphore full: a
    view under ``concurrency_limited`` or a ``THROTTLE`` rule answers 503
    (global rule) or 429 (per-client rule). A rule's semaphore is called
    ``throttle:<rule name>`` (``throttle:<name>:<per>:<key>`` for a
    per-client rule). ``wait``, ``timeout`` and the ways to enter are as for
    ``hold_lock``; the block gets the list of held ``Semaphore`` handles.
    """

    def __init__(
        self,
        name: str,
        limit: int,
        *,
        count: int | None = None,
        timeout: float = 60.0,
        wait: float | None = 0.0,
        alias: str | None = None,
    ) -> None:
        from ..core import check_limit

        self._hold("hold_permits", name, timeout, wait, alias)
        try:
            self.limit = check_limit(limit)
            self.count = self.limit if count is None else check_limit(count)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"hold_permits(): {exc}") from None
        if self.count > self.limit:
            raise ValueError(
                f"hold_permits(): count ({self.count}) is more than the limit ({self.limit})"
            )
        self.permits: list[Semaphore] = []
        self._entered = False

    def __enter__(self) -> list[Semaphore]:
        from ..locking.factories import get_semaphore

        if self._entered:
            raise RuntimeError(f"hold_permits({self.name!r}) is already entered")
        held: list[Semaphore] = []
        try:
            for _ in range(self.count):
                sem = get_semaphore(
                    self.name,
                    self.limit,
                    timeout=self.timeout,
                    wait=0,
                    alias=self.alias,
                    label=HOLD_LABEL,
                )
                if not sem.acquire():
                    raise AssertionError(
                        _busy_message("hold_permits", self.name, "semaphore", self.alias)
                    )
                held.append(sem)
        except BaseException:
            for sem in held:
                sem.release()
            raise
        with _registry_lock:
            _hold_tokens.update(sem.token for sem in held if sem.token)
        _cap(("semaphore", self.name), self.wait)
        self.permits = held
        self._entered = True
        return list(held)

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        from ..core import LockError

        held, self.permits, self._entered = self.permits, [], False
        _uncap(("semaphore", self.name), self.wait)
        with _registry_lock:
            _hold_tokens.difference_update(sem.token for sem in held if sem.token)
        failed: LockError | None = None
        for sem in held:
            if sem.token is None:
                continue
            try:
                sem.release()
            except LockError as error:
                failed = failed or error
        if failed is not None and exc_type is None:
            raise failed
