"""What a test left behind: ``leftovers`` and ``assert_no_locks_left``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .holding import describe_owner, hold_tokens, in_open_transaction, settle_transactions

if TYPE_CHECKING:
    from ..core import RedisClient

__all__ = ["assert_no_locks_left", "leftovers"]


def _lease(left: float | None) -> str:
    return "no expiry" if left is None else f"{left:.1f}s left"


def _queued(client: RedisClient, prefix: str) -> list[str]:
    """Waiters' queue entries (lock and semaphore queues) under ``prefix``."""
    from ..core import scan_keys

    found: list[str] = []
    for code, kind in ((b"Q", "lock"), (b"SQ", "semaphore")):
        head = prefix.encode() + b":" + code + b":{"
        seen: set[bytes] = set()
        for key in scan_keys(client, head + b"*"):
            if key in seen:
                continue
            seen.add(key)
            waiting = client.llen(key)
            if not waiting:
                continue
            _tag, _sep, suffix = key[len(head) :].partition(b"}:")
            shown = (
                suffix[1:].decode("utf-8", "replace")
                if suffix[:1] == b"="
                else key.decode("latin-1")
            )
            found.append(f"{kind} {shown!r}: {waiting} queued waiter(s)")
    return found


def _waiting(holders: Iterable[Any]) -> str:
    """Says so when the lock waits for a block of the test that is still open."""
    if in_open_transaction(h.token for h in holders):
        return ", waiting for this thread's transaction.atomic() block to end"
    return ""


def leftovers(*, alias: str | None = None) -> list[str]:
    """What is held or queued under the current ``REDISLOCK['PREFIX']``.

    One line per held lock, per semaphore with permits and per queue of
    waiters, naming the holder (host, pid, thread and label: the decorated
    view or function). Locks and permits held by an open ``hold_lock`` or
    ``hold_permits`` are the test's own and are not listed. ``alias`` is a
    ``CACHES`` alias (default ``REDISLOCK['CACHE']``).
    """
    from ..connection import get_client
    from ..core import list_locks
    from ..locking.factories import keyspace

    client = get_client(alias)
    space = keyspace()
    settle_transactions()
    ours = hold_tokens()
    lines: list[str] = []
    for row in list_locks(client, space, waiters=0):
        holders = [h for h in row.holders if h.token not in ours]
        if not holders and not row.waiters:
            continue
        if row.kind == "lock":
            if holders:
                who = describe_owner(row.label, row.host, row.pid, row.thread)
                line = f"lock {row.name!r}: held by {who}, {_lease(row.lease_left)}"
                lines.append(line + _waiting(holders))
        else:
            for holder in holders:
                lines.append(
                    f"semaphore {row.name!r} (limit {row.limit}): permit held by "
                    f"{describe_owner(holder.label, holder.host, holder.pid, holder.thread)}, "
                    f"{_lease(holder.lease_left)}"
                )
    lines.extend(_queued(client, space.prefix))
    return lines


def assert_no_locks_left(*, alias: str | None = None) -> None:
    """Fail if a lock, a semaphore permit or a waiter is left under the prefix.

    Raises ``AssertionError`` listing each leftover (see ``leftovers``). Run
    it at the end of a test, inside ``isolated_prefix``: under the project's
    own prefix it also sees locks of other tests, other processes and the
    developer's running server.
    """
    found = leftovers(alias=alias)
    if found:
        from ..conf import conf

        listing = "\n  ".join(found)
        raise AssertionError(
            f"{len(found)} lock(s), permit(s) or waiter(s) left behind under prefix "
            f"{conf.PREFIX!r}:\n  {listing}"
        )
