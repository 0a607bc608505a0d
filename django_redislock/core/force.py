"""Force-release held locks and semaphores, for operators.

Force-release of a lock runs the ``clear`` script with the token that was read
(``inspect.py``): if the lock changed hands in between, the new holder is left
alone. The next waiter is woken at once; the former holder finds out at its
next renewal, extend or release (``LockLost``, and ``held`` turns False).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import scripts
from .base import DEFAULT_GRACE
from .inspect import KINDS, HeldLock, find, list_locks
from .keys import KeySpace

__all__ = ["ClearResult", "clear", "release", "select"]

logger = logging.getLogger("django_redislock.inspect")


@dataclass
class ClearResult:
    """What a force-release did."""

    # Rows as they were just before they were released.
    released: list[HeldLock] = field(default_factory=list)
    # Names asked for explicitly that were not held (as any kind asked for).
    not_held: list[str] = field(default_factory=list)
    # Rows that changed hands (or were released) between reading and releasing:
    # left alone, so a new holder is never thrown out unseen.
    changed: list[HeldLock] = field(default_factory=list)


def _clear_semaphore(client: Any, keyspace: KeySpace, name: str, token: str | None) -> int:
    # Imported here: semaphores are optional for inspecting locks.
    from .semaphore import clear_semaphore

    return int(clear_semaphore(client, keyspace, name, token=token))


def _clear_rw_lock(client: Any, keyspace: KeySpace, name: str, token: str | None) -> int:
    from .rwlock import clear_rw_lock

    return int(clear_rw_lock(client, keyspace, name, token=token))


def release(
    client: Any, keyspace: KeySpace, rows: Iterable[HeldLock], *, grace: float = DEFAULT_GRACE
) -> ClearResult:
    """Force-release exactly these rows, as they were read.

    A lock is released only if its token is still the one read; a semaphore
    gives back only the permits read. The next waiter is woken at once.
    """
    result = ClearResult()
    grace_ms = int(grace * 1000)
    for row in rows:
        if row.kind == "lock":
            k = keyspace.lock(row.name)
            done = int(
                scripts.run(
                    client, scripts.CLEAR, (k.lease, k.queue, k.state), (grace_ms, row.token)
                )
            )
        elif row.kind == "rwlock":
            # Only the readers or the writer read: one that came since stays.
            done = sum(_clear_rw_lock(client, keyspace, row.name, h.token) for h in row.holders)
        else:
            done = sum(_clear_semaphore(client, keyspace, row.name, h.token) for h in row.holders)
        if done:
            logger.warning(
                "force-released %s %r (held by %s pid %s %s %r)",
                row.kind,
                row.name,
                row.host,
                row.pid,
                row.thread,
                row.label,
            )
            result.released.append(row)
        else:
            result.changed.append(row)
    return result


def select(
    client: Any,
    keyspace: KeySpace,
    *,
    names: Iterable[str] = (),
    pattern: str | None = None,
    literal: bool = False,
    all: bool = False,  # noqa: A002  (mirrors the command's --all)
    kinds: Iterable[str] = KINDS,
) -> tuple[list[HeldLock], list[str]]:
    """What ``clear`` would release: (rows, names asked for but not held)."""
    names = list(names)
    chosen = sum((bool(names), pattern is not None, bool(all)))
    if chosen != 1:
        raise ValueError("choose exactly one of names=, pattern= or all=True")
    if names:
        return find(client, keyspace, names, kinds=kinds)
    return list_locks(client, keyspace, pattern, literal, kinds=kinds), []


def clear(
    client: Any,
    keyspace: KeySpace,
    *,
    names: Iterable[str] = (),
    pattern: str | None = None,
    literal: bool = False,
    all: bool = False,  # noqa: A002  (mirrors the command's --all)
    kinds: Iterable[str] = KINDS,
    dry_run: bool = False,
) -> ClearResult:
    """Force-release named locks, those matching ``pattern``, or ``all``.

    Only keys of this library under ``keyspace``'s prefix are ever touched.
    With ``dry_run`` nothing is released; ``released`` lists what would be.
    """
    rows, missing = select(
        client, keyspace, names=names, pattern=pattern, literal=literal, all=all, kinds=kinds
    )
    if dry_run:
        return ClearResult(released=rows, not_held=missing)
    result = release(client, keyspace, rows)
    result.not_held = missing
    return result
