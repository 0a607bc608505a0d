"""Awaiting Redis calls under cancellation: what every asyncio driver needs.

Before Python 3.12, ``asyncio.wait_for`` (and redis-py, which sends each
command under it) can swallow a cancellation that lands as the awaited call
completes, and Python 3.10 cannot notice that afterwards. A lock library must
never lose a cancellation (the task would go on waiting its whole wait), nor
let one cut short the give-back it made necessary (the lease would stay taken
for its whole TTL). These helpers do both.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = [
    "CLEANUP_TIMEOUT",
    "cancel_requests",
    "complete",
    "keep_cancellation",
    "raise_if_cancelled_since",
    "wait_for",
]

T = TypeVar("T")

# Cleanup after a cancelled acquire may take this long before we give up on it.
CLEANUP_TIMEOUT = 2.0


def cancel_requests() -> int:
    task = asyncio.current_task()
    # Task.cancelling() exists from Python 3.11; 3.10 cannot tell.
    return task.cancelling() if task is not None and hasattr(task, "cancelling") else 0


def raise_if_cancelled_since(count: int) -> None:
    """Raise a cancellation that an await swallowed.

    Before Python 3.12, ``asyncio.wait_for`` (ours, and the one redis-py uses
    to send a command) returns normally when its inner awaitable finishes in
    the same loop iteration as the caller's cancellation, and the cancellation
    is lost: a cancelled acquire would carry on waiting its whole wait.
    """
    if cancel_requests() > count:
        raise asyncio.CancelledError


def _undo_if_done(undo: Any) -> Any:
    def callback(inner: asyncio.Future[Any]) -> None:
        if not inner.cancelled() and inner.exception() is None:
            undo()

    return callback


def _retrieve(inner: asyncio.Future[Any]) -> None:
    if not inner.cancelled():
        inner.exception()


async def wait_for(aw: Any, timeout: float, undo: Any = None) -> Any:
    """``asyncio.wait_for`` that never swallows a cancellation of the caller;
    ``undo`` gives back what the inner awaitable took if the caller does not
    get its result (cancelled, or timed out just as it finished).

    Built on ``asyncio.wait``, which never swallows a cancellation: before
    Python 3.12 ``asyncio.wait_for`` returns the result when the awaitable
    finishes in the same loop iteration as the cancellation, and Python 3.10
    has no ``Task.cancelling()`` to notice that afterwards.
    """
    inner = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({inner}, timeout=timeout)
    except asyncio.CancelledError:
        inner.cancel()
        inner.add_done_callback(_undo_if_done(undo) if undo is not None else _retrieve)
        raise
    if not done:
        inner.cancel()
        inner.add_done_callback(_undo_if_done(undo) if undo is not None else _retrieve)
        raise asyncio.TimeoutError
    return inner.result()


async def keep_cancellation(aw: Awaitable[T]) -> T:
    """Await ``aw`` (a Redis call) in a task of its own, so that a cancellation
    of the caller always reaches the caller.

    redis-py sends each command under ``asyncio.wait_for``, which before Python
    3.12 swallows a cancellation that lands as the send completes, and Python
    3.10 cannot notice that afterwards (see ``raise_if_cancelled_since``).
    Here the cancellation lands on ``asyncio.wait`` instead. The call still
    runs to its end (bounded), so that what the caller sends next to undo it
    reaches Redis after it.
    """
    inner = asyncio.ensure_future(aw)
    try:
        await asyncio.wait({inner})
    except asyncio.CancelledError:
        # The call's own outcome, or a second cancellation, gives way to this
        # one; a KeyboardInterrupt or SystemExit would not.
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await complete(inner, CLEANUP_TIMEOUT)
        raise
    return inner.result()


async def complete(call: Awaitable[T], timeout: float) -> T:
    """Await ``call`` to the end, even if the caller is cancelled meanwhile.

    Giving back a lease or a turn must not be cut short by the cancellation
    that made it necessary (a release never written would hold the lock for
    its whole TTL). The wait is bounded by ``timeout`` (then TimeoutError);
    a cancellation that arrived meanwhile is re-raised once the call is over.
    """
    loop = asyncio.get_running_loop()
    inner = asyncio.ensure_future(call)
    deadline = loop.time() + timeout
    cancelled = False
    while not inner.done():
        left = deadline - loop.time()
        if left <= 0:
            inner.cancel()
            break
        try:
            # asyncio.wait does not cancel `inner` when we are cancelled.
            await asyncio.wait({inner}, timeout=left)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if inner.done() and not inner.cancelled():
            inner.exception()  # retrieved: the cancellation is what we report
        raise asyncio.CancelledError
    if not inner.done() or inner.cancelled():
        raise asyncio.TimeoutError(f"cleanup did not finish within {timeout}s")
    return inner.result()
