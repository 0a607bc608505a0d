"""A lock held until the transactions its call wrote in have ended.

A decorated call made inside a transaction someone else opened returns before
its writes commit. Its lock must stay held, and stay valid, until then:

* **Renewal goes on.** A renewing lock stays in the watchdog until the end
  (up to ``renew_max``), so an outer transaction may outlive the lease.
* **Commit** runs an ``on_commit`` hook: the lock is released. The hook is
  registered ``robust`` and moved to the front of the connection's list, so
  it is the first thing the commit runs. Django stops at the first hook that
  raises (one not registered ``robust``), and that exception's traceback
  keeps the hooks it did not run referenced for as long as the exception
  lives: behind such a hook, the release would wait for the exception to be
  collected, with renewal keeping the lease alive all that time.
* **Rollback** has no hook in Django, but Django drops the hooks registered in
  a transaction (or savepoint) that rolls back, or on a connection that is
  closed, the moment it rolls back or closes. The hook is a small object
  referenced by nothing but Django's list; CPython finalises it as that list
  lets go, and its finaliser releases the lock. Commit and rollback run the
  same finaliser, once.
* **In a TestCase** the transaction never commits: the test's own outermost
  block stands for it (``transactions.OutermostInTest``). When that block
  ends, the next statement on its connection (its own ``RELEASE`` or
  ``ROLLBACK TO SAVEPOINT``) releases the lock, and the hook leaves the list,
  so ``captureOnCommitCallbacks`` sees only the test's own. A block that sends
  nothing when it ends (``savepoint=False``) is noticed by the next statement,
  the next call for the lock, or the test kit (``settle``).
* **A loss before the end** (the lease gone at renewal, renewal unable to
  reach Redis in time, the lease run out with renewal off or past
  ``renew_max``) dooms the transaction: it is marked for rollback, and the
  next SQL statement on its connection raises ``LockLost``. A guard in the
  watchdog thread notices the loss when no statement runs; a statement
  notices it by itself.

The deferred locks of a thread are kept by name, so that a later call for the
same lock in the same transaction takes the lock over instead of waiting for
itself. An entry leaves the map when its transactions end, however they end.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from ..core import Lock, LockLost, fields_of, renewal_watchdog
from .context import Key
from .outcomes import release
from .transactions import OutermostInTest, outermost_in_test

log_lost = logging.getLogger("django_redislock.lost")
log_release = logging.getLogger("django_redislock.release")

# Per thread: database connections, and so transactions, are per thread.
_pending_local = threading.local()


def _pending() -> dict[Key, Deferred]:
    found: dict[Key, Deferred] | None = getattr(_pending_local, "locks", None)
    if found is None:
        found = _pending_local.locks = {}
    return found


def _lost_in_transaction(lock: Lock) -> LockLost:
    return LockLost(
        f"lock {lock.name!r} was lost while the transaction its call wrote in was still "
        "open; that transaction is marked for rollback (raise the timeout, pass "
        "renew=True, or commit sooner)"
    )


class _Hook:
    """Registered with ``on_commit``; see the module docstring.

    It must hold no reference that leads back to itself, or it would outlive
    Django's list and the release would wait for the garbage collector.
    """

    __slots__ = ("done", "__weakref__")

    def __init__(self, end: Callable[[], None]) -> None:
        self.done = weakref.finalize(self, end)
        # A hook still pending at interpreter exit belongs to a transaction
        # that never ended; its lease runs out by itself.
        self.done.atexit = False

    def __call__(self) -> None:  # the commit
        self.done()


def run_first(conn: BaseDatabaseWrapper, hook: Callable[[], None]) -> None:
    """Move ``hook``, just registered, to the front of ``conn``'s commit hooks.

    No hook before it can then keep it from running (see the module
    docstring). Its entry is moved as ``on_commit`` made it, savepoints
    included: a savepoint rolled back around the call still drops it.
    """
    hooks = conn.run_on_commit
    for index in range(len(hooks) - 1, -1, -1):
        if hooks[index][1] is hook:
            hooks.insert(0, hooks.pop(index))
            return


class _Guard:
    """Watches a deferred lock from the watchdog thread (``renewal.Renewable``)."""

    def __init__(self, deferred: Deferred) -> None:
        self.deferred = deferred

    def _renew_once(self) -> float | None:
        deferred = self.deferred
        lock = deferred.lock
        if deferred.ended:
            return None
        if lock.lost or not lock.held:
            deferred.lose()
            return None
        # Renewal moves the end of the lease on; look again a little after it
        # would otherwise run out, or sooner to hear of a renewal's loss.
        return max(0.01, min(lock.remaining + 0.01, lock.ttl / 3))


class _Watch:
    """One outer transaction a deferred lock waits for."""

    __slots__ = ("conn", "hook", "in_test")

    def __init__(
        self, conn: BaseDatabaseWrapper, hook: _Hook, in_test: OutermostInTest | None
    ) -> None:
        self.conn = conn
        self.hook = weakref.ref(hook)
        # In a TestCase: the block that stands for the transaction.
        self.in_test = in_test

    def open(self) -> bool:
        """Whether that transaction has neither committed nor rolled back yet.

        Its hook still waiting in the connection's list says so exactly: a
        new transaction on the same connection (opened while a traceback
        still holds the hooks of a finished one) does not count.
        """
        hook = self.hook()
        if hook is None or not self.conn.in_atomic_block:
            return False
        if self.in_test is not None and not self.in_test.open(self.conn):
            return False
        return any(entry[1] is hook for entry in self.conn.run_on_commit)

    def forget(self) -> None:
        """Take the hook out of the list of a TestCase's transaction, which never
        commits; its finaliser runs as it goes, and finds the work done."""
        hook = self.hook()
        if hook is not None:
            self.conn.run_on_commit = [e for e in self.conn.run_on_commit if e[1] is not hook]


class Deferred:
    """One lock waiting for the end of the outer transactions of its calls."""

    def __init__(self, lock: Lock, key: Key) -> None:
        self.lock = lock
        self.key = key
        self.ended = False
        self.lost = False
        self._pending = _pending()
        self._thread = threading.get_ident()
        # Serialises the watchdog thread's ``lose`` with the owner's ``_end``.
        self._mutex = threading.Lock()
        self._open: dict[str, _Watch] = {}
        self._marked: set[str] = set()  # aliases whose rollback flag ``lose`` set

    @classmethod
    def start(cls, lock: Lock, key: Key, aliases: Iterable[str]) -> Deferred:
        deferred = cls(lock, key)
        deferred._pending[key] = deferred
        deferred.cover(aliases)
        renewal_watchdog.add(_Guard(deferred), 0.0)
        return deferred

    def cover(self, aliases: Iterable[str]) -> None:
        """Wait for the transaction open on each alias as well."""
        for alias in aliases:
            if alias in self._open:
                continue
            conn = connections[alias]
            hook = _Hook(self._ender(alias))
            in_test = outermost_in_test(conn)
            self._open[alias] = _Watch(conn, hook, in_test)
            # First in the list, so outermost; and not last, where the
            # ``execute_wrapper()`` block the call may run in pops its own.
            conn.execute_wrappers.insert(0, self._check)
            # robust: a failure here must not keep other hooks from running.
            conn.on_commit(hook, robust=True)
            if in_test is None:
                # In a TestCase no commit runs the list; left in place, the
                # hook keeps captureOnCommitCallbacks' count of it right.
                run_first(conn, hook)

    def _ender(self, alias: str) -> Callable[[], None]:
        # Refers to self, never to the hook: see _Hook.
        def end() -> None:
            # Never raise: a finaliser's exception goes nowhere useful, and
            # Django's report of a failed robust hook needs a __qualname__.
            try:
                self._end(alias)
            except Exception:
                log_release.exception(
                    "could not release %r at its transaction's end",
                    self.key[1],
                    extra=fields_of(self.lock),
                )

        return end

    def check(self) -> None:
        """Raise ``LockLost`` (and mark the transactions) if the lock is lost."""
        if self.lost or self.lock.lost or not self.lock.held:
            self.lose()
            raise _lost_in_transaction(self.lock)

    def alive(self) -> bool:
        """Whether a transaction it waits for is still open."""
        return any(watch.open() for watch in list(self._open.values()))

    # -- loss -----------------------------------------------------------------------
    def lose(self) -> None:
        """Mark every transaction still open for rollback. Any thread may call it."""
        with self._mutex:
            if self.ended or self.lost:
                return
            self.lost = True
            for alias, watch in self._open.items():
                if watch.open():
                    # Read by the owner's thread at its next statement or at
                    # the end of its outermost atomic block: a plain flag.
                    watch.conn.needs_rollback = True
                    self._marked.add(alias)
        log_lost.warning(
            "lock %r was lost before the transaction on %s committed; that transaction "
            "is marked for rollback",
            self.lock.name,
            ", ".join(sorted(self._marked)) or "(none open)",
            extra=fields_of(self.lock),
        )

    def _check(
        self,
        execute: Callable[..., Any],
        sql: Any,
        params: Any,
        many: bool,
        context: dict[str, Any],
    ) -> Any:
        """An execute wrapper: no statement runs in a doomed transaction.

        In a TestCase it also ends the wait once the test's block has ended:
        the statement that ends it (``RELEASE`` or ``ROLLBACK TO SAVEPOINT``)
        runs after Django has taken the block off the connection's stack.
        """
        conn = context["connection"]
        doomed = not self.ended and (self.lost or self.lock.lost or not self.lock.held)
        # A statement after the end (another on_commit hook) or in a later
        # transaction is not ours to judge.
        if not (doomed and any(w.conn is conn and w.open() for w in list(self._open.values()))):
            try:
                return execute(sql, params, many, context)
            finally:
                self.settle_in_test()
        self.lose()
        # Again: an inner atomic block leaving clears the flag first, to roll
        # back only its savepoint; this keeps the whole transaction doomed.
        conn.needs_rollback = True
        raise _lost_in_transaction(self.lock)

    # -- the end ------------------------------------------------------------------
    def settle_in_test(self) -> None:
        """End the wait on each TestCase block that has ended (see the module
        docstring). Production's transactions end through their hooks alone."""
        for alias, watch in list(self._open.items()):
            if watch.in_test is not None and not watch.open():
                self._ender(alias)()

    def _end(self, alias: str) -> None:
        """The transaction on ``alias`` committed, rolled back, or lost its connection."""
        with self._mutex:
            watch = self._open.pop(alias, None)
            if watch is None:
                return
            self._unwatch(watch.conn)
            if alias in self._marked and not watch.conn.in_atomic_block:
                # ``lose`` raced the commit: its flag must not outlive the
                # transaction, or the connection's next query would refuse to run.
                watch.conn.needs_rollback = False
            ended = not self._open
            if ended:
                self.ended = True
        if watch.in_test is not None:
            # Outside the mutex: the hook's finaliser runs as it leaves, and
            # comes back to ``_end``.
            watch.forget()
        if not ended:
            return
        if self._pending.get(self.key) is self:
            del self._pending[self.key]
        self.finish()

    def _unwatch(self, conn: BaseDatabaseWrapper) -> None:
        with contextlib.suppress(ValueError):
            conn.execute_wrappers.remove(self._check)

    def finish(self) -> None:
        """Let the lock go now."""
        with self._mutex:
            self.ended = True
            still_open = [watch.conn for watch in self._open.values()]
        for conn in still_open:
            self._unwatch(conn)
        if self.lock.token is None:
            return
        if threading.get_ident() != self._thread:
            # Finalised elsewhere (a garbage collection in another thread):
            # only the owner may release. Stop renewing; the lease runs out.
            renewal_watchdog.discard(self.lock)
            log_release.warning(
                "could not release %r from another thread; its lease will expire",
                self.lock.name,
                extra=fields_of(self.lock),
            )
            return
        release(self.lock, quiet=True)


def adopt(key: Key) -> Deferred | None:
    """This thread's deferred lock ``key``, if a transaction it waits for is open."""
    deferred = _pending().get(key)
    if deferred is None:
        return None
    if not deferred.alive():
        # Its transactions are over, but their hooks were not let go yet
        # (something still holds a list Django dropped): release now.
        del _pending()[key]
        deferred.finish()
        return None
    return deferred


def settle() -> None:
    """Release this thread's deferred locks whose transactions have all ended.

    The test kit calls it before it looks at what is held: in a TestCase, a
    block that sent nothing to the database when it ended (``savepoint=False``)
    leaves its lock to the next statement otherwise.
    """
    for key in list(_pending()):
        adopt(key)


def waiting_tokens() -> frozenset[str]:
    """The tokens of this thread's locks that wait for a transaction still open."""
    return frozenset(
        deferred.lock.token
        for deferred in list(_pending().values())
        if deferred.lock.token is not None and deferred.alive()
    )
