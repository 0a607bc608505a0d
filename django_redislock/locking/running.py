"""``run_locked`` (``run_locked_async``): one body run under one lock, as a locked view runs.

The path ``redis_locked`` takes for every call, and the idempotency guard for
the claim of a key, so that both have the same lease, transactions and
outcomes:

* the lock is taken (or re-entered, when this thread or task holds it, or
  adopted, when an earlier call of this thread left it waiting for its
  transaction);
* a sync body runs inside the atomic blocks ``txn`` opens (a view's
  ``ATOMIC_REQUESTS`` but its ``non_atomic_requests`` opt-outs, and a
  savepoint in a transaction someone else opened);
* the lease is checked before the commit: a lost lease rolls the body back;
* the lock is released after the commit, or when the transaction someone
  else opened ends (``deferred.py``);
* a lock that stays busy, a Redis that cannot be reached and a lease lost
  before the commit end as ``outcomes.py`` says, for a view or any call.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..core import AsyncLock, Lock, LockLost, RedisUnavailable
from ..signals import declare
from .context import Key, pop, push, reenter, task_owner
from .deferred import Deferred, adopt
from .factories import lock_for
from .options import LockOptions, check_fair_names, check_mode_names
from .outcomes import (
    busy,
    failed_open,
    lost_before_commit,
    lost_response,
    release,
    release_async,
    unavailable,
)
from .transactions import Transactions

__all__ = ["LockPlan", "run_locked", "run_locked_async"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class LockPlan:
    """The lock a body runs under, decided once: only its names change per call."""

    opts: LockOptions
    # The factory's arguments, built once.
    lock_kwargs: dict[str, Any]

    @classmethod
    def of(cls, opts: LockOptions, label: str, metric_name: str) -> LockPlan:
        """``label`` shows the holder to operators when ``opts`` names none."""
        # Its series exist from now on, at 0: the first loss moves a counter that exists.
        declare(metric_name, "lock")
        return cls(opts, {**opts.lock_kwargs(label), "metric_name": metric_name})

    def new_lock(self, names: str | tuple[str, ...], asynchronous: bool) -> Any:
        check_fair_names(self.lock_kwargs, names)
        return lock_for(names, self.opts.mode, asynchronous=asynchronous, **self.lock_kwargs)


def _shown(names: str | tuple[str, ...]) -> str:
    """One name as it is; several as ``"a, b"``, for messages and responses."""
    return names if isinstance(names, str) else ", ".join(names)


def run_locked(
    plan: LockPlan,
    names: str | tuple[str, ...],
    body: Callable[[], T],
    *,
    txn: Transactions,
    request: Any = None,
    on_busy: Any = None,
) -> Any:
    """``body()`` under the lock on ``names``, inside ``txn``'s atomic blocks.

    ``request``: the view's request, or None for any other call (a busy lock
    or an unreachable Redis then raises). ``on_busy``: None, ``"raise"``,
    ``"skip"``, or a callable of no arguments whose result is returned.
    """
    opts = plan.opts
    name = _shown(names)
    key: Key = (opts.held_key_alias, names)
    owner = threading.get_ident()
    check_mode_names(opts.mode, names)
    entered = reenter(opts, names, owner)
    if entered is not None:
        # Nested call on a lock this thread holds: run under it; the outer
        # call releases.
        token = push(entered, key, owner)
        try:
            with txn.atomic():
                return body()
        finally:
            pop(token)
    # A lock an earlier call of this thread left waiting for its transaction:
    # it still holds the lease, and still covers that earlier call's writes.
    deferred = adopt(key)
    if deferred is not None:
        lock = deferred.lock
    else:
        lock = plan.new_lock(names, asynchronous=False)
        txn.connect_early()
        try:
            acquired = lock.acquire()
        except RedisUnavailable as exc:
            if not opts.failing_open:
                return unavailable(on_busy, request, name, exc, Lock, lock)
            failed_open(name, exc, Lock, lock)
            with txn.atomic():
                return body()
        if not acquired:
            return busy(on_busy, request, name, lock.retry_after)
    token = push(lock, key, owner)
    try:
        if deferred is not None:
            deferred.check()
        with txn.atomic():
            result = body()
            # ``lost`` as well as ``held``: a loss must stop the commit even
            # when it is heard of before the lease would have run out.
            if txn.opens and (lock.lost or not lock.held):
                raise lost_before_commit(lock)
    except BaseException as exc:
        pop(token)
        if deferred is None:
            # The call failed and its atomic blocks rolled back: nothing of it
            # can commit later, so the lock can go now. Its exception wins.
            release(lock, quiet=True)
        # Else this call rolled back, but the earlier one's writes still wait
        # for the outer transaction: so does the lock.
        if isinstance(exc, LockLost) and request is not None and on_busy != "raise":
            return lost_response(request, name)
        raise
    pop(token)
    if deferred is not None:
        deferred.cover(txn.outer)
    elif txn.outer:
        Deferred.start(lock, key, txn.outer)
    else:
        release(lock, quiet=request is not None)
    return result


async def run_locked_async(
    plan: LockPlan,
    names: str | tuple[str, ...],
    body: Callable[[], Awaitable[T]],
    *,
    request: Any = None,
    on_busy: Any = None,
) -> Any:
    """``run_locked`` on an event loop: no atomic block is open there (Django
    refuses ``ATOMIC_REQUESTS`` for async views), so nothing waits for a commit."""
    opts = plan.opts
    name = _shown(names)
    key: Key = (opts.held_key_alias, names)
    owner = task_owner()
    check_mode_names(opts.mode, names)
    entered = reenter(opts, names, owner)
    if entered is not None:
        token = push(entered, key, owner)
        try:
            return await body()
        finally:
            pop(token)
    lock = plan.new_lock(names, asynchronous=True)
    try:
        acquired = await lock.acquire()
    except RedisUnavailable as exc:
        if not opts.failing_open:
            return unavailable(on_busy, request, name, exc, AsyncLock, lock)
        failed_open(name, exc, AsyncLock, lock)
        return await body()
    if not acquired:
        outcome = busy(on_busy, request, name, lock.retry_after)
        return await outcome if inspect.isawaitable(outcome) else outcome
    token = push(lock, key, owner)
    try:
        result = await body()
    except BaseException as exc:
        pop(token)
        await release_async(lock, quiet=True)
        if isinstance(exc, LockLost) and request is not None and on_busy != "raise":
            return lost_response(request, name)
        raise
    pop(token)
    await release_async(lock, quiet=request is not None)
    return result
