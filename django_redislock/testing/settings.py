"""Settings for a test: ``redislock_settings``, ``locks_disabled``, ``isolated_prefix``."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import secrets
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["Block", "isolated_prefix", "locks_disabled", "redislock_settings", "unique_prefix"]

F = TypeVar("F", bound=Callable[..., Any])


class Block(contextlib.AbstractContextManager[Any]):
    """A context manager that also decorates functions and coroutine functions
    (``contextlib.ContextDecorator`` would leave a coroutine's block before the
    coroutine runs)."""

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


class redislock_settings(Block):  # noqa: N801 - used like override_settings
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

    def __exit__(self, *exc_info: object) -> None:
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


class isolated_prefix(Block):  # noqa: N801 - used like a function
    """Give the block a key prefix of its own (``unique_prefix()`` unless given).

    Every lock, semaphore and wake-up channel the block uses lives under it,
    so the block cannot see, wait for or clear anyone else's, and
    ``assert_no_locks_left`` inside it looks at the block's keys only. The
    ``with`` block gets the prefix. Also decorates a test function or
    coroutine function (a new prefix for each call). Raises ``ValueError``
    for a prefix ``REDISLOCK['PREFIX']`` would refuse.
    """

    def __init__(self, prefix: str | None = None) -> None:
        from ..core import validate_prefix

        self.prefix = None if prefix is None else validate_prefix(prefix)
        self._active: list[redislock_settings] = []

    def __enter__(self) -> str:
        chosen = unique_prefix() if self.prefix is None else self.prefix
        block = redislock_settings(PREFIX=chosen)
        block.__enter__()
        self._active.append(block)
        return chosen

    def __exit__(self, *exc_info: Any) -> None:
        self._active.pop().__exit__(*exc_info)
