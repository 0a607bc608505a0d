# generated from multi_async.py by tools/gen_sync.py; do not edit
"""``MultiLock``: several names, taken all together or not at all.

How it takes several names without ever waiting while it holds one, and what
it promises, is in ``multi_base.py``, with what both drivers share. The
algorithm is written once, for asyncio; ``tools/gen_sync.py`` makes the
sync driver from it (edit this source, never the generated file).
"""

from __future__ import annotations

import time

from ..exceptions import LockError, LockLost, RedisUnavailable
from ._sync_prims import Cancelled
from .handle import HeldInBlock
from .lock import Lock
from .multi_base import MultiBase, lock_names

__all__ = ["MultiLock", "MultiBase", "lock_names"]


class MultiLock(MultiBase[Lock], HeldInBlock):
    """Locks on several names, held all together or not at all.

    ``MultiLock(client, ["product:3", "product:9"], ttl=30, wait=10)``
    takes the same options as ``Lock``, applied to each name. Names are
    taken in sorted order whatever order they are given in, and never waited
    for while any other is held, so callers cannot deadlock one another.
    """

    _handle = Lock

    def acquire(self, wait: float | None = None, *, ttl: float | None = None) -> bool:
        """Take every name, waiting up to ``wait`` seconds in all (0: try once).

        True when all are held; False, holding none, when one stayed busy.
        ``RedisUnavailable`` when Redis cannot be reached, holding none.
        """
        started = time.monotonic()
        deadline = started + self._wait_s(wait)
        first: Lock | None = None  # a busy name to wait for, holding nothing
        while True:
            taken: list[Lock] = []
            busy: Lock | None = None
            try:
                if first is not None:
                    left = deadline - time.monotonic()
                    if left <= 0 or not first.acquire(left, ttl=ttl):
                        self._stayed_busy(first, started)
                        return False
                    taken.append(first)
                for lock in self.locks.values():
                    if lock is first:
                        continue
                    if not lock.acquire(0, ttl=ttl):
                        busy = lock
                        break
                    taken.append(lock)
            except BaseException:
                # Cancelled too (asyncio): each release runs to its end regardless.
                self._give_back(taken)
                raise
            if busy is None:
                self._taken(started)
                return True
            self._give_back(taken)
            if time.monotonic() >= deadline:
                self._stayed_busy(busy, started)
                return False
            first = busy

    def _give_back(self, taken: list[Lock]) -> None:
        """Release names taken on the way to a busy one (newest first)."""
        cancelled: Cancelled | None = None
        for lock in reversed(taken):
            try:
                lock.release()
            except (LockError, RedisUnavailable):
                # Lost meanwhile, or Redis did not answer: the handle already
                # goes on giving it back off our path; nothing was done under it.
                pass
            except Cancelled as exc:
                # That release ran to its end; the others must too.
                cancelled = exc
        if cancelled is not None:
            raise cancelled

    def release(self) -> None:
        """Give every name back. Raises ``LockLost`` if any was lost meanwhile
        (after releasing the others), ``RedisUnavailable`` if Redis did not
        answer for one (it is then given back off the caller's path). A task
        cancelled meanwhile still gives back every name, then raises
        ``CancelledError``."""
        failure: BaseException | None = None
        cancelled: Cancelled | None = None
        for lock in reversed(self.locks.values()):
            try:
                lock.release()
            except (LockLost, RedisUnavailable) as exc:
                if failure is None or isinstance(exc, RedisUnavailable):
                    failure = exc
                continue
            except Cancelled as exc:
                cancelled = exc  # that release ran to its end; the others must too
                continue
            self._released(lock)
        if cancelled is not None:
            raise cancelled
        if isinstance(failure, LockLost):
            raise LockLost(f"lock {self.name!r} was lost before it was released") from failure
        if failure is not None:
            raise failure

    def extend(self, ttl: float | None = None) -> None:
        """Reset every name's lease to ``ttl`` seconds (default: the handle's)."""
        for lock in self.locks.values():
            lock.extend(ttl)
