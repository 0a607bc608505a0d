"""``AsyncSemaphore`` over ``redis.asyncio``: the same scripts and protocol as ``Semaphore``.

Waiting tasks share the event loop's one wake-up reader (``notify_async.get_async_notifier``),
so hundreds of them cost one connection. An acquire cancelled at any await
gives back whatever it may have been granted, shielded from the cancellation.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from . import scripts
from .base import DEFAULT_GRACE, STATE_KEEP_MS
from .exceptions import (
    LockError,
    LockLost,
    LockNotOwned,
    RedisUnavailable,
)
from .keys import KeySpace
from .lock_async import AsyncHandle
from .semaphore import ACQUIRE, CANCEL, CLEAR, REFRESH, RELEASE, SemaphoreBase

__all__ = ["AsyncSemaphore", "clear_semaphore_async"]


class AsyncSemaphore(SemaphoreBase, AsyncHandle):
    """``Semaphore`` for asyncio. A handle holds one permit at a time; shared
    between tasks it behaves like ``asyncio.Lock``, and only the task that
    acquired the permit may release or refresh it.
    """

    def _already_held(self) -> LockError:
        return LockError(
            f"semaphore {self.name!r}: this handle already holds a permit in this "
            "task; release it first, or use one handle per concurrent holder"
        )

    _acquire_script = ACQUIRE
    _cancel_script = CANCEL

    def _check_owner(self, action: str) -> str:
        if self.token is None:
            raise LockNotOwned(f"cannot {action} a permit of {self.name!r}: this handle holds none")
        if self._task is not asyncio.current_task():
            raise LockNotOwned(
                f"cannot {action} a permit of {self.name!r}: another task acquired it"
            )
        return self.token

    async def _release_call(self, token: str) -> int:
        args = self._release_args(token)
        return int(await scripts.run_async(self.client, RELEASE, self._key_tuple, args))

    async def refresh(self, ttl: float | None = None) -> None:
        """Reset this permit to ``ttl`` seconds (default: the handle's) from now."""
        token = self._check_owner("refresh")
        if self.lost:
            raise LockLost(f"permit of semaphore {self.name!r} was already lost")
        ttl_ms = self._ttl_ms(ttl)
        sent = time.monotonic()
        try:
            ok = await scripts.run_async(
                self.client, REFRESH, self._key_tuple, (token, ttl_ms, STATE_KEEP_MS)
            )
        except RedisUnavailable as exc:
            self._reset_unknown(exc, sent, ttl_ms)
            raise
        if not ok:
            self._mark_lost("the permit was gone at refresh (expired, cleared or lost by Redis)")
            raise LockLost(f"permit of semaphore {self.name!r} was lost before it was refreshed")
        if self.token == token and not self.lost:
            self._valid_until = self._validity(sent, ttl_ms)

    extend = refresh

    async def owned(self) -> bool:
        """Ask Redis whether this handle still holds its permit (one round trip)."""
        token = self.token
        if token is None or not self.held:
            return False
        try:
            score = await self.client.zscore(self.keys.lease, token)
        except Exception as exc:
            raise RedisUnavailable(f"could not check semaphore {self.name!r}: {exc}") from exc
        return score is not None and self.held


async def clear_semaphore_async(
    client: Any, keyspace: KeySpace, name: str, token: str | None = None
) -> int:
    """``clear_semaphore`` for a ``redis.asyncio`` client."""
    keys = keyspace.semaphore(name)
    return int(
        await scripts.run_async(
            client,
            CLEAR,
            (keys.lease, keys.queue, keys.state),
            (int(DEFAULT_GRACE * 1000), token or ""),
        )
    )
