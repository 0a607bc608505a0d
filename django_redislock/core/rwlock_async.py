"""``AsyncReadWriteLock``: the same scripts and protocol as ``ReadWriteLock``, over asyncio.

The asyncio driver is ``AsyncLock``'s: waiting tasks share the event loop's
one wake-up reader, and an acquire cancelled at any await gives back whatever
it may have been granted, shielded from the cancellation.
"""

from __future__ import annotations

from typing import Any

from . import scripts
from .base import DEFAULT_GRACE, STATE_KEEP_MS
from .exceptions import RedisUnavailable
from .keys import KeySpace
from .lock_async import AsyncLock
from .rwlock import ACQUIRE, CANCEL, CLEAR, REFRESH, RELEASE, ReadWriteLockBase

__all__ = ["AsyncReadWriteLock", "clear_rw_lock_async"]


class AsyncReadWriteLock(ReadWriteLockBase, AsyncLock):
    """``ReadWriteLock`` for asyncio. Shared between tasks a handle behaves
    like ``asyncio.Lock``: only the task that acquired may release or extend.
    """

    _acquire_script = ACQUIRE
    _cancel_script = CANCEL
    _give_back_after_late_reply = True

    async def _release_call(self, token: str) -> int:
        args = self._release_args(token)
        return int(await scripts.run_async(self.client, RELEASE, self._key_tuple, args))

    async def _extend_call(self, token: str, ttl_ms: int) -> bool:
        args = (token, ttl_ms, STATE_KEEP_MS)
        return bool(await scripts.run_async(self.client, REFRESH, self._key_tuple, args))

    async def owned(self) -> bool:
        """Ask Redis whether this handle still holds its turn (one round trip)."""
        token = self.token
        if token is None or not self.held:
            return False
        try:
            score = await self.client.zscore(self.keys.lease, token)
        except Exception as exc:
            raise RedisUnavailable(f"could not check {self._label()}: {exc}") from exc
        return score is not None and self.held


async def clear_rw_lock_async(
    client: Any, keyspace: KeySpace, name: str, token: str | None = None
) -> int:
    """``clear_rw_lock`` for a ``redis.asyncio`` client."""
    keys = keyspace.rwlock(name)
    return int(
        await scripts.run_async(
            client,
            CLEAR,
            (keys.lease, keys.queue, keys.state),
            (int(DEFAULT_GRACE * 1000), token or ""),
        )
    )
