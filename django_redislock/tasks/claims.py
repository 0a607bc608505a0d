"""The enqueuer's side of a unique task: take the key, hand it to the task, or refuse.

See ``unique.py`` for the whole protocol.
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import Any

from redis.exceptions import RedisError

from ..core.drivers.lock import Lock
from ..core.drivers.lock_async import AsyncLock
from ..core.engine import scripts
from ..core.exceptions import LockError, RedisUnavailable
from ..locking.factories import get_lock
from ..signals import count_key, send_task_duplicate
from .options import Claim, TaskNotUnique, UniqueOptions

__all__ = ["claim", "drop", "give_up", "note", "note_async", "refused", "seconds_until"]

logger = logging.getLogger("django_redislock.unique")

# How long a duplicate waits for the first enqueuer to write its task id: the
# id is written one round trip after the key is taken (Celery) or once the
# backend has queued the task (Django), so it is normally there at once.
ID_WAIT = 1.0

# Write the task id and the owner into a lease, if our token still holds it
# (the header of the script says more). Repeatable: it writes the same again.
_NOTE = scripts.load("unique_note", prelude=None, repeatable=True)


def seconds_until(when: Any) -> float:
    """Seconds from now until ``when`` (seconds, or a datetime); 0 if past or None."""
    if isinstance(when, datetime.datetime):
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
        scripts.run(lock.client, _NOTE, (lock.keys.lease,), (token, task_id or "", owner))
    except RedisUnavailable as exc:
        _not_noted(lock.name, task_id, exc)


async def note_async(lock: AsyncLock, token: str, task_id: str | None, owner: str = "") -> None:
    """``note`` for the asyncio driver."""
    try:
        await scripts.run_async(
            lock.client, _NOTE, (lock.keys.lease,), (token, task_id or "", owner)
        )
    except RedisUnavailable as exc:
        _not_noted(lock.name, task_id, exc)


def _existing(lock: Lock) -> tuple[bool, str | None]:
    """(whether the key is still held, the holder's task id if written yet)."""
    deadline = time.monotonic() + ID_WAIT
    delay = 0.005
    while True:
        try:
            token, task_id = lock.client.hmget(lock.keys.lease, ["t", "j"])
        except RedisError as exc:
            raise RedisUnavailable(f"could not read unique key {lock.name!r}: {exc}") from exc
        if token is None:
            return False, None
        if task_id is not None:
            return True, task_id.decode() if isinstance(task_id, bytes) else str(task_id)
        # Held, but its enqueuer has not written the id yet: a window of one
        # round trip, or of the backend's enqueue. Bounded.
        if time.monotonic() + delay > deadline:
            return True, None
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def claim(
    opts: UniqueOptions, name: str, delay: float = 0.0, task_id: str | None = None
) -> tuple[Lock | None, Claim | TaskNotUnique]:
    """Take the key ``name`` for a task about to be enqueued.

    ``(lock, Claim)`` when taken: the caller enqueues with the claim and then
    drops ``lock`` (or releases it if the enqueue failed). ``(None,
    TaskNotUnique)`` when a task holds it. ``delay``: seconds before the task
    may run (a countdown), added to the lease so that it cannot run out first.
    Raises ``RedisUnavailable``: unique tasks fail closed.
    """
    ttl = opts.pending_ttl + delay
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
            return lock, Claim(
                name=name,
                token=lock.token,
                fence=lock.fence,
                until=opts.until,
                lease=opts.run_lease,
                ttl=opts.pending_ttl,
            )
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
