"""The guarded run of an async view, in a task that its request's cancellation does not reach.

An ASGI server tells Django that the client has gone, and Django cancels the
view's task (``ASGIHandler.handle``). An idempotent view must not stop there:
the retry that client is about to send must find the first attempt's outcome
recorded, and never run the view a second time. Cut short anywhere after the
key's claim, the attempt would leave it marked running with nobody to finish
it: in the view, with its work half done; in the store that follows it, with
the work done and nothing recorded (the cancellation reaching the store's
read closes its connection, and Redis drops the write still queued there);
in the release, with the key held for its whole lease.

So the claim, the view, the store and the release run in a task of their
own, as a sync view runs to its end in its thread whatever its client does.
The request waits for it: the first cancellation is held until the task is
done, and raised then, so that Django still sees a cancelled request, but only
once the outcome is recorded and the key given back. A second cancellation (a
server that will not wait, as at its shutdown) is raised at once; the task
goes on by itself, kept referenced here until it ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["to_the_end"]

logger = logging.getLogger("django_redislock.idempotency")

T = TypeVar("T")

# The tasks running here. The event loop keeps only weak references to its
# tasks: one that nobody awaits any more could be collected before its end.
_running: set[asyncio.Task[Any]] = set()


def _report(task: asyncio.Task[Any]) -> None:
    """What a task nobody awaits any longer ended with: logged, never lost."""
    _running.discard(task)
    if task.cancelled():
        logger.warning("an idempotent view whose client had gone was cancelled before its end")
        return
    exc = task.exception()
    if exc is not None:
        logger.error("an idempotent view whose client had gone failed", exc_info=exc)


async def to_the_end(name: str, func: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``await func(*args)``, in a task of its own that runs to its end even if
    the caller is cancelled (see the module docstring); ``name`` is the key's,
    for the log."""
    task = asyncio.ensure_future(func(*args))
    _running.add(task)
    task.add_done_callback(_running.discard)
    cancelled = False
    while not task.done():
        try:
            # asyncio.wait never cancels what it waits for.
            await asyncio.wait({task})
        except asyncio.CancelledError:
            if cancelled:
                task.add_done_callback(_report)
                raise
            cancelled = True
            logger.info(
                "the request holding %s was cancelled (its client left?): its view goes on "
                "to its end, and its outcome is recorded",
                name,
            )
    if cancelled:
        # The client has gone: nobody reads the response. What the view
        # raised is logged, as Django would have logged it.
        _report(task)
        raise asyncio.CancelledError
    return task.result()
