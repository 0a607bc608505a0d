"""``redis_locked`` and ``redis_lock``: one Redis lock around a view, task or function.

The decorator turns a call into a lock name (a ``str.format`` template filled
from the call's arguments, or a callable), takes the lock, runs the callable
and gives the lock back. Around that it owns three decisions:

* **Transactions** (``transactions.py``): the lock must outlive the
  database transaction of the work it protects.
* **What a caller sees** (``outcomes.py``) when the lock stays busy or Redis
  cannot be reached: a response for a view, an exception (or a skip, or a
  callback) otherwise.
* **Which lock is current** (``context.py``): a ``ContextVar`` stack, so
  threads and asyncio tasks each see their own, and nested calls see the
  innermost.

The run under the lock, which the idempotency guard shares, is in
``running.py``; lock names are computed in ``naming.py``, arguments checked in
``options.py``; the ``with`` block form, ``redis_lock``, is in ``blocks.py``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction

from ..conf import conf
from ..http import is_drf_view, rendered_by_drf_view, request_in
from ..stepping import sync_from_loop
from .blocks import redis_lock
from .context import current_fence, current_lock
from .naming import Namer, describe, namer_for
from .options import (
    LockOptions,
    check_fair,
    check_fair_mode,
    check_key,
    check_target,
    django_task,
    lock_options,
)
from .running import LockPlan, run_locked, run_locked_async
from .transactions import EVERY_ALIAS, Transactions

__all__ = ["current_fence", "current_lock", "redis_lock", "redis_locked"]

F = TypeVar("F", bound=Callable[..., Any])


def _metric_name(namer: Namer, label: str) -> str:
    """What metrics call this call's lock: its template, never the filled-in
    name (one series per product id would be unbounded); a callable key
    goes by the decorated callable's dotted name."""
    return namer.key if isinstance(namer.key, str) else label


def _bound_on_busy(on_busy: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A callable ``on_busy`` receives the call's arguments; the others are as given."""
    return functools.partial(on_busy, *args, **kwargs) if callable(on_busy) else on_busy


@dataclasses.dataclass(frozen=True)
class _Locked:
    """A decorated callable and the lock it runs under, as decided at decoration."""

    func: Callable[..., Any]
    namer: Namer
    plan: LockPlan


# -- the sync and async paths ---------------------------------------------------------
def _call(wrapper: Any, locked: _Locked, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    func = locked.func
    request = request_in(args)
    txn = Transactions.for_call(wrapper, func, request is not None)
    body = functools.partial(func, *args, **kwargs)
    if not conf.ENABLED:
        with txn.atomic():
            return body()
    return run_locked(
        locked.plan,
        locked.namer(args, kwargs),
        body,
        txn=txn,
        request=request,
        on_busy=_bound_on_busy(locked.plan.opts.on_busy, args, kwargs),
    )


async def _call_async(locked: _Locked, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    func = locked.func
    if not conf.ENABLED:
        return await func(*args, **kwargs)
    # A template that touches the database ({request.user.pk} loads the user)
    # is filled in a thread, where sync ORM access is allowed.
    names = await sync_from_loop(locked.namer)(args, kwargs)
    return await run_locked_async(
        locked.plan,
        names,
        functools.partial(func, *args, **kwargs),
        request=request_in(args),
        on_busy=_bound_on_busy(locked.plan.opts.on_busy, args, kwargs),
    )


def _wrap(key: str | Callable[..., Any], func: Callable[..., Any], opts: LockOptions) -> Any:
    namer = namer_for(key, func)
    label = f"{getattr(func, '__module__', '')}.{describe(func)}"
    locked = _Locked(func, namer, LockPlan.of(opts, label, _metric_name(namer, label)))
    if iscoroutinefunction(func):

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            return await _call_async(locked, args, kwargs)

        # Django refuses ATOMIC_REQUESTS for async views; the inner view's own
        # _non_atomic_requests (copied by wraps) keeps that behaviour intact.
        return async_wrapper

    if is_drf_view(func):
        # Around a DRF view's as_view(): its refusals, made before its dispatch,
        # through its exception handling.
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            request = request_in(args)
            if request is None:
                return _call(wrapper, locked, args, kwargs)
            call = functools.partial(_call, wrapper, locked, args, kwargs)
            return rendered_by_drf_view(func, request, args[1:], kwargs, call)

    else:

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return _call(wrapper, locked, args, kwargs)

    wrapper._non_atomic_requests = EVERY_ALIAS  # type: ignore[attr-defined]
    return wrapper


def redis_locked(
    key: str | Callable[..., str],
    *,
    timeout: float | None = None,
    wait: float | None = None,
    renew: bool | None = None,
    renew_max: float | None = None,
    on_busy: str | Callable[..., Any] | None = None,
    fail_open: bool | None = None,
    alias: str | None = None,
    label: str | None = None,
    mode: str | None = None,
    fair: bool = True,
) -> Callable[[F], F]:
    """Run the decorated callable under the Redis lock named by ``key``.

    ``key`` is a ``str.format`` template filled from the call's arguments
    (``"purchase:{product_id}"``, ``"cart:{request.user.pk}"``), or a callable
    receiving the same arguments and returning the name. ``timeout`` (lease
    seconds), ``wait`` (seconds to wait for a busy lock; 0 tries once),
    ``renew`` and ``renew_max`` default to ``REDISLOCK``.

    When the lock stays busy, a view answers ``BUSY_STATUS`` with
    ``Retry-After``; anything else raises ``LockNotAcquired``. ``on_busy``
    changes that: ``"raise"`` (raise for views too), ``"skip"`` (return None
    without running) or a callable receiving the call's arguments, whose
    result is returned. Redis unreachable: 503 for a view, ``RedisUnavailable``
    otherwise, unless ``fail_open`` (default ``REDISLOCK['FAIL_OPEN']``).

    Transactions: a sync view's ``ATOMIC_REQUESTS`` block is opened inside the
    lock and committed only if the lock is still held. A call made inside a
    transaction someone else opened keeps its lock (renewed, with ``renew``)
    until that transaction commits or rolls back. If the lock is lost before,
    ``lock_lost`` is sent and the transaction is marked for rollback: its next
    SQL statement raises ``LockLost``; with no further statement, the
    outermost ``atomic`` block rolls back instead of committing, silently.

    ``mode="read"`` or ``mode="write"`` takes a ``ReadWriteLock`` on the name
    instead of a ``Lock``: many readers at once, or one writer (see
    ``docs/rwlocks.rst``). Any other mode fails here, at decoration time.
    ``fair=False`` takes the lock in the barging order (``docs/locks.rst``):
    more throughput for a hot lock, each waiter served within a bound.
    """
    check_key(key)
    opts = lock_options(timeout, wait, renew, renew_max, on_busy, fail_open, alias, label, mode)
    if not check_fair(fair):
        check_fair_mode(mode)
        opts = dataclasses.replace(opts, fair=False)

    def decorate(func: F) -> F:
        task = django_task(func)
        if task is not None:
            # @redis_locked above @task: lock the function the task runs.
            return dataclasses.replace(task, func=decorate(task.func))
        check_target(func)
        return _wrap(key, func, opts)

    return decorate
