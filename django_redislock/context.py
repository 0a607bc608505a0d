"""Which lock is current: a ``ContextVar`` stack of the locks held by running calls.

Threads and asyncio tasks each see their own stack, and nested calls see the
innermost entry. An entry also says who may re-enter its lock.
"""

from __future__ import annotations

import asyncio
import dataclasses
from contextvars import ContextVar, Token

from .core.base import LockBase


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
