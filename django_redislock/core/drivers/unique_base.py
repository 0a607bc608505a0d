"""What a unique task's lease says of its task, for both drivers.

A unique task's key is a lock (``Lock``), and its lease hash carries, beside
what every lease holds (``t`` the token, ``f`` the fence, ``o`` the owner),
the fields only unique tasks write, through ``unique_note.lua``:

``j``   the queued task's id, for its duplicates to be told
``r``   set with the owner once a worker's run adopts the lease: the task ran,
        or runs (a revoked task whose key no run adopted never ran)

Nothing outside the core names these fields: the Django layer writes them with
``note_task`` and reads them with ``read_task`` (``unique_async.py`` and its
generated twin ``unique.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..engine import scripts

__all__ = ["FIELDS", "NOTE", "TaskLease", "note_args", "task_lease"]

# Writes the task id and the owner into a lease if the token still holds it;
# repeatable: a second run writes the same again.
NOTE = scripts.load("unique_note", prelude=None, repeatable=True)

# Read from the lease by read_task, in this order.
FIELDS = ("t", "f", "j", "r")


@dataclass(frozen=True)
class TaskLease:
    """What a unique key's lease says of the task that holds it."""

    token: str
    fence: int | None
    task_id: str | None
    # A worker's run adopted it: the task ran, or runs.
    ran: bool


def note_args(token: str, task_id: str | None, owner: str) -> tuple[str, str, str]:
    """``unique_note.lua``'s arguments: '' leaves a field as it is."""
    return (token, task_id or "", owner)


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else None if value is None else str(value)


def task_lease(reply: Any) -> TaskLease | None:
    """The ``HMGET`` of ``FIELDS``' reply; None when no lease holds the key."""
    token, fence, task_id, ran = reply
    if token is None:
        return None
    fence_text = _text(fence)
    return TaskLease(
        token=_text(token) or "",
        fence=int(fence_text) if fence_text and fence_text.isdigit() else None,
        task_id=_text(task_id),
        ran=ran is not None,
    )
