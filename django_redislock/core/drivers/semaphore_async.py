"""``AsyncSemaphore``: at most ``limit`` holders of a name, across every process.

The protocol, scripts and arguments are in ``semaphore_base.py``; the driver
is ``AsyncHandle``'s (the wait loop, give-back on interrupt or timeout, the
context manager), with the semaphore's scripts in place of the lock's.
Written once, for asyncio; ``tools/gen_sync.py`` makes the sync driver from
it (edit this source, never the generated file).

Waiters share the process's one wake-up channel, so hundreds of them cost one
connection. An acquire interrupted or cancelled at any point gives back
whatever it may have been granted.
"""

from __future__ import annotations

from ..clients import AsyncRedisClient
from ..engine.keys import KeySpace
from ..exceptions import LockError
from ..io import calls_async
from ._async_prims import HOLDER_KIND
from .base import DEFAULT_GRACE, STATE_KEEP_MS
from .handle_async import AsyncHandle, clear_holders_async
from .semaphore_base import (
    ACQUIRE,
    CANCEL,
    CLEAR,
    REFRESH,
    RELEASE,
    SemaphoreBase,
    check_limit,
)

__all__ = [
    "AsyncSemaphore",
    "SemaphoreBase",
    "check_limit",
    "clear_semaphore_async",
    "release_permit_async",
]


class AsyncSemaphore(SemaphoreBase[AsyncRedisClient], AsyncHandle):
    """At most ``limit`` holders of ``name`` at once, across every process.

    ``AsyncSemaphore(client, "reports", 3, ttl=60, wait=5)``. ``acquire``
    waits up to ``wait`` seconds for a permit, in arrival order; a permit
    lasts ``ttl`` seconds on the Redis server's clock unless ``refresh``-ed,
    so a crashed holder's permit comes back by itself. A handle holds one
    permit at a time, and only the thread or task that acquired it may
    release or refresh it.
    """

    def _already_held(self) -> LockError:
        return LockError(
            f"semaphore {self.name!r}: this handle already holds a permit in this "
            f"{HOLDER_KIND}; release it first, or use one handle per concurrent holder"
        )

    _acquire_script = ACQUIRE
    _cancel_script = CANCEL
    _release_script = RELEASE
    _extend_script = REFRESH

    # -- release / refresh ------------------------------------------------------
    async def refresh(self, ttl: float | None = None) -> None:
        """Reset this permit to ``ttl`` seconds (default: the handle's) from now."""
        await self._extend("refresh", ttl)

    extend = refresh

    async def owned(self) -> bool:
        """Ask Redis whether this handle still holds its permit (one round trip)."""
        return await self._in_sorted_set()


async def release_permit_async(
    client: AsyncRedisClient, keyspace: KeySpace, name: str, token: str, serial: int | None = None
) -> bool:
    """Give back the permit ``token`` of ``name`` from any thread or task, by its token.

    For code that hands a permit over to whoever finishes the work (a
    response's ``close()``, for one). Returns False when it was no longer held.
    ``serial`` (the handle's ``serial``) lets a release sent again after its
    reply was lost report success; without it such a retry reports False.
    """
    keys = keyspace.semaphore(name)
    return bool(
        await calls_async.run_async(
            client,
            RELEASE,
            (keys.lease, keys.queue, keys.state),
            (token, int(DEFAULT_GRACE * 1000), 1, STATE_KEEP_MS, "" if serial is None else serial),
        )
    )


async def clear_semaphore_async(
    client: AsyncRedisClient, keyspace: KeySpace, name: str, token: str | None = None
) -> int:
    """Force-release one holder of ``name`` (or all, when ``token`` is None).

    Owner details are removed and waiters are woken for the freed permits.
    Former holders find out at their next refresh or release. Returns how many
    permits (including unclaimed reservations) were dropped.
    """
    return await clear_holders_async(client, CLEAR, keyspace.semaphore(name), token)
