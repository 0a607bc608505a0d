"""The asyncio side of what the drivers wait, hold and cancel with.

The drivers (``lock_async.py``, ``semaphore_async.py``, ``rwlock_async.py``,
``multi_async.py``) are written once, for asyncio, against the names below;
``tools/gen_sync.py`` makes the sync drivers from them by renaming this module
to ``_sync_prims`` (and ``AsyncLock`` to ``Lock``, and so on). Each name here
has a twin there that means the same for threads. Where threads and tasks
truly differ (a task can be cancelled at any await, a thread cannot; a gate
belongs to one event loop), the difference lives here, never in a driver.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol, TypeAlias

from ..io import breaker
from ..io.aio_calls import (
    CLEANUP_TIMEOUT,
    cancel_requests,
    complete,
    keep_cancellation,
    raise_if_cancelled_since,
    wait_for,
)
from ..io.interrupts_async import CallTimeout, Cancelled

__all__ = [
    "CLEANUP_TIMEOUT",
    "HOLDER_KIND",
    "CallTimeout",
    "Cancelled",
    "Gate",
    "Holder",
    "Renewer",
    "cancel_requests",
    "complete",
    "current_holder",
    "current_name",
    "keep_cancellation",
    "pause",
    "raise_if_cancelled_since",
    "start_renewal",
    "stop_renewal",
]

log_renew = logging.getLogger("django_redislock.renew")

# What holds a handle, in messages ("acquired by another task").
HOLDER_KIND = "task"
Holder: TypeAlias = "asyncio.Task[Any]"
Renewer: TypeAlias = "asyncio.Task[None]"


async def pause(seconds: float) -> None:
    """Wait ``seconds`` before trying again (the event loop runs meanwhile)."""
    await asyncio.sleep(seconds)


def current_holder() -> Holder | None:
    """Who may release what it acquires: the running task."""
    return asyncio.current_task()


def current_name() -> str:
    """The running task's name, for the owner metadata."""
    task = asyncio.current_task()
    return task.get_name() if task is not None else "?"


class Gate:
    """One holder of a handle at a time: an ``asyncio.Lock`` of the running
    loop (a handle used from another loop gets a gate of that loop)."""

    def __init__(self) -> None:
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _current(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._loop is not loop:
            self._lock = asyncio.Lock()
            self._loop = loop
        return self._lock

    async def acquire(self, timeout: float) -> bool:
        """Take the gate, waiting up to ``timeout`` seconds (0: only if free)."""
        lock = self._current()
        if timeout > 0:
            try:
                # Cancelled or timed out just as it was granted: let it go.
                await wait_for(lock.acquire(), timeout, undo=lock.release)
            except asyncio.TimeoutError:
                return False
            return True
        if lock.locked():
            return False
        await lock.acquire()
        return True

    def release(self) -> None:
        # Replaced meanwhile by the gate of another loop: nothing to let go.
        if self._lock is not None and self._lock.locked():
            self._lock.release()


class Renewing(Protocol):
    name: str

    async def _renew_once(self) -> float | None:
        """Renew now; return seconds until the next renewal, or None to stop."""


async def _renew_loop(handle: Renewing, delay: float | None) -> None:
    breaker.off_path()  # renewal holds no request: never refused by a breaker
    while delay is not None:
        await asyncio.sleep(delay)
        try:
            delay = await handle._renew_once()
        except Exception:
            # As the sync watchdog does: a bug must not end renewal silently.
            log_renew.exception("renewal failed unexpectedly; it stops for this lock")
            return


def start_renewal(handle: Renewing, delay: float) -> Renewer:
    """Renew ``handle`` after ``delay`` seconds, and then as it says: a task
    of its own on the running loop."""
    return asyncio.get_running_loop().create_task(
        _renew_loop(handle, delay), name=f"redislock-renew:{handle.name[:40]}"
    )


def stop_renewal(handle: Renewing, renewer: Renewer | None) -> None:
    # A renewal that reports a loss may release from its own task (on_lost):
    # it ends by itself, cancelling it there would cut the release short.
    if renewer is not None and renewer is not asyncio.current_task():
        renewer.cancel()
