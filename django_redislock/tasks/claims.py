"""The enqueuer's side of a unique task: take the key, hand it to the task, or refuse.

See ``unique.py`` for the whole protocol.
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import Any

from ..core import (
    AsyncLock,
    Lock,
    LockError,
    RedisUnavailable,
    TaskLease,
    note_task,
    note_task_async,
    read_task,
)
from ..locking.factories import get_lock
from ..signals import count_key, send_task_duplicate
from . import local
from .options import Claim, TaskNotUnique, UniqueOptions

__all__ = [
    "claim",
    "drop",
    "give_up",
    "held_by",
    "keep",
    "let_go",
    "note",
    "note_async",
    "refused",
    "seconds_until",
]

logger = logging.getLogger("django_redislock.unique")

# How long a duplicate waits for the first enqueuer to write its task id: the
# id is written one round trip after the key is taken (Celery) or once the
# backend has queued the task (Django), so it is normally there at once.
ID_WAIT = 1.0


def seconds_until(when: Any, *, naive_as_utc: bool = False) -> float:
    """Seconds from now until ``when``; 0 if past, None or not a time.

    ``when``: seconds, a datetime, or a datetime in ISO 8601 (as a Celery
    retry carries its ``expires``). A naive datetime is local time, or UTC
    with ``naive_as_utc`` (Celery's reading of one).
    """
    if isinstance(when, str):
        try:
            when = datetime.datetime.fromisoformat(when)
        except ValueError:
            return 0.0
    if isinstance(when, datetime.datetime):
        if when.tzinfo is None and naive_as_utc:
            when = when.replace(tzinfo=datetime.timezone.utc)
        now = datetime.datetime.now(when.tzinfo) if when.tzinfo else datetime.datetime.now()
        return max(0.0, (when - now).total_seconds())
    if isinstance(when, (int, float)) and not isinstance(when, bool):
        return max(0.0, float(when))
    return 0.0


def _not_noted(name: str, task_id: str | None, exc: Exception) -> None:
    # Only the duplicates' answer (TaskNotUnique without an id) and the
    # operators' view (the former holder) suffer.
    what = f"task {task_id}" if task_id is not None else "the worker"
    logger.warning("could not record %s in unique key %r: %s", what, name, exc)


def note(lock: Lock, token: str, task_id: str | None, owner: str = "") -> None:
    """Write the task id beside the token, for duplicates to find, and the
    owner (a worker that adopted the lease) for operators."""
    try:
        note_task(lock, token, task_id, owner)
    except RedisUnavailable as exc:
        _not_noted(lock.name, task_id, exc)


async def note_async(lock: AsyncLock, token: str, task_id: str | None, owner: str = "") -> None:
    """``note`` for the asyncio driver."""
    try:
        await note_task_async(lock, token, task_id, owner)
    except RedisUnavailable as exc:
        _not_noted(lock.name, task_id, exc)


def _existing(lock: Lock) -> tuple[bool, str | None]:
    """(whether the key is still held, the holder's task id if written yet)."""
    deadline = time.monotonic() + ID_WAIT
    delay = 0.005
    while True:
        held = read_task(lock)
        if held is None:
            return False, None
        if held.task_id is not None:
            return True, held.task_id
        # Held, but its enqueuer has not written the id yet: a window of one
        # round trip, or of the backend's enqueue. Bounded.
        if time.monotonic() + delay > deadline:
            return True, None
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def held_by(opts: UniqueOptions, name: str) -> TaskLease | None:
    """What the unique key ``name``'s lease says of its task now; None if nobody holds it."""
    return read_task(get_lock(name, wait=0, alias=opts.alias))


def claim(
    opts: UniqueOptions,
    name: str,
    delay: float = 0.0,
    task_id: str | None = None,
    limit: float | None = None,
) -> tuple[Lock | None, Claim | TaskNotUnique]:
    """Take the key ``name`` for a task about to be enqueued.

    ``(lock, Claim)`` when taken: the caller enqueues with the claim and then
    drops ``lock`` (or releases it if the enqueue failed). ``(None,
    TaskNotUnique)`` when a task holds it. ``delay``: seconds before the task
    may run (a countdown), added to the lease so that it cannot run out first.
    ``limit``: seconds after which the task will never run (Celery's
    ``expires``): the lease ends then at the latest, so that a task the broker
    or the worker throws away does not keep its key beyond it.
    Raises ``RedisUnavailable``: unique tasks fail closed.
    """
    ttl = opts.pending_ttl + delay
    if limit is not None:
        # An expiry already past still sends the message (Celery discards
        # it): the key is then taken for a moment, to refuse it if a task
        # holds it, and held by nothing after.
        ttl = min(ttl, max(limit, 0.001))
    # Twice at most: a key let go between our acquire and our read is free.
    for _ in range(2):
        lock = get_lock(
            name,
            timeout=ttl,
            wait=0,
            renew=False,
            alias=opts.alias,
            label=opts.label,
            metric_name=opts.metric_name,
        )
        if lock.acquire(wait=0):
            assert lock.token is not None and lock.fence is not None
            count_key("unique_task", opts.metric_name, "claimed")
            if task_id is not None:
                note(lock, lock.token, task_id)
            taken = Claim(
                name=name,
                token=lock.token,
                fence=lock.fence,
                until=opts.until,
                lease=opts.run_lease,
                ttl=opts.pending_ttl,
                alias=opts.alias,
            )
            local.here.noted(taken)
            return lock, taken
        held, existing = _existing(lock)
        if held:
            return None, TaskNotUnique(name, existing)
    return None, TaskNotUnique(name, None)


def refused(task: Any, opts: UniqueOptions, refusal: TaskNotUnique) -> None:
    """Make a refused duplicate visible: the log and ``task_duplicate``."""
    logger.info(
        "refused a duplicate of %s: unique key %r is held by task %s",
        opts.label,
        refusal.name,
        refusal.task_id or "(id not known yet)",
    )
    send_task_duplicate(
        task, name=refusal.name, task_id=refusal.task_id, on_duplicate=opts.on_duplicate
    )
    outcome = "replayed" if opts.on_duplicate == "existing" else "refused"
    count_key("unique_task", opts.metric_name, outcome)


def give_up(lock: Lock) -> None:
    """The enqueue failed after the key was taken: let the key go at once."""
    try:
        lock.release()
    except (LockError, RedisUnavailable) as exc:
        logger.warning("could not free unique key %r after a failed enqueue: %s", lock.name, exc)
    else:
        count_key("unique_task", str(lock.metric_name), "released")


def drop(lock: Lock, token: str, task_id: str | None) -> None:
    """The task is queued: record its id and leave the lease to it.

    The enqueuer's handle is dropped as it is: it does not renew, and nothing
    releases a handle that is dropped, so the lease is the task's now.
    """
    if task_id is not None:
        note(lock, token, task_id)


def _handle(name: str, alias: str | None, ttl: float) -> Lock:
    return get_lock(name, timeout=ttl, wait=0, renew=False, alias=alias)


def let_go(name: str, token: str, fence: int, alias: str | None, why: str) -> bool:
    """Free the unique key ``name`` if ``token`` still holds it: the task it
    was taken for will not run (again). Returns whether it was freed.

    For the process that learns of it (a worker told of a revoke, a lost
    pool process, a time limit), not the run, which frees its own.
    """
    # Adopted for a moment (the lease cut to a few seconds), then released:
    # both compare the token, so a key that went to another task is left alone.
    lock = _handle(name, alias, 5.0)
    try:
        if not lock.adopt(token, fence):
            return False
        lock.release()
    except (LockError, RedisUnavailable, ValueError) as exc:
        logger.warning("could not free unique key %r (%s): %s", name, why, exc)
        return False
    logger.info("freed unique key %r: %s", name, why)
    return True


def keep(name: str, token: str, fence: int, alias: str | None, ttl: float, why: str) -> bool:
    """Keep the unique key ``name`` for ``ttl`` seconds if ``token`` still
    holds it (its task's message will be delivered again); then its next run
    adopts it. Returns whether it was kept."""
    lock = _handle(name, alias, ttl)
    try:
        # The handle is dropped holding the lease: nothing releases it (see drop).
        kept = lock.adopt(token, fence, ttl=ttl)
    except (LockError, RedisUnavailable, ValueError) as exc:
        logger.warning("could not keep unique key %r (%s): %s", name, why, exc)
        return False
    if kept:
        logger.info("kept unique key %r for %gs: %s", name, ttl, why)
    return kept
