"""``redis_locked`` and ``redis_lock``: one Redis lock around a view, task or function.

The decorator turns a call into a lock name (a ``str.format`` template filled
from the call's arguments, or a callable), takes the lock, runs the callable
and gives the lock back. Around that it owns three decisions:

* **Transactions.** The lock must outlive the database transaction of the
  work it protects, or the next holder reads data that is not committed yet.
  A sync view is marked so that Django's ``ATOMIC_REQUESTS`` does not wrap it
  from outside; the decorator opens those atomic blocks itself, inside the
  lock (lock, atomic, view, commit or rollback, release). A call made inside
  a transaction someone else opened runs in a savepoint, and its lock is
  released when that transaction commits (``on_commit``).
* **What a caller sees** when the lock stays busy or Redis cannot be reached:
  a response for a view, an exception (or a skip, or a callback) otherwise.
* **Which lock is current**: a ``ContextVar`` stack, so threads and asyncio
  tasks each see their own, and nested calls see the innermost.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import logging
import re
import string
import threading
import weakref
from collections.abc import Callable, Iterator
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.core.exceptions import SynchronousOnlyOperation
from django.db import connections, transaction
from django.http import HttpRequest

from .conf import conf
from .core import renewal
from .core.base import LockBase, check_seconds
from .core.exceptions import LockError, LockLost, LockNotAcquired, RedisUnavailable
from .core.lock import Lock
from .core.lock_async import AsyncLock
from .http import error_response
from .locks import get_async_lock, get_lock
from .signals import send_unavailable

__all__ = ["current_lock", "redis_lock", "redis_locked"]

log_unavailable = logging.getLogger("django_redislock.unavailable")
log_release = logging.getLogger("django_redislock.release")
log_busy = logging.getLogger("django_redislock.busy")

F = TypeVar("F", bound=Callable[..., Any])

# Redis down says nothing about when it will be back: ask clients to pause a
# little rather than retry at once and pile onto a recovering server.
UNAVAILABLE_RETRY_AFTER = 5.0

_ON_BUSY_CHOICES = (None, "raise", "skip")


# -- which lock is current ---------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Held:
    lock: LockBase
    key: tuple[str, str]  # (cache alias, lock name)
    owner: object  # thread id (sync) or asyncio task: who may re-enter


_held: ContextVar[tuple[_Held, ...]] = ContextVar("django_redislock_held", default=())


def current_lock() -> LockBase | None:
    """The innermost lock held by the running decorated call or ``redis_lock`` block.

    Read from a ``ContextVar``: each thread and asyncio task sees its own, and
    a sync helper run through ``sync_to_async`` sees its caller's. ``None``
    outside any lock, and when ``REDISLOCK['ENABLED']`` is False.
    """
    stack = _held.get()
    return stack[-1].lock if stack else None


def _push(lock: LockBase, key: tuple[str, str], owner: object) -> Token[tuple[_Held, ...]]:
    return _held.set((*_held.get(), _Held(lock, key, owner)))


def _reentered(key: tuple[str, str], owner: object) -> LockBase | None:
    # Only the thread or task that holds a lock re-enters it: a child task
    # inherits its parent's context, but must not share its parent's lock.
    for entry in reversed(_held.get()):
        if entry.key == key and entry.owner == owner and entry.lock.held:
            return entry.lock
    return None


def _task_owner() -> object:
    return asyncio.current_task()


# Locks whose release waits for an outer transaction to commit, per thread
# (database connections, and so commits, are per thread).
_pending_local = threading.local()


def _pending() -> dict[tuple[str, str], Lock]:
    found: dict[tuple[str, str], Lock] | None = getattr(_pending_local, "locks", None)
    if found is None:
        found = _pending_local.locks = {}
    return found


def _adopt_pending(key: tuple[str, str]) -> Lock | None:
    lock = _pending().pop(key, None)
    if lock is not None and lock.held:
        return lock
    return None


# -- lock names from arguments -------------------------------------------------------
_formatter = string.Formatter()
_ROOT = re.compile(r"[^.\[]*")


def _template_fields(template: str) -> Iterator[str]:
    for _literal, field, spec, _conversion in _formatter.parse(template):
        if field is None:
            continue
        yield field
        if spec:
            # "{amount:{width}}": nested fields are arguments too.
            yield from _template_fields(spec)


def _parse_template(template: str) -> list[str]:
    """The root names a template uses, checked for syntax; raises ValueError."""
    try:
        fields = list(_template_fields(template))
    except ValueError as exc:
        raise ValueError(
            f"redis_locked(): lock key {template!r} is not a valid str.format template "
            f"({exc}); write placeholders as {{name}} and double literal braces ({{{{ }}}})"
        ) from None
    roots = []
    for field in fields:
        match = _ROOT.match(field)
        root = match.group() if match else ""
        if not root or root.isdigit():
            raise ValueError(
                f"redis_locked(): lock key {template!r} has a positional placeholder "
                f"{{{field}}}; name the parameter instead, as in 'purchase:{{product_id}}'"
            )
        roots.append(root)
    return roots


def _describe(func: Callable[..., Any]) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)


class _Namer:
    """Computes the lock name of one call of one callable."""

    def __init__(self, key: str | Callable[..., Any], func: Callable[..., Any]) -> None:
        self.key = key
        self.where = _describe(func)
        self.extra: dict[str, Any] = {}
        target = func
        if isinstance(func, functools.partial) and inspect.ismethod(func.func):
            # method_decorator hands decorators a partial of the bound method:
            # it is called without self, but self is still worth naming.
            target = func.func
            self.extra["self"] = func.func.__self__
        self.signature: inspect.Signature | None = None
        self.var_keyword: str | None = None
        if not isinstance(key, str):
            return
        roots = _parse_template(key)
        if not roots:
            return  # a constant name: nothing to bind
        try:
            self.signature = inspect.signature(target)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"redis_locked(): cannot read the signature of {self.where} ({exc}); "
                "pass a callable key instead of a template"
            ) from None
        params = self.signature.parameters
        for param in params.values():
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                self.var_keyword = param.name
        known = set(params) | set(self.extra)
        for root in roots:
            if root in known or self.var_keyword is not None:
                # With **kwargs, a name may arrive there (URL kwargs in dispatch).
                continue
            raise ValueError(
                f"redis_locked(): lock key {key!r} uses {{{root}}}, which is not a "
                f"parameter of {self.where}{self.signature}; use one of "
                f"{', '.join(sorted(known)) or '(none)'}, or pass a callable key"
            )

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        key = self.key
        if not isinstance(key, str):
            name = key(*args, **kwargs)
            if not isinstance(name, str) or not name:
                raise TypeError(
                    f"the lock key callable of {self.where} returned {name!r}; "
                    "it must return a non-empty str"
                )
            return name
        if self.signature is None:
            return key.format()
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        if self.var_keyword is not None:
            for k, v in values.get(self.var_keyword, {}).items():
                values.setdefault(k, v)
        values.update(self.extra)
        try:
            return _formatter.vformat(key, (), values)
        except KeyError as exc:
            raise TypeError(
                f"lock key {key!r} of {self.where} needs {{{exc.args[0]}}}, but this call "
                f"has no such argument (only {', '.join(sorted(values))})"
            ) from None


# Decorators applied through method_decorator are applied again on every call:
# keep the checked template per underlying function.
_namers: weakref.WeakKeyDictionary[Any, dict[Any, _Namer]] = weakref.WeakKeyDictionary()


def _namer_for(key: str | Callable[..., Any], func: Callable[..., Any]) -> _Namer:
    if not (isinstance(func, functools.partial) and inspect.ismethod(func.func)):
        return _Namer(key, func)
    per_method = _namers.setdefault(func.func.__func__, {})
    checked = per_method.get(key)
    if checked is None:
        checked = per_method[key] = _Namer(key, func)
    # A copy per call: ``extra`` holds this call's ``self``.
    namer = object.__new__(_Namer)
    namer.__dict__.update(checked.__dict__)
    namer.extra = {"self": func.func.__self__}
    return namer


# -- requests and transactions --------------------------------------------------------
def _request_in(args: tuple[Any, ...]) -> Any:
    """The request of a view call: first argument, or second after ``self``."""
    for arg in args[:2]:
        if isinstance(arg, HttpRequest):
            return arg
        # A DRF Request wraps an HttpRequest (duck-typed: DRF stays optional).
        if isinstance(getattr(arg, "_request", None), HttpRequest):
            return arg
    return None


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
            elif is_view and connections.settings[alias].get("ATOMIC_REQUESTS") and (
                alias not in skip
            ):
                opens.append(alias)
        return cls(opens, outer)

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for alias in self.opens:
                stack.enter_context(transaction.atomic(using=alias))
            yield


# -- options ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Options:
    timeout: float | None
    wait: float | None
    renew: bool | None
    renew_max: float | None
    on_busy: Any
    fail_open: bool | None
    alias: str | None
    label: str | None

    def lock_kwargs(self, label: str) -> dict[str, Any]:
        return {
            "timeout": self.timeout,
            "wait": self.wait,
            "renew": self.renew,
            "renew_max": self.renew_max,
            "label": self.label if self.label is not None else label,
            "alias": self.alias,
        }

    @property
    def cache_alias(self) -> str:
        return self.alias or conf.CACHE

    @property
    def failing_open(self) -> bool:
        return conf.FAIL_OPEN if self.fail_open is None else self.fail_open


def _optional_seconds(what: str, value: object, *, allow_zero: bool) -> float | None:
    if value is None:
        return None
    try:
        return check_seconds(what, value, allow_zero=allow_zero)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"redis_locked(): {exc}") from None


def _optional_bool(what: str, value: object) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"redis_locked(): {what} must be True, False or None, not {value!r}")
    return value


def _check_key(key: object) -> None:
    if isinstance(key, str):
        if not key:
            raise ValueError(
                "redis_locked(): the lock key is empty; give a name such as 'purchase:{product_id}'"
            )
        _parse_template(key)
    elif not callable(key):
        raise TypeError(
            "redis_locked(): key must be a str.format template such as 'purchase:{product_id}' "
            f"or a callable returning the lock name; got {key!r}"
        )


def _options(
    timeout: object,
    wait: object,
    renew: object,
    renew_max: object,
    on_busy: object,
    fail_open: object,
    alias: object,
    label: object,
) -> _Options:
    if on_busy not in _ON_BUSY_CHOICES and not callable(on_busy):
        raise ValueError(
            f"redis_locked(): on_busy must be None, 'raise', 'skip' or a callable; got {on_busy!r}"
        )
    if alias is not None and (not isinstance(alias, str) or not alias):
        raise TypeError(f"redis_locked(): alias must name a CACHES entry, not {alias!r}")
    if label is not None and not isinstance(label, str):
        raise TypeError(f"redis_locked(): label must be a str, not {label!r}")
    return _Options(
        timeout=_optional_seconds("timeout", timeout, allow_zero=False),
        wait=_optional_seconds("wait", wait, allow_zero=True),
        renew=_optional_bool("renew", renew),
        renew_max=_optional_seconds("renew_max", renew_max, allow_zero=False),
        on_busy=on_busy,
        fail_open=_optional_bool("fail_open", fail_open),
        alias=alias,
        label=label,
    )


def _django_task(obj: object) -> Any:
    """``obj`` if it is a task of ``django.tasks`` (Django 6) or the ``django_tasks`` backport."""
    if isinstance(obj, type) or not dataclasses.is_dataclass(obj):
        return None
    for cls in inspect.getmro(type(obj)):
        module = cls.__module__
        if cls.__name__ == "Task" and (
            module.startswith("django.tasks") or module.startswith("django_tasks")
        ):
            return obj
    return None


def _check_target(func: object) -> None:
    if isinstance(func, type):
        raise TypeError(
            f"redis_locked() cannot decorate the class {func.__qualname__}: decorate its "
            "dispatch() (or a handler method such as post()) instead"
        )
    if isinstance(func, (classmethod, staticmethod)):
        raise TypeError(
            f"redis_locked() must go below @{type(func).__name__}: put @{type(func).__name__} "
            "on top, so that redis_locked wraps the function itself"
        )
    if hasattr(func, "apply_async") and hasattr(func, "run"):
        raise TypeError(
            "redis_locked() must go below @app.task (Celery), so that it wraps the function "
            "the worker runs: put @redis_locked(...) under @app.task"
        )
    if not callable(func):
        raise TypeError(f"redis_locked() can only decorate a callable, not {func!r}")
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        raise TypeError(
            f"redis_locked() cannot decorate the generator {_describe(func)}: the lock would "
            "be released before the generator runs; lock inside it with redis_lock()"
        )


# -- outcomes -----------------------------------------------------------------------------
def _busy(
    opts: _Options, request: Any, name: str, retry_after: float | None,
    args: tuple[Any, ...], kwargs: dict[str, Any],
) -> Any:
    if opts.on_busy == "skip":
        log_busy.info("skipped %r: lock busy", name)
        return None
    if callable(opts.on_busy):
        return opts.on_busy(*args, **kwargs)
    if request is not None and opts.on_busy is None:
        return error_response(
            request, status=conf.BUSY_STATUS, retry_after=retry_after, reason="busy",
            name=name, handler=conf.BUSY_RESPONSE,
        )
    raise LockNotAcquired(name, retry_after=retry_after)


def _unavailable(
    opts: _Options, request: Any, name: str, exc: RedisUnavailable, sender: type
) -> Any:
    """Fail closed: a response for a view, else the exception."""
    log_unavailable.warning("Redis unavailable for lock %r, not running the call: %s", name, exc)
    send_unavailable(sender, name=name, error=exc, fail_open=False)
    if request is not None and opts.on_busy != "raise":
        return error_response(
            request, status=503, retry_after=UNAVAILABLE_RETRY_AFTER, reason="unavailable",
            name=name, handler=conf.UNAVAILABLE_RESPONSE,
        )
    raise exc


def _fail_open(name: str, exc: RedisUnavailable, sender: type) -> None:
    log_unavailable.warning("Redis unavailable for lock %r, running unlocked: %s", name, exc)
    send_unavailable(sender, name=name, error=exc, fail_open=True)


def _lost_response(request: Any, name: str) -> Any:
    return error_response(
        request, status=503, retry_after=1, reason="unavailable", name=name,
        handler=conf.UNAVAILABLE_RESPONSE,
    )


def _release(lock: Lock, *, quiet: bool) -> None:
    if lock.token is None:
        return
    try:
        lock.release()
    except LockLost:
        # lock_lost was sent and logged already; a view's response stands.
        if not quiet:
            raise
    except RedisUnavailable as exc:
        log_release.warning("could not release %r (%s); its lease will expire", lock.name, exc)


async def _arelease(lock: AsyncLock, *, quiet: bool) -> None:
    if lock.token is None:
        return
    try:
        await lock.release()
    except LockLost:
        if not quiet:
            raise
    except RedisUnavailable as exc:
        log_release.warning("could not release %r (%s); its lease will expire", lock.name, exc)


def _defer_release(lock: Lock, key: tuple[str, str], aliases: list[str]) -> None:
    """Release when every outer transaction the call ran in has committed.

    No hook exists for a rollback: then the lease simply runs out. Renewal
    stops here, so a rolled-back caller can never keep the lock alive.
    """
    renewal.watchdog.discard(lock)
    _pending()[key] = lock
    waiting = set(aliases)

    def committed(alias: str) -> None:
        waiting.discard(alias)
        if waiting:
            return
        if _pending().get(key) is lock:
            del _pending()[key]
        _release(lock, quiet=True)

    for alias in aliases:
        transaction.on_commit(functools.partial(committed, alias), using=alias)


def _lost_before_commit(lock: LockBase) -> LockLost:
    return LockLost(
        f"lock {lock.name!r} ran out before its transaction could commit; the work was "
        "rolled back (raise the timeout or pass renew=True)"
    )


# -- the sync and async paths ---------------------------------------------------------
def _call_sync(
    wrapper: Any, func: Callable[..., Any], namer: _Namer, opts: _Options, label: str,
    args: tuple[Any, ...], kwargs: dict[str, Any],
) -> Any:
    request = _request_in(args)
    txn = _Transactions.for_call(wrapper, func, request is not None)
    if not conf.ENABLED:
        with txn.atomic():
            return func(*args, **kwargs)
    name = namer(args, kwargs)
    key = (opts.cache_alias, name)
    owner = threading.get_ident()
    entered = _reentered(key, owner)
    if entered is not None:
        # Nested call on a lock this thread holds: run under it; the outer
        # call releases.
        token = _push(entered, key, owner)
        try:
            with txn.atomic():
                return func(*args, **kwargs)
        finally:
            _held.reset(token)
    # A lock an earlier call of this thread left waiting for a commit: it
    # still holds the lease, and still covers that earlier call's writes.
    lock = _adopt_pending(key)
    adopted = lock is not None
    if lock is None:
        lock = get_lock(name, **opts.lock_kwargs(label))
        try:
            acquired = lock.acquire()
        except RedisUnavailable as exc:
            if not opts.failing_open:
                return _unavailable(opts, request, name, exc, Lock)
            _fail_open(name, exc, Lock)
            with txn.atomic():
                return func(*args, **kwargs)
        if not acquired:
            return _busy(opts, request, name, lock.retry_after, args, kwargs)
    token = _push(lock, key, owner)
    try:
        with txn.atomic():
            result = func(*args, **kwargs)
            if txn.opens and not lock.held:
                raise _lost_before_commit(lock)
    except BaseException as exc:
        _held.reset(token)
        if adopted and txn.outer:
            # This call rolled back, but the earlier one's writes still wait
            # for the outer commit: so does the lock.
            _defer_release(lock, key, txn.outer)
        else:
            # The call failed and its atomic blocks rolled back: nothing of it
            # can commit later, so the lock can go now. Its exception wins.
            _release(lock, quiet=True)
        if isinstance(exc, LockLost) and request is not None and opts.on_busy != "raise":
            return _lost_response(request, name)
        raise
    _held.reset(token)
    if txn.outer:
        _defer_release(lock, key, txn.outer)
    else:
        _release(lock, quiet=request is not None)
    return result


async def _name_async(namer: _Namer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    try:
        return namer(args, kwargs)
    except SynchronousOnlyOperation:
        # The template touched the database ({request.user.pk} loads the
        # user): compute it where sync ORM access is allowed.
        return await sync_to_async(namer)(args, kwargs)


async def _call_async(
    func: Callable[..., Any], namer: _Namer, opts: _Options, label: str,
    args: tuple[Any, ...], kwargs: dict[str, Any],
) -> Any:
    request = _request_in(args)
    if not conf.ENABLED:
        return await func(*args, **kwargs)
    name = await _name_async(namer, args, kwargs)
    key = (opts.cache_alias, name)
    owner = _task_owner()
    entered = _reentered(key, owner)
    if entered is not None:
        token = _push(entered, key, owner)
        try:
            return await func(*args, **kwargs)
        finally:
            _held.reset(token)
    lock = get_async_lock(name, **opts.lock_kwargs(label))
    try:
        acquired = await lock.acquire()
    except RedisUnavailable as exc:
        if not opts.failing_open:
            return _unavailable(opts, request, name, exc, AsyncLock)
        _fail_open(name, exc, AsyncLock)
        return await func(*args, **kwargs)
    if not acquired:
        outcome = _busy(opts, request, name, lock.retry_after, args, kwargs)
        return await outcome if inspect.isawaitable(outcome) else outcome
    token = _push(lock, key, owner)
    try:
        result = await func(*args, **kwargs)
    except BaseException as exc:
        _held.reset(token)
        await _arelease(lock, quiet=True)
        if isinstance(exc, LockLost) and request is not None and opts.on_busy != "raise":
            return _lost_response(request, name)
        raise
    _held.reset(token)
    await _arelease(lock, quiet=request is not None)
    return result


def _wrap(key: str | Callable[..., Any], func: Callable[..., Any], opts: _Options) -> Any:
    namer = _namer_for(key, func)
    label = f"{getattr(func, '__module__', '')}.{_describe(func)}"
    if iscoroutinefunction(func):

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            return await _call_async(func, namer, opts, label, args, kwargs)

        # Django refuses ATOMIC_REQUESTS for async views; the inner view's own
        # _non_atomic_requests (copied by wraps) keeps that behaviour intact.
        return async_wrapper

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return _call_sync(wrapper, func, namer, opts, label, args, kwargs)

    wrapper._non_atomic_requests = _EVERY_ALIAS  # type: ignore[attr-defined]
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
    """
    _check_key(key)
    opts = _options(timeout, wait, renew, renew_max, on_busy, fail_open, alias, label)

    def decorate(func: F) -> F:
        task = _django_task(func)
        if task is not None:
            # @redis_locked above @task: lock the function the task runs.
            return dataclasses.replace(task, func=decorate(task.func))
        _check_target(func)
        return _wrap(key, func, opts)

    return decorate


# -- the context manager --------------------------------------------------------------
class redis_lock:  # noqa: N801 - used like a function: ``with redis_lock("x") as lock``
    """``redis_locked``'s lock as a ``with`` / ``async with`` block.

    Gives the held ``Lock`` (``AsyncLock`` under ``async with``), with
    ``.name`` and ``.fence``, and makes it ``current_lock()`` inside the
    block. Raises ``LockNotAcquired`` when busy past ``wait`` and
    ``RedisUnavailable`` when Redis cannot be reached. With
    ``REDISLOCK['ENABLED'] = False`` the block runs unlocked and gets None.
    One object may be entered by several threads or tasks at once.
    """

    def __init__(
        self,
        name: str,
        *,
        timeout: float | None = None,
        wait: float | None = None,
        renew: bool | None = None,
        renew_max: float | None = None,
        alias: str | None = None,
        label: str = "",
    ) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"redis_lock(): name must be a non-empty str, not {name!r}")
        opts = _options(timeout, wait, renew, renew_max, None, None, alias, label)
        self.name = name
        self._opts = opts
        # Entries per thread or task: the same object may be shared.
        # Each entry: (lock, context token, whether this block acquired it).
        self._entries: dict[object, list[tuple[LockBase | None, Any, bool]]] = {}
        self._guard = threading.Lock()

    def _enter(self, owner: object, entry: tuple[LockBase | None, Any, bool]) -> None:
        with self._guard:
            self._entries.setdefault(owner, []).append(entry)

    def _exit(self, owner: object) -> tuple[LockBase | None, Any, bool]:
        with self._guard:
            stack = self._entries[owner]
            entry = stack.pop()
            if not stack:
                del self._entries[owner]
        return entry

    def __enter__(self) -> Lock | None:
        owner = threading.get_ident()
        if not conf.ENABLED:
            self._enter(owner, (None, None, False))
            return None
        key = (self._opts.cache_alias, self.name)
        entered = _reentered(key, owner)
        if entered is not None:
            # This thread holds it already (an enclosing block or decorated
            # call): run under it; the enclosing one releases.
            assert isinstance(entered, Lock)
            self._enter(owner, (entered, _push(entered, key, owner), False))
            return entered
        lock = get_lock(self.name, **self._opts.lock_kwargs(self._opts.label or ""))
        if not lock.acquire():
            raise LockNotAcquired(self.name, retry_after=lock.retry_after)
        self._enter(owner, (lock, _push(lock, key, owner), True))
        return lock

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lock, token, acquired = self._exit(threading.get_ident())
        if lock is None:
            return
        _held.reset(token)
        if not acquired:
            return
        assert isinstance(lock, Lock)
        try:
            lock.release()
        except LockError:
            if exc_type is None:
                raise

    async def __aenter__(self) -> AsyncLock | None:
        owner = _task_owner()
        if not conf.ENABLED:
            self._enter(owner, (None, None, False))
            return None
        key = (self._opts.cache_alias, self.name)
        entered = _reentered(key, owner)
        if entered is not None:
            assert isinstance(entered, AsyncLock)
            self._enter(owner, (entered, _push(entered, key, owner), False))
            return entered
        lock = get_async_lock(self.name, **self._opts.lock_kwargs(self._opts.label or ""))
        if not await lock.acquire():
            raise LockNotAcquired(self.name, retry_after=lock.retry_after)
        self._enter(owner, (lock, _push(lock, key, owner), True))
        return lock

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lock, token, acquired = self._exit(_task_owner())
        if lock is None:
            return
        _held.reset(token)
        if not acquired:
            return
        assert isinstance(lock, AsyncLock)
        try:
            await lock.release()
        except LockError:
            if exc_type is None:
                raise
