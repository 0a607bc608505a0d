"""What ``redis_locked`` accepts: its arguments, checked once, and its targets."""

from __future__ import annotations

import dataclasses
import inspect
import linecache
import re
import sys
from typing import Any

from ..conf import conf
from ..core import check_seconds
from .naming import describe, parse_template

_ON_BUSY_CHOICES = (None, "raise", "skip")
_MODES = ("read", "write")


@dataclasses.dataclass(frozen=True)
class LockOptions:
    timeout: float | None
    wait: float | None
    renew: bool | None
    renew_max: float | None
    on_busy: Any
    fail_open: bool | None
    alias: str | None
    label: str | None
    # None: an exclusive Lock; "read" or "write": a ReadWriteLock in that mode.
    mode: str | None = None
    fair: bool = True

    def lock_kwargs(self, label: str) -> dict[str, Any]:
        kwargs = {
            "timeout": self.timeout,
            "wait": self.wait,
            "renew": self.renew,
            "renew_max": self.renew_max,
            "label": self.label if self.label is not None else label,
            "alias": self.alias,
        }
        if not self.fair:
            kwargs["fair"] = False  # one name only: see check_fair_names
        return kwargs

    @property
    def cache_alias(self) -> str:
        return self.alias or conf.CACHE

    @property
    def held_key_alias(self) -> str:
        """The alias part of the key a held lock is known by in ``context``."""
        return self.key_alias(self.mode)

    def key_alias(self, mode: str | None) -> str:
        """``held_key_alias`` for a lock of ``mode``: a read-write lock's names
        are not a lock's, nor a reader's a writer's."""
        if mode is None:
            return self.cache_alias
        return f"{self.cache_alias}\x00rw:{mode}"

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


# ``@redis_locked`` (or ``@django_redislock.redis_locked``) alone on its line.
_BARE_DECORATOR = re.compile(r"\s*@\s*(?:[A-Za-z_]\w*\s*\.\s*)*redis_locked\s*(?:#.*)?")
_DEF = re.compile(r"\s*(?:async\s+)?def\s")


def _bare_use(key: object, depth: int) -> bool:
    """Whether ``redis_locked(key)`` is really a bare ``@redis_locked`` on ``key``.

    A key callable returns a lock name, so a class, a coroutine function or a
    task cannot be one. Otherwise the caller's source tells: a line that is
    nothing but ``@redis_locked``, where the decorator is applied, is the
    bare form. (Without source, only the first test.)
    """
    if isinstance(key, type) or inspect.iscoroutinefunction(key) or django_task(key) is not None:
        return True
    if hasattr(key, "apply_async") and hasattr(key, "run"):  # a Celery task
        return True
    try:
        frame = sys._getframe(depth + 1)
    except ValueError:
        return False
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    if _bare_line(filename, lineno):
        return True
    # Python 3.10 runs a decorator with the line of the ``def``: then read the
    # decorators of that def, from the first (its code's first line) down.
    if not _DEF.match(linecache.getline(filename, lineno)):
        return False
    code = getattr(inspect.unwrap(key), "__code__", None)  # type: ignore[arg-type]
    if code is None or code.co_filename != filename or code.co_firstlineno >= lineno:
        return False
    return any(_bare_line(filename, n) for n in range(code.co_firstlineno, lineno))


def _bare_line(filename: str, lineno: int) -> bool:
    line = linecache.getline(filename, lineno)
    return bool(_BARE_DECORATOR.fullmatch(line.rstrip("\r\n")))


def check_key(key: object, *, depth: int = 1) -> None:
    """Check ``redis_locked``'s key; ``depth`` is how far up its caller's frame is."""
    if callable(key) and _bare_use(key, depth + 1):
        raise TypeError(
            f"@redis_locked needs the lock key template: it was used without one on "
            f'{describe(key)}. Write @redis_locked("purchase:{{product_id}}") above the '
            "definition, a str.format template filled from its arguments (or pass a callable "
            'returning the name: @redis_locked(lambda request, pk: f"doc:{pk}")).'
        )
    if isinstance(key, str):
        if not key:
            raise ValueError(
                "redis_locked(): the lock key is empty; give a name such as 'purchase:{product_id}'"
            )
        parse_template(key)
    elif not callable(key):
        raise TypeError(
            "redis_locked(): key must be a str.format template such as 'purchase:{product_id}' "
            f"or a callable returning the lock name; got {key!r}"
        )


def lock_options(
    timeout: object,
    wait: object,
    renew: object,
    renew_max: object,
    on_busy: object,
    fail_open: object,
    alias: object,
    label: object,
    mode: object = None,
) -> LockOptions:
    if mode is not None and mode not in _MODES:
        raise ValueError(
            f"redis_locked(): mode must be 'read' or 'write' (a read-write lock), or None "
            f"(an exclusive lock); got {mode!r}"
        )
    if on_busy not in _ON_BUSY_CHOICES and not callable(on_busy):
        raise ValueError(
            f"redis_locked(): on_busy must be None, 'raise', 'skip' or a callable; got {on_busy!r}"
        )
    if alias is not None and (not isinstance(alias, str) or not alias):
        raise TypeError(f"redis_locked(): alias must name a CACHES entry, not {alias!r}")
    if label is not None and not isinstance(label, str):
        raise TypeError(f"redis_locked(): label must be a str, not {label!r}")
    return LockOptions(
        timeout=_optional_seconds("timeout", timeout, allow_zero=False),
        wait=_optional_seconds("wait", wait, allow_zero=True),
        renew=_optional_bool("renew", renew),
        renew_max=_optional_seconds("renew_max", renew_max, allow_zero=False),
        on_busy=on_busy,
        fail_open=_optional_bool("fail_open", fail_open),
        alias=alias,
        label=label,
        mode=mode,
    )


def check_fair(fair: object, caller: str = "redis_locked") -> bool:
    if not isinstance(fair, bool):
        raise TypeError(
            f"{caller}(): fair must be True (first come, first served: the default) or "
            f"False (barging, see docs/locks.rst); got {fair!r}"
        )
    return fair


def check_fair_names(kwargs: dict[str, Any], names: object, caller: str = "redis_locked") -> None:
    """The barging order is for one lock: several names are taken in the default order."""
    if kwargs.get("fair") is False and not isinstance(names, str):
        raise TypeError(
            f"{caller}(): fair=False applies to one lock name, not to several ({names!r}): "
            "leave fair out for a lock on several names"
        )


def check_fair_mode(mode: object, caller: str = "redis_locked") -> None:
    """The barging order is the exclusive lock's: read-write locks queue first come first served."""
    if mode is not None:
        raise TypeError(
            f"{caller}(): fair=False applies to an exclusive lock, not to a read-write lock "
            f"(mode={mode!r}): leave fair out with a mode"
        )


def check_mode_names(mode: object, names: object, caller: str = "redis_locked") -> None:
    """A read-write lock has one name: a list, or a key callable returning one, is an error."""
    if mode is not None and not isinstance(names, str):
        shown = ", ".join(names) if isinstance(names, tuple) else repr(names)
        raise TypeError(
            f"{caller}(): mode={mode!r} takes one lock name, not several ({shown}): "
            "read-write locks are taken one name at a time"
        )


def django_task(obj: object) -> Any:
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


def check_target(func: object) -> None:
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
            f"redis_locked() cannot decorate the generator {describe(func)}: the lock would "
            "be released before the generator runs; lock inside it with redis_lock()"
        )
