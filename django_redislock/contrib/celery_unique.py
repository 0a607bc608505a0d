"""Unique Celery tasks: ``base=UniqueTask`` and a ``unique_key``.

::

    from django_redislock.contrib.celery_unique import UniqueTask

    @app.task(base=UniqueTask, unique_key="import:{feed_id}", unique_until="finish")
    def import_feed(feed_id): ...

    import_feed.delay(7)   # a second delay(7) while it is pending: the first's AsyncResult

The options are those of ``unique_task`` (``django_redislock.tasks``), named
``unique_*``: ``unique_key``, ``unique_until``, ``unique_on_duplicate``,
``unique_ttl``, ``unique_lease``, ``unique_alias``, ``unique_keep_for``. They
are checked when Celery creates the task class: at import with a finalized
app, else when the app finalizes (a worker's start, or the task's first use).

The claim travels in the message headers (``redislock_unique``). A retry
sends the same task id; whatever sends it (``raise self.retry()``,
``self.retry(throw=False)`` then a return, ``autoretry_for`` and
``retry_backoff``, or the task's own ``apply_async`` with its own id), the
message goes through ``apply_async`` while the run is still on: the run hears
of it there, puts its claim in the message and, with
``unique_until="finish"``, keeps the key for it however the run then ends.
A retry sent by another than the run (the worker's main process, for
``retry_on_worker_lost``) carries the claim too, and the key waits for it.
The task that holds the key, sent again by its id, is not sent twice.

Celery's lifecycle: the key lasts no longer than the message's ``expires``;
the ends a run never sees (a revoke, an expiry, a lost pool process, a hard
time limit, a worker that does not know the task) are handled in the
worker's main process (``tasks/celery_lifecycle.py``). A duplicate sent
under an id its caller fixed beforehand (every task of a group, chord or
chain) is still sent, marked: the worker fails it with ``TaskNotUnique``, so
that whatever waits for that id gets an answer.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

from celery import Task, states
from celery.exceptions import Reject, Retry
from celery.utils import uuid
from django.db import transaction

from ..conf import conf
from ..core import TaskLease
from ..locking.naming import describe
from ..tasks import celery_lifecycle, local
from ..tasks.claims import (
    claim,
    drop,
    give_up,
    held_by,
    keep,
    let_go,
    refused,
    seconds_until,
)
from ..tasks.options import DUPLICATE, HEADER, Claim, TaskNotUnique, UniqueOptions, make_options
from ..tasks.run import Run

__all__ = ["UniqueTask"]

# The request attribute that holds the run under way (a Celery request is a
# plain object, one per run, gone with it).
RUN = "_redislock_unique_run"


def _seconds_until(when: Any) -> float:
    # Celery reads a naive datetime as UTC.
    return seconds_until(when, naive_as_utc=True)


class UniqueTask(Task):
    """A Celery task refused at ``apply_async`` while one with its key is pending."""

    unique_key: Any = None
    unique_until: str = "finish"
    unique_on_duplicate: str = "existing"
    unique_ttl: float | None = None
    unique_lease: float | None = None
    unique_alias: str | None = None
    unique_keep_for: float | None = None
    #: The checked options, made with the class (None: not a unique task).
    unique_options: ClassVar[UniqueOptions | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        run = cls.__dict__.get("run")
        if cls.unique_key is None or run is None:
            return
        # app.task(bind=True) makes run the function itself, taking self first.
        bound = not isinstance(run, staticmethod)
        func = run if bound else run.__func__
        cls.unique_options = make_options(
            cls.unique_key,
            func,
            skip_first=bound,
            until=cls.unique_until,
            on_duplicate=cls.unique_on_duplicate,
            ttl=cls.unique_ttl,
            lease=cls.unique_lease,
            alias=cls.unique_alias,
            label=cls.__dict__.get("name") or f"{func.__module__}.{describe(func)}",
            who=f"UniqueTask {cls.__name__}",
            keep_for=cls.unique_keep_for,
        )

    # -- sending --------------------------------------------------------------------------
    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        **options: Any,
    ) -> Any:
        """Send the task, unless a task with its key is pending (see ``unique_task``)."""
        opts = type(self).unique_options
        if opts is None or not conf.ENABLED:
            return super().apply_async(args, kwargs, task_id=task_id, **options)
        headers = dict(options.get("headers") or {})
        delay = max(_seconds_until(options.get("countdown")), _seconds_until(options.get("eta")))
        # The message is thrown away after its expiry (the task's own, unless given).
        expires = options.get("expires", self.expires)
        limit = None if expires is None else _seconds_until(expires)
        run = self._sending_itself(task_id)
        if run is not None:
            # This run sends itself again: a retry, however it was asked for.
            # It runs with the run's claim, and the run keeps the key for it.
            run.retrying(delay, limit)
            headers[HEADER] = run.claim.payload()
        if HEADER in headers:
            # A retry, or a message sent with a claim of its own (not checked).
            if opts.until != "finish":
                del headers[HEADER]  # "enqueue" and "start": it runs without the key
            elif run is None:
                self._held_for(headers[HEADER], delay, limit)
            return self._send(args, kwargs, task_id, headers, options)
        name = opts.lock_name(tuple(args or ()), dict(kwargs or {}))
        fixed = task_id  # an id the caller (a canvas) holds already
        task_id = task_id or uuid()
        lock, outcome = claim(opts, name, delay, task_id=task_id, limit=limit)
        if isinstance(outcome, TaskNotUnique):
            holder = held_by(opts, name)
            if holder is not None and holder.fence is not None and self._revoked_unrun(holder):
                why = f"task {holder.task_id} was revoked before it ran"
                let_go(name, holder.token, holder.fence, opts.alias, why)
                lock, outcome = claim(opts, name, delay, task_id=task_id, limit=limit)
        if isinstance(outcome, TaskNotUnique):
            return self._duplicate(outcome, fixed, args, kwargs, headers, options)
        assert lock is not None
        headers[HEADER] = outcome.payload()
        try:
            result = self._send(args, kwargs, task_id, headers, options)
        except BaseException:
            give_up(lock)
            raise
        drop(lock, outcome.token, None)  # the id went in with the claim
        return result

    def _send(self, args: Any, kwargs: Any, task_id: str | None, headers: Any, options: Any) -> Any:
        options["headers"] = headers
        if local.here.active:
            # The test kit (django_redislock.testing): run here and now, as
            # Celery's eager mode runs a task, never through a broker.
            return self.apply(args, kwargs, task_id=task_id or uuid(), **options)
        return super().apply_async(args, kwargs, task_id=task_id, **options)

    def _held_for(self, payload: Any, delay: float, limit: float | None) -> None:
        """A message sent with a claim by another than its run (Celery's retry
        of a task whose pool process was lost, sent by the worker's main
        process): if that claim still holds the key, the key waits for it as
        for any retry, ``ttl`` plus its delay (and no longer than its expiry).
        A claim that holds nothing (forged, or gone) changes nothing."""
        found = Claim.from_payload(payload)
        if found is None:
            return
        ttl = found.ttl + delay
        ttl = ttl if limit is None else min(ttl, max(limit, 0.001))
        keep(found.name, found.token, found.fence, found.alias, ttl, "its retry was sent")

    def _revoked_unrun(self, holder: TaskLease) -> bool:
        """Whether the key's task was revoked before any run of it adopted the
        key: a worker records the revoke in the result backend when it hears
        of it, long before it meets the message (which may wait behind
        others, or for its countdown)."""
        if holder.ran or holder.task_id is None:
            return False
        try:
            return bool(self.AsyncResult(holder.task_id).state == states.REVOKED)
        except Exception:  # no result backend, or none reachable: refuse as usual
            return False

    def _duplicate(
        self,
        refusal: TaskNotUnique,
        fixed: str | None,
        args: Any,
        kwargs: Any,
        headers: Any,
        options: Any,
    ) -> Any:
        opts = type(self).unique_options
        assert opts is not None
        refused(self, opts, refusal)
        if fixed is not None and fixed == refusal.task_id:
            # The pending task itself, sent again by its id: that id's result
            # is the one the caller waits for, and one message is enough.
            return self.AsyncResult(fixed)
        if fixed is not None:
            # Its caller holds this id already: a group's or chord's result,
            # a chain's next step, the caller's own code. Sent under it,
            # marked, it fails at once in the worker (nothing runs) and that
            # caller learns of the refusal instead of waiting for ever.
            headers[DUPLICATE] = {"n": refusal.name, "j": refusal.task_id}
            now = {k: v for k, v in options.items() if k not in ("countdown", "eta")}
            return self._send(args, kwargs, fixed, headers, now)
        if opts.on_duplicate == "existing" and refusal.task_id is not None:
            return self.AsyncResult(refusal.task_id)
        raise refusal

    def _sending_itself(self, task_id: str | None) -> Run | None:
        """The run of this task under way here, if ``task_id`` is its own id."""
        request = self.request
        run = getattr(request, RUN, None)
        if run is None or task_id is None or task_id != getattr(request, "id", None):
            return None
        return run

    def delay_on_commit(self, *args: Any, **kwargs: Any) -> None:
        """``delay`` when the current transaction commits (at once outside one),
        as Celery's ``DjangoTask`` offers."""
        transaction.on_commit(functools.partial(self.delay, *args, **kwargs))

    def apply_async_on_commit(self, *args: Any, **kwargs: Any) -> None:
        """``apply_async`` when the current transaction commits (at once outside one)."""
        transaction.on_commit(functools.partial(self.apply_async, *args, **kwargs))

    # -- running --------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run in the worker: adopt the key the message carries, and let it go by ``until``."""
        opts = type(self).unique_options
        request = self.request
        if opts is None:
            return super().__call__(*args, **kwargs)
        refusal = celery_lifecycle.duplicate_of(request)
        if refusal is not None:
            raise refusal  # a refused duplicate sent under its own id: nothing runs
        found = celery_lifecycle.claim_of(request)
        if found is None or not conf.ENABLED:
            return super().__call__(*args, **kwargs)
        run = Run(found, opts, opts.label)
        run.start()
        # Where apply_async finds it when the run sends its own retry.
        setattr(request, RUN, run)
        retry_in: float | None = None
        succeeded = redelivered = False
        try:
            result = super().__call__(*args, **kwargs)
            succeeded = True
            return result
        except Retry as exc:
            retry_in = _seconds_until(exc.when)
            raise
        except Reject as exc:
            redelivered = bool(exc.requeue)
            raise
        except BaseException as exc:
            # Not the task's failure but the process's end (a time limit, a
            # terminate, a cold shutdown): a message acknowledged late is
            # delivered again, and finds its key.
            redelivered = not isinstance(exc, Exception) and bool(self.acks_late)
            raise
        finally:
            setattr(request, RUN, None)
            run.finish(retry_in, succeeded=succeeded, redelivered=redelivered)


def _options_of(task: Any) -> UniqueOptions | None:
    return getattr(type(task), "unique_options", None) if isinstance(task, UniqueTask) else None


celery_lifecycle.connect(_options_of)
