"""A unique Celery task's key at the ends its run never sees.

A run lets its key go itself, however it ends (``run.py``). Some tasks end
without a run, or without the end of one, and Celery tells the worker's main
process; these receivers (connected by ``contrib.celery_unique``) free the
key there, or keep it for the message's next delivery:

* ``task_revoked``: a revoked or expired message thrown away, or a running
  task terminated. The task will not run: the key is freed.
* ``task_unknown``: a message of a task this worker does not know, thrown
  away. The key its claim names is freed.
* ``task_failure`` with ``WorkerLostError`` (the pool process running it
  died) or ``TimeLimitExceeded`` (a hard time limit): Celery sends it from
  the main process when the task will not run again, and the key is freed;
  after a time limit with ``acks_late`` and without ``acks_on_timeout`` the
  message goes back to its queue, and the key is kept for it instead.

Each one compares the token (``claims.let_go``, ``claims.keep``): a key
that went to another task is never touched, and a receiver that comes after
the run (or another receiver) finds nothing to do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import signals
from celery.exceptions import TimeLimitExceeded, WorkerLostError

from ..core import RedisUnavailable
from .claims import held_by, keep, let_go
from .options import DUPLICATE, HEADER, Claim, TaskNotUnique, UniqueOptions

__all__ = ["claim_of", "connect", "duplicate_of"]

logger = logging.getLogger("django_redislock.unique")


def _header(request: Any, name: str) -> Any:
    """A custom header of a task's message, from its request: in ``headers``
    (an eager run), or as an attribute (Celery copies a message's headers
    onto the request)."""
    headers = getattr(request, "headers", None) or {}
    found = headers.get(name) if isinstance(headers, dict) else None
    return found if found is not None else getattr(request, name, None)


def claim_of(request: Any) -> Claim | None:
    """The claim the task's message carries, if any."""
    payload = _header(request, HEADER) if request is not None else None
    return Claim.from_payload(payload) if payload is not None else None


def duplicate_of(request: Any) -> TaskNotUnique | None:
    """The refusal a duplicate sent under its own id carries, if it is one."""
    refusal = _header(request, DUPLICATE) if request is not None else None
    if not isinstance(refusal, dict) or not isinstance(refusal.get("n"), str):
        return None
    task_id = refusal.get("j")
    return TaskNotUnique(refusal["n"], task_id if isinstance(task_id, str) else None)


def _requeued_on_timeout(task: Any) -> bool:
    """Whether Celery puts the message back after the task's hard time limit."""
    if not getattr(task, "acks_late", False):
        return False
    # acks_on_timeout (Celery 5.7+) falls back to acks_on_failure_or_timeout.
    acks = getattr(task, "acks_on_timeout", None)
    if acks is None:
        acks = getattr(task, "acks_on_failure_or_timeout", None)
    return acks is False


def connect(options_of: Callable[[Any], UniqueOptions | None]) -> None:
    """Connect the receivers; ``options_of(task)``: a unique task's options, or None."""

    def revoked(
        sender: Any = None,
        request: Any = None,
        terminated: bool = False,
        expired: bool = False,
        **kwargs: Any,
    ) -> None:
        found = claim_of(request)
        if found is None:
            return
        how = "expired" if expired else "terminated" if terminated else "revoked"
        task_id = getattr(request, "id", None)
        let_go(found.name, found.token, found.fence, found.alias, f"task {task_id} {how}")

    def unknown(
        sender: Any = None, message: Any = None, name: Any = None, id: Any = None, **kwargs: Any
    ) -> None:
        headers = getattr(message, "headers", None)
        payload = headers.get(HEADER) if isinstance(headers, dict) else None
        found = Claim.from_payload(payload) if payload is not None else None
        if found is not None:
            why = f"task {id} of {name!r}, which this worker does not know, was thrown away"
            let_go(found.name, found.token, found.fence, found.alias, why)

    def failed(
        sender: Any = None,
        task_id: Any = None,
        exception: Any = None,
        args: Any = None,
        kwargs: Any = None,
        **more: Any,
    ) -> None:
        if not isinstance(exception, (WorkerLostError, TimeLimitExceeded)):
            return  # a run's own failure: the run let its key go
        opts = options_of(sender)
        if opts is None:
            return
        found = claim_of(getattr(sender, "request", None))
        if found is not None:
            name, token, fence = found.name, found.token, found.fence
        else:
            # After a time limit Celery does not tell which request: the
            # key's lease says which task holds it.
            try:
                name = opts.lock_name(tuple(args or ()), dict(kwargs or {}))
                holder = held_by(opts, name)
            except (LookupError, TypeError, ValueError, RedisUnavailable) as exc:
                logger.warning("could not find the unique key of task %s: %s", task_id, exc)
                return
            if holder is None or holder.task_id != task_id or holder.fence is None:
                return
            token, fence = holder.token, holder.fence
        why = f"task {task_id} ended by {type(exception).__name__}"
        if isinstance(exception, TimeLimitExceeded) and _requeued_on_timeout(sender):
            keep(name, token, fence, opts.alias, opts.pending_ttl, f"{why}, and is queued again")
        else:
            let_go(name, token, fence, opts.alias, why)

    signals.task_revoked.connect(revoked, weak=False, dispatch_uid="django_redislock.revoked")
    signals.task_unknown.connect(unknown, weak=False, dispatch_uid="django_redislock.unknown")
    signals.task_failure.connect(failed, weak=False, dispatch_uid="django_redislock.failure")
