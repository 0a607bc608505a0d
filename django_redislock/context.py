"""Which lock is current: a ``ContextVar`` stack of the locks held by running calls.

Threads and asyncio tasks each see their own stack, and nested calls see the
innermost entry. An entry also says who may re-enter its lock.
"""

from __future__ import annotations

import asyncio
import dataclasses
from contextvars import ContextVar, Token

from .conf import conf
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


def current_fence() -> int | None:
    """The fencing token of the innermost lock held by the running call or block.

    Pass it to ``fenced_update`` (or store it beside your writes). Returns
    ``None`` when ``REDISLOCK['ENABLED']`` is False, because then no lock is
    taken; ``fenced_update(qs, None)`` does a plain update in that case.
    Raises ``RuntimeError`` when called outside any lock while locks are
    enabled: that code is not protected, and its writes could not be fenced.
    """
    lock = current_lock()
    if lock is not None:
        return lock.fence
    if not conf.ENABLED:
        return None
    raise RuntimeError(
        "current_fence() was called outside any lock: call it inside a function decorated "
        "with @redis_locked('name:{arg}') or inside a 'with redis_lock(\"name\"):' block "
        "(it returns None only when REDISLOCK['ENABLED'] is False)."
    )


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
