"""Give back, off the caller's path, what an asyncio call with an unknown outcome may hold.

The asyncio side of ``giveback.py`` (whose docstring gives the policy, and
the reasons for its order): a drain of late replies and each give-back run as
tasks of the running loop. ``tools/gen_sync.py`` maps this module's names to
that one's.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import breaker
from .calls_base import DRAIN_POLL, FIRST_DELAY, MAX_DELAY, Pending, pending_of

__all__ = ["drain_async", "submit_async"]

logger = logging.getLogger("django_redislock.giveback")

_tasks: set[asyncio.Task[Any]] = set()


def _spawn(coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
    loop = asyncio.get_running_loop()
    task: asyncio.Task[Any] = loop.create_task(coro, name=name)  # type: ignore[arg-type]
    # The loop holds tasks weakly: keep them until they are done.
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return task


def drain_async(pending: Pending) -> None:
    """``drain`` for an asyncio connection: a task of the running loop."""
    _spawn(_read_late_replies_async(pending), "redislock-giveback-drain")


async def _read_late_replies_async(pending: Pending) -> None:
    conn = pending.conn
    try:
        while pending.unread:
            left = pending.deadline - time.monotonic()
            if left <= 0:
                break
            try:
                # Bounded by the connection's socket timeout, which raises. (Given
                # a timeout of its own, read_response returns None instead: that
                # could not be told from a nil reply.)
                read = conn.read_response(disconnect_on_error=False)
                if getattr(conn, "socket_timeout", None) is None:
                    await asyncio.wait_for(read, left)
                else:
                    await read
            except ResponseError:
                pass
            except (RedisTimeoutError, asyncio.TimeoutError):
                continue
            except Exception:
                logger.debug("connection with late replies closed", exc_info=True)
                break
            pending.unread -= 1
        pending.answered = pending.unread == 0
    finally:
        if not pending.answered:
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)
        try:
            released = pending.release()
            if inspect.isawaitable(released):
                await released
        finally:
            pending.done.set()
            pending.settle()


async def _retry_until_async(
    make_call: Callable[[], Awaitable[Any]],
    deadline: float,
    what: str,
    pending: Pending | None,
) -> None:
    breaker.off_path()  # this task holds no request
    # The drain's first look for the late replies (see submit).
    look_until = min(deadline, time.monotonic() + DRAIN_POLL)
    while pending is not None and not pending.done.is_set():
        if time.monotonic() >= look_until:
            break
        await asyncio.sleep(0.01)
    delay = FIRST_DELAY
    attempts = 0
    while True:
        attempts += 1
        try:
            await make_call()
        except Exception as exc:
            if time.monotonic() + delay >= deadline:
                logger.warning(
                    "gave up giving back %s after %d attempt(s): %s", what, attempts, exc
                )
                return
            logger.debug("giving back %s failed (%s); trying again", what, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_DELAY)
            continue
        if attempts > 1:
            logger.info("gave back %s after %d attempts", what, attempts)
        return


def submit_async(
    make_call: Callable[[], Awaitable[Any]],
    *,
    within: float,
    after: BaseException | None = None,
    what: str = "a lease",
) -> asyncio.Task[Any]:
    """``submit`` for asyncio: a task on the running loop (returned, for tests).

    ``make_call`` makes a new awaitable for each attempt.
    """
    deadline = time.monotonic() + within
    pending = pending_of(after)
    if pending is not None:
        pending.keep_until(deadline)
        pending.once_answered(
            lambda: _spawn(
                _retry_until_async(make_call, deadline, what + " (again)", None),
                "redislock-giveback",
            )
        )
    return _spawn(_retry_until_async(make_call, deadline, what, pending), "redislock-giveback")
