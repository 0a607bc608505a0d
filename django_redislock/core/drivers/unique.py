# generated from unique_async.py by tools/gen_sync.py; do not edit
"""Write and read what a unique task's lease says of its task.

The fields and their meaning are in ``unique_base.py``. Written once, for
asyncio; ``tools/gen_sync.py`` makes the sync functions (``unique.py``) from
it (edit this source, never the generated file). Every call goes through the
bounded transport, as every lock call does: bounded by the client's socket
timeout, routed to the key's node on a Cluster; a failure raises
``RedisUnavailable``.
"""

from __future__ import annotations

from .. import failures
from ..io import calls
from .lock import Lock
from .unique_base import FIELDS, NOTE, TaskLease, note_args, task_lease

__all__ = ["note_task", "read_task"]


def note_task(lock: Lock, token: str, task_id: str | None, owner: str = "") -> bool:
    """Write ``task_id`` (for duplicates to be told) and ``owner`` (a worker
    that adopted the lease, for operators) into the lease ``token`` holds.

    '' or None leaves a field as it is. False when the token no longer holds
    the lease: nothing was written.
    """
    keys = (lock.keys.lease,)
    return bool(calls.run(lock.client, NOTE, keys, note_args(token, task_id, owner)))


def read_task(lock: Lock) -> TaskLease | None:
    """What the lease of ``lock``'s name says of its task; None when nobody holds it."""
    lease = lock.keys.lease
    try:
        replies = calls.call(lock.client, [("HMGET", lease, *FIELDS)], lease)
    except calls.CallFailed as failed:
        cause = failed.cause
    else:
        if not isinstance(replies[0], Exception):
            return task_lease(replies[0])
        cause = replies[0]
    doing = f"reading unique key {lock.name!r}"
    raise failures.unavailable(doing, cause, failures.address_of(lock.client)) from cause
