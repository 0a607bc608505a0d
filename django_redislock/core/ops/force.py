"""Force-release held locks, semaphores and read-write locks, for operators.

An operator releases what was shown and nothing else, whatever the kind: each
holder shown (a lock's lease, a semaphore's permit, a reader's or a writer's
turn) is released by its own token, which the kind's ``clear`` script
compares with what Redis holds in the same step. A holder that came since has
another token (one per acquisition) and is left alone. ``release`` does it for
rows as they were read; a page that showed rows to a person carries what it
showed as ``Shown`` (holder ids, never tokens), and ``still_held`` narrows a
fresh read to exactly that before ``release``.

The next waiter is woken at once; the former holder finds out at its next
renewal, extend or release (``LockLost``, and ``held`` turns False), and
learns who released it: before each holder is released, its token is marked
in the name's force-release hash (``engine/loss.py``) with who ran it and
when, and the mark is taken back if that holder was not released after all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import failures
from ..clients import RedisClient
from ..drivers.base import DEFAULT_GRACE
from ..engine import scripts
from ..engine.keys import KeySpace
from ..engine.loss import FORCED_KEEP_MS, forced_mark
from ..io import calls
from .inspection import KINDS, HeldLock, Holder, find, list_locks

__all__ = ["ClearResult", "Shown", "clear", "release", "select", "still_held"]

logger = logging.getLogger("django_redislock.inspect")


@dataclass
class ClearResult:
    """What a force-release did."""

    # Rows as they were just before they were released (only the holders released).
    released: list[HeldLock] = field(default_factory=list)
    # Names asked for explicitly that were not held (as any kind asked for).
    not_held: list[str] = field(default_factory=list)
    # Rows (only the holders concerned) that changed hands or were released
    # between reading and releasing: left alone, so a new holder is never
    # thrown out unseen.
    changed: list[HeldLock] = field(default_factory=list)


@dataclass(frozen=True)
class Shown:
    """What an operator was shown of one row: its holders, by ``Holder.ident``."""

    kind: str
    name: str
    holders: frozenset[str]

    @classmethod
    def of(cls, row: HeldLock) -> Shown:
        return cls(row.kind, row.name, frozenset(h.ident for h in row.holders))


def still_held(
    client: RedisClient, keyspace: KeySpace, shown: Iterable[Shown]
) -> tuple[list[HeldLock], list[Shown]]:
    """Read again what was shown: (rows with only the holders shown that still
    hold, what was shown and holds no more). A holder that came since is in
    neither."""
    rows: list[HeldLock] = []
    gone: list[Shown] = []
    for item in shown:
        # Its holders only: releasing needs no waiter listed.
        found, _missing = find(client, keyspace, [item.name], kinds=(item.kind,), waiters=0)
        row = found[0].only(item.holders) if found else None
        left = item.holders - {h.ident for h in row.holders} if row is not None else item.holders
        if row is not None:
            rows.append(row)
        if left:
            gone.append(Shown(item.kind, item.name, frozenset(left)))
    return rows, gone


def _clear_script(kind: str, keyspace: KeySpace, name: str) -> tuple[Any, tuple[bytes, ...]]:
    """The kind's force-release script and its keys: all three take (lease,
    queue, state) and (grace ms, token), and release a holder only by its token."""
    if kind == "lock":
        k = keyspace.lock(name)
        return scripts.CLEAR, (k.lease, k.queue, k.state)
    # Imported here: semaphores and read-write locks are optional for locks.
    if kind == "semaphore":
        from ..drivers.semaphore_base import CLEAR as SEMAPHORE_CLEAR

        s = keyspace.semaphore(name)
        return SEMAPHORE_CLEAR, (s.lease, s.queue, s.state)
    from ..drivers.rwlock_base import CLEAR as RW_CLEAR

    w = keyspace.rwlock(name)
    return RW_CLEAR, (w.lease, w.queue, w.state)


def _marked(client: RedisClient, forced: bytes, commands: list[tuple[Any, ...]]) -> None:
    """Write or take back force-release marks (one bounded batch)."""
    try:
        replies = calls.call(client, commands, forced)
    except calls.CallFailed as failed:
        raise failures.unavailable(
            "marking a force-release", failed.cause, failures.address_of(client)
        ) from failed.cause
    for reply in replies:
        if isinstance(reply, Exception):
            raise failures.unavailable(
                "marking a force-release", reply, failures.address_of(client)
            ) from reply


def _log_released(row: HeldLock, holder: Holder, by: str) -> None:
    owner = f"{holder.host or '?'}:{holder.pid if holder.pid is not None else '?'}/{holder.thread}"
    logger.warning(
        "force-released %s %r (held by %s pid %s %s %r for %.1fs) by %s",
        row.kind,
        row.name,
        holder.host,
        holder.pid,
        holder.thread,
        holder.label,
        holder.held_for,
        by,
        extra={
            "lock_name": row.name,
            "template": holder.template,
            "kind": row.kind,
            "owner": owner,
            "label": holder.label,
            "fence": row.fence if holder.mode != "read" else None,
            "held_seconds": holder.held_for,
            "cause": "force_released",
            "forced_by": by,
        },
    )


def release(
    client: RedisClient,
    keyspace: KeySpace,
    rows: Iterable[HeldLock],
    *,
    grace: float = DEFAULT_GRACE,
    by: str = "an operator",
) -> ClearResult:
    """Force-release exactly the holders of these rows, as they were read.

    Each holder goes only if its token still holds (a lock's lease, a
    semaphore's permit, a read-write lock's reader or writer); one that came
    since stays. The next waiter is woken at once. ``by`` says who releases
    (``manage.py redislocks clear by alice@web-1``, ``admin user 'bob'``):
    it is logged here, and the holder logs it when it finds out.
    """
    result = ClearResult()
    grace_ms = int(grace * 1000)
    for row in rows:
        script, keys = _clear_script(row.kind, keyspace, row.name)
        forced = keyspace.forced(row.name)
        done = set()
        for h in row.holders:
            # An empty token would tell the scripts "every holder": never sent.
            if not h.token:
                continue
            # Marked first: the holder may find out the moment the script has
            # run, and must find the mark then. The mark outlives the lease.
            keep = FORCED_KEEP_MS + int((h.lease_left or 0) * 1000)
            mark = forced_mark(by, time.time())
            _marked(client, forced, [("HSET", forced, h.token, mark), ("PEXPIRE", forced, keep)])
            if int(calls.run(client, script, keys, (grace_ms, h.token))):
                done.add(h.ident)
                _log_released(row, h, by)
            else:
                # Not released (it went, or changed hands): no mark for it.
                _marked(client, forced, [("HDEL", forced, h.token)])
        released = row.only(done)
        if released is not None:
            result.released.append(released)
        changed = row.only({h.ident for h in row.holders} - done)
        if changed is not None:
            result.changed.append(changed)
    return result


def select(
    client: RedisClient,
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
        return find(client, keyspace, names, kinds=kinds, waiters=0)
    return list_locks(client, keyspace, pattern, literal, kinds=kinds, waiters=0), []


def clear(
    client: RedisClient,
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
