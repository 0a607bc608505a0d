"""``redis_lock``: ``redis_locked``'s lock as a ``with`` / ``async with`` block."""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Iterable
from types import FrameType
from typing import Any

from ..conf import conf
from ..core import LockNotAcquired, after_block, lock_names
from ..stepping import Steps, run_steps, run_steps_async
from .context import Held, pop, push, reenter, task_owner
from .factories import lock_for
from .options import (
    check_fair,
    check_fair_mode,
    check_fair_names,
    check_mode_names,
    lock_options,
)
from .transactions import connect_early

__all__ = ["redis_lock"]


def _where(frame: FrameType | None) -> str:
    """``module.function:line`` of the code that made the block: its default label.

    What an operator looking at ``redislocks list`` or the admin page needs to
    find the code that holds the lock.
    """
    if frame is None:
        return "redis_lock()"
    code = frame.f_code
    function = getattr(code, "co_qualname", code.co_name)  # co_qualname: Python 3.11+
    module = frame.f_globals.get("__name__", "?")
    return f"{module}.{function}:{frame.f_lineno}"


class redis_lock:  # noqa: N801 - used like a function: ``with redis_lock("x") as lock``
    """``redis_locked``'s lock as a ``with`` / ``async with`` block.

    Gives the held ``Lock`` (``AsyncLock`` under ``async with``), with
    ``.name`` and ``.fence``, and makes it ``current_lock()`` inside the
    block. A list (or other iterable) of names takes them all or none, as a
    ``MultiLock`` (``AsyncMultiLock``) with a fence per name. Raises
    ``LockNotAcquired`` when busy past ``wait`` and ``RedisUnavailable`` when
    Redis cannot be reached. With
    ``REDISLOCK['ENABLED'] = False`` the block runs unlocked and gets None.
    ``metric_name`` labels the lock in metrics (default "other"): give one
    name to all blocks of one kind, never the lock name with its ids.
    One object may be entered by several threads or tasks at once.
    ``mode="read"`` or ``mode="write"`` takes a ``ReadWriteLock``
    (``AsyncReadWriteLock``) on one name instead: many readers or one writer.

    ``label`` is shown beside the lock by ``manage.py redislocks list`` and
    the admin page; by default, where the block was made:
    ``module.function:line``.
    """

    def __init__(
        self,
        name: str | Iterable[str],
        *,
        timeout: float | None = None,
        wait: float | None = None,
        renew: bool | None = None,
        renew_max: float | None = None,
        alias: str | None = None,
        label: str = "",
        metric_name: str | None = None,
        mode: str | None = None,
        fair: bool = True,
    ) -> None:
        if isinstance(name, str):
            if not name:
                raise TypeError("redis_lock(): name must be a non-empty str, not ''")
            self.name: str | tuple[str, ...] = name
        else:
            try:
                self.name = lock_names(name)
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"redis_lock(): name must be a non-empty str or a list of them ({exc})"
                ) from None
        if metric_name is not None and (not isinstance(metric_name, str) or not metric_name):
            raise TypeError(
                f"redis_lock(): metric_name must be a non-empty str or None, not {metric_name!r}"
            )
        try:
            opts = lock_options(
                timeout, wait, renew, renew_max, None, None, alias, label or None, mode
            )
        except ValueError as exc:
            raise ValueError(str(exc).replace("redis_locked()", "redis_lock()")) from None
        check_mode_names(mode, self.name, "redis_lock")
        if not check_fair(fair, "redis_lock"):
            check_fair_names({"fair": False}, self.name, "redis_lock")
            check_fair_mode(mode, "redis_lock")
            opts = dataclasses.replace(opts, fair=False)
        # Without a label, the lock says where it was taken (see _where).
        self._label = label or _where(sys._getframe(1))
        self.metric_name = metric_name
        self._opts = opts
        # Entries per thread or task: the same object may be shared.
        # Each entry: (lock, context token, whether this block acquired it).
        self._entries: dict[object, list[tuple[Held | None, Any, bool]]] = {}
        self._guard = threading.Lock()

    def _enter(self, owner: object, entry: tuple[Held | None, Any, bool]) -> None:
        with self._guard:
            self._entries.setdefault(owner, []).append(entry)

    def _exit(self, owner: object) -> tuple[Held | None, Any, bool]:
        with self._guard:
            stack = self._entries[owner]
            entry = stack.pop()
            if not stack:
                del self._entries[owner]
        return entry

    def _entering(self, owner: object, asynchronous: bool) -> Steps[Any]:
        """``__enter__`` and ``__aenter__``: what the block holds, as steps."""
        if not conf.ENABLED:
            self._enter(owner, (None, None, False))
            return None
        key = (self._opts.held_key_alias, self.name)
        entered = reenter(self._opts, self.name, owner)
        if entered is not None:
            # This thread (or task) holds it already (an enclosing block or
            # decorated call): run under it; the enclosing one releases.
            self._enter(owner, (entered, push(entered, key, owner), False))
            return entered
        lock = lock_for(
            self.name,
            self._opts.mode,
            asynchronous=asynchronous,
            metric_name=self.metric_name,
            **self._opts.lock_kwargs(self._label),
        )
        early = conf.CONNECT_EARLY
        if not asynchronous and not isinstance(early, bool):
            # Named databases: open them before waiting, as the decorator does.
            connect_early(early)
        if not (yield lock.acquire):
            raise LockNotAcquired(lock.name, retry_after=lock.retry_after)
        self._enter(owner, (lock, push(lock, key, owner), True))
        return lock

    def _leaving(self, owner: object, exc_type: type[BaseException] | None) -> Steps[None]:
        """``__exit__`` and ``__aexit__``: the lock goes back if this block took it."""
        lock, token, acquired = self._exit(owner)
        if lock is None:
            return
        pop(token)
        if not acquired:
            return
        taken: Any = lock  # a Lock or MultiLock (sync or asyncio): both release
        with after_block(exc_type):
            yield taken.release

    def __enter__(self) -> Any:
        return run_steps(self._entering(threading.get_ident(), asynchronous=False))

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        run_steps(self._leaving(threading.get_ident(), exc_type))

    async def __aenter__(self) -> Any:
        return await run_steps_async(self._entering(task_owner(), asynchronous=True))

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        await run_steps_async(self._leaving(task_owner(), exc_type))
