"""Which lock is current: a ``ContextVar`` stack of the locks held by running calls.

Threads and asyncio tasks each see their own stack, and nested calls see the
innermost entry. An entry also says who may re-enter its lock.
"""

from __future__ import annotations

import asyncio
import dataclasses
from contextvars import ContextVar, Token
from typing import Any, TypeAlias

from ..conf import conf
from ..core import LockBase, LockError, MultiBase
from .options import LockOptions

# What a running call or block holds: one name, or several all together.
Held: TypeAlias = LockBase | MultiBase[Any]
# (cache alias, lock name), or (cache alias, the sorted names) for several.
Key: TypeAlias = tuple[str, str | tuple[str, ...]]


@dataclasses.dataclass(frozen=True)
class _Held:
    lock: Held
    key: Key
    owner: object  # thread id (sync) or asyncio task: who may re-enter

    @property
    def names(self) -> tuple[str, ...]:
        return _names(self.key)


def _names(key: Key) -> tuple[str, ...]:
    return key[1] if isinstance(key[1], tuple) else (key[1],)


_held: ContextVar[tuple[_Held, ...]] = ContextVar("django_redislock_held", default=())


def current_lock() -> Held | None:
    """The innermost lock held by the running decorated call or ``redis_lock`` block.

    A ``MultiLock`` (or ``AsyncMultiLock``) when that call took several names.

    Read from a ``ContextVar``: each thread and asyncio task sees its own, and
    a sync helper run through ``sync_to_async`` sees its caller's. ``None``
    outside any lock, and when ``REDISLOCK['ENABLED']`` is False.
    """
    stack = _held.get()
    return stack[-1].lock if stack else None


def current_fence(name: str | None = None) -> int | None:
    """The fencing token of the innermost lock held by the running call or block.

    Pass it to ``fenced_update`` (or store it beside your writes). Under a
    lock on several names each name has its own fence: pass the name whose
    rows you write, ``current_fence("product:3")``; a name also picks one
    lock among nested ones. Returns ``None`` when ``REDISLOCK['ENABLED']`` is
    False, because then no lock is taken; ``fenced_update(qs, None)`` does a
    plain update in that case. Raises ``RuntimeError`` when called outside
    any lock (or outside every lock on ``name``) while locks are enabled:
    that code is not protected, and its writes could not be fenced.
    """
    stack = _held.get()
    if name is not None:
        for entry in reversed(stack):
            if name in entry.names:
                lock = entry.lock
                return lock.fence_of(name) if isinstance(lock, MultiBase) else lock.fence
    elif stack:
        lock = stack[-1].lock
        if isinstance(lock, MultiBase):
            raise TypeError(
                f"current_fence(): the current lock holds several names ({lock.name}), each "
                f"with its own fence; pass the name of the rows you write, such as "
                f"current_fence({lock.names[0]!r})"
            )
        return lock.fence
    if not conf.ENABLED:
        return None
    if name is not None:
        raise RuntimeError(
            f"current_fence({name!r}) was called outside any lock on {name!r}: take it with "
            "@redis_locked or redis_lock() around this code first"
        )
    raise RuntimeError(
        "current_fence() was called outside any lock: call it inside a function decorated "
        "with @redis_locked('name:{arg}') or inside a 'with redis_lock(\"name\"):' block "
        "(it returns None only when REDISLOCK['ENABLED'] is False)."
    )


def push(lock: Held, key: Key, owner: object) -> Token[tuple[_Held, ...]]:
    """Make ``lock`` the current lock, held under ``key`` by ``owner``; ``pop`` the
    token it returns when the call or block ends."""
    return _held.set((*_held.get(), _Held(lock, key, owner)))


def pop(token: Token[tuple[_Held, ...]]) -> None:
    """Undo the ``push`` that returned ``token``."""
    _held.reset(token)


def reentered(key: Key, owner: object) -> Held | None:
    """The lock this thread or task already holds on ``key``'s names, if any.

    Only the thread or task that holds a lock re-enters it: a child task
    inherits its parent's context, but must not share its parent's lock. A
    lock on several names covers a nested call on any of them. A nested call
    that needs a name held further out plus others cannot be served: taking
    the others inside would mean waiting while holding, which can deadlock.
    """
    wanted = _names(key)
    alias = key[0]
    held_here: set[str] = set()
    for entry in reversed(_held.get()):
        if entry.owner != owner or entry.key[0] != alias or not entry.lock.held:
            continue
        if entry.key == key:
            return entry.lock
        lock = entry.lock
        if isinstance(lock, MultiBase) and all(name in lock.locks for name in wanted):
            return lock.locks[wanted[0]] if len(wanted) == 1 else lock
        held_here.update(entry.names)
    overlap = sorted(held_here.intersection(wanted))
    if overlap:
        raise LockError(
            f"a lock on {', '.join(wanted)} was asked for inside a lock on "
            f"{', '.join(overlap)}, which this code already holds: locks are not taken "
            "while others are held and waited for; lock every name in the outer call"
        )
    return None


def task_owner() -> object:
    """Who may re-enter a lock taken in a coroutine: its asyncio task."""
    return asyncio.current_task()


def reenter(opts: LockOptions, names: str | tuple[str, ...], owner: object) -> Held | None:
    """``reentered`` for the key of ``opts``' mode: a reader inside a writer of
    the same name runs under the writer; a writer inside a reader of the same
    name cannot be served (it would wait for itself), and says so."""
    if opts.mode == "read":
        writer = reentered((opts.key_alias("write"), names), owner)
        if writer is not None:
            return writer
    elif opts.mode == "write" and reentered((opts.key_alias("read"), names), owner):
        raise LockError(
            f"a write lock on {names} was asked for inside a read lock on it, which this code "
            "already holds: a read lock is not upgraded; take the write lock in the outer call"
        )
    return reentered((opts.held_key_alias, names), owner)
