"""Tools for testing a project that uses django-redislock.

Four things a test of locked code needs, each as a context manager for any
test runner, as a ``unittest`` mixin (``RedisLockTestMixin``) and as pytest
fixtures (``django_redislock.testing.plugin``, loaded by pytest on its own
once the package is installed):

* **A lock that is busy for the code under test** (``hold_lock``,
  ``hold_permits``). A lock taken with ``redis_lock`` in the test is
  *re-entered* by code that runs in the same thread, as a nested call would
  be, so a view called through the test client runs instead of answering
  409. ``hold_lock`` takes the lock through a handle of its own that the
  re-entrance bookkeeping never sees, and caps the wait of every call for
  that name (``wait=0`` by default), so the busy answer comes at once.
* **Keys of its own for each test** (``isolated_prefix``): a unique
  ``REDISLOCK['PREFIX']`` per test, so tests never see each other's locks or
  the developer's, including under ``pytest-xdist``.
* **A check that nothing was left behind** (``assert_no_locks_left``): no
  held lock, no semaphore permit and no waiter's queue entry under the
  current prefix.
* **Locks switched off** (``locks_disabled``), as with
  ``REDISLOCK['ENABLED'] = False``.

Importing this module reads no settings and imports nothing from Django:
the work is done when one of its tools is used.
"""

from __future__ import annotations

import functools
import inspect
import os
import secrets
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

if TYPE_CHECKING:
    from ..core.lock import Lock
    from ..core.semaphore import Semaphore

__all__ = [
    "RedisLockTestMixin",
    "assert_no_locks_left",
    "hold_lock",
    "hold_permits",
    "isolated_prefix",
    "leftovers",
    "locks_disabled",
    "redislock_settings",
    "unique_prefix",
]

F = TypeVar("F", bound=Callable[..., Any])
H = TypeVar("H")

# What a hold writes into the owner metadata, so a leftover report, the admin
# and ``manage.py redislocks list`` say where a lock came from.
HOLD_LABEL = "django_redislock.testing"

# The tokens of the holds currently open, and the wait caps they set: a hold
# is the test's own doing, not something the code under test left behind.
_registry_lock = threading.Lock()
_hold_tokens: set[str] = set()
_caps: dict[tuple[str, str], list[float]] = {}


# -- settings --------------------------------------------------------------------------------
class _Block:
    """A context manager that also decorates functions and coroutine functions
    (``contextlib.ContextDecorator`` would leave a coroutine's block before the
    coroutine runs)."""

    def __enter__(self) -> Any:
        raise NotImplementedError

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        raise NotImplementedError

    def __call__(self, func: F) -> F:
        if inspect.isclass(func):
            raise TypeError(
                f"{type(self).__name__}() decorates functions; for a TestCase class use "
                "RedisLockTestMixin, or override_settings(REDISLOCK={...})"
            )
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_inner(*args: Any, **kwargs: Any) -> Any:
                with self:
                    return await func(*args, **kwargs)

            return async_inner  # type: ignore[return-value]

        @functools.wraps(func)
        def inner(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return inner  # type: ignore[return-value]


class redislock_settings(_Block):  # noqa: N801 - used like override_settings
    """Change some ``REDISLOCK`` settings, keeping the others.

    ``override_settings(REDISLOCK={...})`` replaces the whole dict, and with
    it a test prefix set by ``isolated_prefix``. This merges ``changes`` into
    the dict in force when the block is entered (not when the object is
    made), so it nests inside ``isolated_prefix`` and the pytest fixtures:
    ``redislock_settings(WAIT=0, BUSY_STATUS=423)`` changes those two only.

    Usable as a context manager and as a decorator of a test function or
    coroutine function. Raises ``TypeError`` for a name that is not a
    ``REDISLOCK`` setting.
    """

    def __init__(self, **changes: Any) -> None:
        from ..conf import DEFAULTS

        unknown = sorted(set(changes) - set(DEFAULTS))
        if unknown:
            raise TypeError(
                f"redislock_settings(): unknown REDISLOCK setting(s) {', '.join(unknown)}; "
                f"valid names: {', '.join(sorted(DEFAULTS))}"
            )
        self.changes = changes
        self._active: list[Any] = []

    def __enter__(self) -> None:
        from django.conf import settings
        from django.test.utils import override_settings

        current = getattr(settings, "REDISLOCK", {})
        merged = {**(current if isinstance(current, dict) else {}), **self.changes}
        override = override_settings(REDISLOCK=merged)
        override.enable()
        self._active.append(override)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._active.pop().disable()


def locks_disabled() -> redislock_settings:
    """Run code unlocked, as with ``REDISLOCK['ENABLED'] = False``.

    Decorated views, functions and ``redis_lock`` blocks run without touching
    Redis (``current_lock()`` is None), and the throttling middleware lets
    every request through. A context manager and a decorator, as
    ``redislock_settings``.
    """
    return redislock_settings(ENABLED=False)


def unique_prefix(base: str | None = None) -> str:
    """A key prefix no other test, test run or ``pytest-xdist`` worker uses.

    ``<base>:test:<worker>:<random>``, where ``base`` defaults to the
    ``REDISLOCK['PREFIX']`` in force, ``worker`` is ``PYTEST_XDIST_WORKER``
    (``gw0``, ``gw1``, ...) or ``main``, and ``random`` is 48 random bits. A
    base too long for the 64-character limit is left out.
    """
    if base is None:
        from ..conf import conf

        base = conf.PREFIX
    worker = "".join(
        c for c in os.environ.get("PYTEST_XDIST_WORKER", "main") if c.isalnum() or c in "_-"
    )
    tail = f"test:{worker[:16] or 'main'}:{secrets.token_hex(6)}"
    prefix = f"{base}:{tail}"
    return prefix if len(prefix) <= 64 else tail


class isolated_prefix(_Block):  # noqa: N801 - used like a function
    """Give the block a key prefix of its own (``unique_prefix()`` unless given).

    Every lock, semaphore and wake-up channel the block uses lives under it,
    so the block cannot see, wait for or clear anyone else's, and
    ``assert_no_locks_left`` inside it looks at the block's keys only. The
    ``with`` block gets the prefix. Also decorates a test function or
    coroutine function (a new prefix for each call). Raises ``ValueError``
    for a prefix ``REDISLOCK['PREFIX']`` would refuse.
    """

    def __init__(self, prefix: str | None = None) -> None:
        from ..core.keys import validate_prefix

        self.prefix = None if prefix is None else validate_prefix(prefix)
        self._active: list[redislock_settings] = []

    def __enter__(self) -> str:
        chosen = unique_prefix() if self.prefix is None else self.prefix
        block = redislock_settings(PREFIX=chosen)
        block.__enter__()
        self._active.append(block)
        return chosen

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._active.pop().__exit__(exc_type, exc, tb)


# -- holding a lock from elsewhere -------------------------------------------------------------
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
    from ..core.base import check_seconds

    try:
        seconds = check_seconds("timeout", timeout, allow_zero=False)
        cap = None if wait is None else check_seconds("wait", wait, allow_zero=True)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{what}(): {exc}") from None
    return seconds, cap


def _busy_message(what: str, name: str, kind: str, alias: str | None) -> str:
    detail = ""
    try:
        from ..connection import get_client
        from ..core.inspect import find
        from ..locking.factories import keyspace

        rows, _missing = find(get_client(alias), keyspace(), [name], kinds=(kind,))
        if rows:
            row = rows[0]
            detail = f" (held by {_owner(row.label, row.host, row.pid, row.thread)})"
    except Exception:  # the message is a courtesy; the failure is the point
        pass
    return (
        f"{what}({name!r}): it is already held{detail}, so the test cannot hold it. "
        "A lock left by an earlier test or by a running server? Give each test its own "
        "keys with isolated_prefix() (pytest: the redislock_prefix fixture)."
    )


class _Hold(Generic[H]):
    """``async with`` for a hold: the same blocking enter and exit, on the loop.

    One round trip each, harmless in a test; and a handle is released only by
    the thread that acquired it, which a worker thread might not be.
    """

    def __enter__(self) -> H:
        raise NotImplementedError

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> H:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)


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
        if not isinstance(name, str) or not name:
            raise TypeError(f"hold_lock(): name must be a non-empty str, not {name!r}")
        self.name = name
        self.timeout, self.wait = _check_hold_args("hold_lock", timeout, wait)
        self.alias = alias
        self.lock: Lock | None = None

    def __enter__(self) -> Lock:
        from ..locking.factories import get_lock

        if self.lock is not None:
            raise RuntimeError(f"hold_lock({self.name!r}) is already entered")
        lock = get_lock(self.name, timeout=self.timeout, wait=0, alias=self.alias, label=HOLD_LABEL)
        if not lock.acquire():
            raise AssertionError(_busy_message("hold_lock", self.name, "lock", self.alias))
        assert lock.token is not None
        with _registry_lock:
            _hold_tokens.add(lock.token)
        _cap(("lock", self.name), self.wait)
        self.lock = lock
        return lock

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        from ..core.exceptions import LockError

        lock, self.lock = self.lock, None
        assert lock is not None
        _uncap(("lock", self.name), self.wait)
        with _registry_lock:
            _hold_tokens.discard(lock.token or "")
        if lock.token is None:
            return  # the test released it itself
        try:
            lock.release()
        except LockError:
            # Lost while held (cleared by the code under test, expired): the
            # block's own exception, if any, says more.
            if exc_type is None:
                raise


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
        from ..core.semaphore import check_limit

        if not isinstance(name, str) or not name:
            raise TypeError(f"hold_permits(): name must be a non-empty str, not {name!r}")
        try:
            self.limit = check_limit(limit)
            self.count = self.limit if count is None else check_limit(count)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"hold_permits(): {exc}") from None
        if self.count > self.limit:
            raise ValueError(
                f"hold_permits(): count ({self.count}) is more than the limit ({self.limit})"
            )
        self.name = name
        self.timeout, self.wait = _check_hold_args("hold_permits", timeout, wait)
        self.alias = alias
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

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        from ..core.exceptions import LockError

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


# -- leftovers -----------------------------------------------------------------------------------
def _owner(label: str, host: str, pid: int | None, thread: str) -> str:
    where = f"{host or '?'} pid {pid if pid is not None else '?'} thread {thread or '?'}"
    return f"{label} on {where}" if label else where


def _lease(left: float | None) -> str:
    return "no expiry" if left is None else f"{left:.1f}s left"


def _queued(client: Any, prefix: str) -> list[str]:
    """Waiters' queue entries (lock and semaphore queues) under ``prefix``."""
    from ..core.inspect import scan_keys

    found: list[str] = []
    for code, kind in ((b"Q", "lock"), (b"SQ", "semaphore")):
        head = prefix.encode() + b":" + code + b":{"
        seen: set[bytes] = set()
        for key in scan_keys(client, head + b"*"):
            if key in seen:
                continue
            seen.add(key)
            waiting = client.llen(key)
            if not waiting:
                continue
            _tag, _sep, suffix = key[len(head) :].partition(b"}:")
            shown = (
                suffix[1:].decode("utf-8", "replace")
                if suffix[:1] == b"="
                else key.decode("latin-1")
            )
            found.append(f"{kind} {shown!r}: {waiting} queued waiter(s)")
    return found


def leftovers(*, alias: str | None = None) -> list[str]:
    """What is held or queued under the current ``REDISLOCK['PREFIX']``.

    One line per held lock, per semaphore with permits and per queue of
    waiters, naming the holder (host, pid, thread and label: the decorated
    view or function). Locks and permits held by an open ``hold_lock`` or
    ``hold_permits`` are the test's own and are not listed. ``alias`` is a
    ``CACHES`` alias (default ``REDISLOCK['CACHE']``).
    """
    from ..connection import get_client
    from ..core.inspect import list_locks
    from ..locking.factories import keyspace

    client = get_client(alias)
    space = keyspace()
    with _registry_lock:
        ours = set(_hold_tokens)
    lines: list[str] = []
    for row in list_locks(client, space):
        holders = [h for h in row.holders if h.token not in ours]
        if not holders and not row.waiters:
            continue
        if row.kind == "lock":
            if holders:
                lines.append(
                    f"lock {row.name!r}: held by {_owner(row.label, row.host, row.pid, row.thread)}"
                    f", {_lease(row.lease_left)}"
                )
        else:
            for holder in holders:
                lines.append(
                    f"semaphore {row.name!r} (limit {row.limit}): permit held by "
                    f"{_owner(holder.label, holder.host, holder.pid, holder.thread)}, "
                    f"{_lease(holder.lease_left)}"
                )
    lines.extend(_queued(client, space.prefix))
    return lines


def assert_no_locks_left(*, alias: str | None = None) -> None:
    """Fail if a lock, a semaphore permit or a waiter is left under the prefix.

    Raises ``AssertionError`` listing each leftover (see ``leftovers``). Run
    it at the end of a test, inside ``isolated_prefix``: under the project's
    own prefix it also sees locks of other tests, other processes and the
    developer's running server.
    """
    found = leftovers(alias=alias)
    if found:
        from ..conf import conf

        listing = "\n  ".join(found)
        raise AssertionError(
            f"{len(found)} lock(s), permit(s) or waiter(s) left behind under prefix "
            f"{conf.PREFIX!r}:\n  {listing}"
        )


# -- unittest ------------------------------------------------------------------------------------
class RedisLockTestMixin:
    """Isolation and a leftover check for ``unittest`` and Django test cases.

    Put it before the test case class
    (``class OrderTests(RedisLockTestMixin, TestCase)``). Each test then runs
    under its own ``isolated_prefix`` (``self.redislock_prefix``) and, after
    ``tearDown`` and the test's cleanups, ``assert_no_locks_left`` runs.
    Set ``redislock_isolated`` or ``redislock_check_leftovers`` to False on
    the class to turn either off. A ``setUp`` of your own must call
    ``super().setUp()``.
    """

    redislock_isolated: ClassVar[bool] = True
    redislock_check_leftovers: ClassVar[bool] = True
    redislock_prefix: str = ""

    # Provided by unittest.TestCase.
    addCleanup: Callable[..., None]

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        if self.redislock_isolated:
            block = isolated_prefix()
            self.redislock_prefix = block.__enter__()
            self.addCleanup(block.__exit__, None, None, None)
        if self.redislock_check_leftovers:
            # Cleanups run last in, first out: this one, before the prefix ends.
            self.addCleanup(assert_no_locks_left)
