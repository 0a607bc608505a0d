"""Give-backs that run off the caller's path until Redis answers.

When a lock call fails without an answer (a timeout: the script may have run,
or may still run once Redis reads it), what the call may have taken must be
given back, or the name stays blocked for a whole lease. The caller must not
wait for that: it already waited its bound. So the give-back (a cancel or
release script, both safe to repeat) is handed to a worker that retries it
until Redis answers or the lease it protects would have ended anyway.

A timed-out attempt is retried at once: the timeout itself paces it, and an
attempt in flight when a frozen Redis resumes is answered within a round trip.
A refused connection is retried after a short back-off.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from typing import Any

from . import scripts
from .exceptions import RedisUnavailable
from .protocol import may_have_run

__all__ = ["pending", "submit", "submit_async"]

logger = logging.getLogger("django_redislock.giveback")

BACKOFF_MIN, BACKOFF_MAX = 0.05, 0.5

_Job = tuple[Any, scripts.Script, tuple[bytes, ...], tuple[Any, ...], float]

_mutex = threading.Lock()
_jobs: deque[_Job] = deque()
_worker: threading.Thread | None = None
_tasks: set[asyncio.Task[None]] = set()


def pending() -> int:
    """How many give-backs are still to be done (sync and asyncio)."""
    with _mutex:
        return len(_jobs) + (1 if _worker is not None and _worker.is_alive() else 0) + len(_tasks)


def submit(
    client: Any,
    script: scripts.Script,
    keys: tuple[bytes, ...],
    args: tuple[Any, ...],
    *,
    within: float,
) -> None:
    """Run ``script`` on a sync client off the caller's path, retried until
    Redis answers or ``within`` seconds have passed."""
    global _worker
    with _mutex:
        _jobs.append((client, script, keys, args, time.monotonic() + within))
        if _worker is None or not _worker.is_alive():
            _worker = threading.Thread(target=_work, name="redislock-giveback", daemon=True)
            _worker.start()


def _work() -> None:
    global _worker
    while True:
        with _mutex:
            if not _jobs:
                _worker = None
                return
            job = _jobs.popleft()
        _run_sync(*job)


def _run_sync(
    client: Any,
    script: scripts.Script,
    keys: tuple[bytes, ...],
    args: tuple[Any, ...],
    deadline: float,
) -> None:
    backoff = BACKOFF_MIN
    while True:
        try:
            scripts.run(client, script, keys, args)
            return
        except Exception as exc:  # a worker that dies gives nothing back: keep trying
            if time.monotonic() >= deadline:
                logger.warning("gave up giving back %s after its lease: %s", script.name, exc)
                return
            if not (isinstance(exc, RedisUnavailable) and may_have_run(exc)):
                time.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
                backoff = min(backoff * 2, BACKOFF_MAX)


def submit_async(
    client: Any,
    script: scripts.Script,
    keys: tuple[bytes, ...],
    args: tuple[Any, ...],
    *,
    within: float,
) -> None:
    """``submit`` for a ``redis.asyncio`` client: a task on the running loop."""
    task = asyncio.get_running_loop().create_task(
        _run_async(client, script, keys, args, time.monotonic() + within),
        name="redislock-giveback",
    )
    with _mutex:
        _tasks.add(task)
    task.add_done_callback(_task_done)


def _task_done(task: asyncio.Task[None]) -> None:
    with _mutex:
        _tasks.discard(task)
    if not task.cancelled() and task.exception() is not None:
        logger.error("give-back failed", exc_info=task.exception())


async def _run_async(
    client: Any,
    script: scripts.Script,
    keys: tuple[bytes, ...],
    args: tuple[Any, ...],
    deadline: float,
) -> None:
    backoff = BACKOFF_MIN
    while True:
        try:
            await scripts.run_async(client, script, keys, args)
            return
        except Exception as exc:  # a worker that dies gives nothing back: keep trying
            if time.monotonic() >= deadline:
                logger.warning("gave up giving back %s after its lease: %s", script.name, exc)
                return
            if not (isinstance(exc, RedisUnavailable) and may_have_run(exc)):
                await asyncio.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
                backoff = min(backoff * 2, BACKOFF_MAX)


def _after_fork_in_child() -> None:
    # The parent's give-backs are the parent's: a child must not run them twice.
    global _mutex, _worker
    _mutex = threading.Lock()
    _jobs.clear()
    _worker = None
    _tasks.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
