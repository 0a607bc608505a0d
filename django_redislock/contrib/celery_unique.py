"""Unique Celery tasks: ``base=UniqueTask`` and a ``unique_key``.

::

    from django_redislock.contrib.celery_unique import UniqueTask

    @app.task(base=UniqueTask, unique_key="import:{feed_id}", unique_until="finish")
    def import_feed(feed_id): ...

    import_feed.delay(7)   # a second delay(7) while it is pending: the first's AsyncResult

The options are those of ``unique_task`` (``django_redislock.tasks``), named
``unique_*``: ``unique_key``, ``unique_until``, ``unique_on_duplicate``,
``unique_ttl``, ``unique_lease``, ``unique_alias``. They are checked when
Celery creates the task class: at import with a finalized app, else when the
app finalizes (a worker's start, or the task's first use).

The claim travels in the message headers (``redislock_unique``). A retry
sends the same task id; whatever sends it (``raise self.retry()``,
``self.retry(throw=False)`` then a return, ``autoretry_for`` and
``retry_backoff``, or the task's own ``apply_async`` with its own id), the
message goes through ``apply_async`` while the run is still on: the run hears
of it there, puts its claim in the message and, with
``unique_until="finish"``, keeps the key for it however the run then ends.
"""

from __future__ import annotations

from typing import Any

from celery import Task
from celery.exceptions import Retry
from celery.utils import uuid

from ..conf import conf
from ..locking.naming import describe
from ..tasks.claims import claim, drop, give_up, refused, seconds_until
from ..tasks.options import HEADER, Claim, TaskNotUnique, UniqueOptions, make_options
from ..tasks.run import Run

__all__ = ["UniqueTask"]

# The request attribute that holds the run under way (a Celery request is a
# plain object, one per run, gone with it).
RUN = "_redislock_unique_run"


def _payload(request: Any) -> Any:
    """Our claim in a task's request: in its headers, or as an attribute
    (Celery copies a message's custom headers onto the request)."""
    headers = getattr(request, "headers", None) or {}
    found = headers.get(HEADER) if isinstance(headers, dict) else None
    return found if found is not None else getattr(request, HEADER, None)


class UniqueTask(Task):
    """A Celery task refused at ``apply_async`` while one with its key is pending."""

    unique_key: Any = None
    unique_until: str = "finish"
    unique_on_duplicate: str = "existing"
    unique_ttl: float | None = None
    unique_lease: float | None = None
    unique_alias: str | None = None
    _unique: UniqueOptions | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        run = cls.__dict__.get("run")
        if cls.unique_key is None or run is None:
            return
        # app.task(bind=True) makes run the function itself, taking self first.
        bound = not isinstance(run, staticmethod)
        func = run if bound else run.__func__
        cls._unique = make_options(
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
        )

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        **options: Any,
    ) -> Any:
        """Send the task, unless a task with its key is pending (see ``unique_task``)."""
        opts = type(self)._unique
        headers = dict(options.get("headers") or {})
        if opts is None or not conf.ENABLED:
            return super().apply_async(args, kwargs, task_id=task_id, **options)
        delay = max(seconds_until(options.get("countdown")), seconds_until(options.get("eta")))
        run = self._sending_itself(task_id)
        if run is not None:
            # This run sends itself again: a retry, however it was asked for.
            # It runs with the run's claim, and the run keeps the key for it.
            run.retrying(delay)
            headers[HEADER] = run.claim.payload()
        if HEADER in headers:
            # A retry, or a message sent with a claim of its own (not checked).
            if opts.until != "finish":
                del headers[HEADER]  # "enqueue" and "start": it runs without the key
            options["headers"] = headers
            return super().apply_async(args, kwargs, task_id=task_id, **options)
        name = opts.lock_name(tuple(args or ()), dict(kwargs or {}))
        task_id = task_id or uuid()
        lock, outcome = claim(opts, name, delay, task_id=task_id)
        if isinstance(outcome, TaskNotUnique):
            refused(self, opts, outcome)
            if opts.on_duplicate == "existing" and outcome.task_id is not None:
                return self.AsyncResult(outcome.task_id)
            raise outcome
        assert lock is not None
        headers[HEADER] = outcome.payload()
        options["headers"] = headers
        try:
            result = super().apply_async(args, kwargs, task_id=task_id, **options)
        except BaseException:
            give_up(lock)
            raise
        drop(lock, outcome.token, None)  # the id went in with the claim
        return result

    def _sending_itself(self, task_id: str | None) -> Run | None:
        """The run of this task under way here, if ``task_id`` is its own id."""
        request = self.request
        run = getattr(request, RUN, None)
        if run is None or task_id is None or task_id != getattr(request, "id", None):
            return None
        return run

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run in the worker: adopt the key the message carries, and let it go by ``until``."""
        opts = type(self)._unique
        request = self.request
        payload = _payload(request) if opts is not None else None
        found = Claim.from_payload(payload) if payload is not None else None
        if found is None or not conf.ENABLED:
            return super().__call__(*args, **kwargs)
        run = Run(found, opts, opts.label if opts is not None else self.name)
        run.start()
        # Where apply_async finds it when the run sends its own retry.
        setattr(request, RUN, run)
        retry_in: float | None = None
        try:
            return super().__call__(*args, **kwargs)
        except Retry as exc:
            retry_in = seconds_until(exc.when)
            raise
        finally:
            setattr(request, RUN, None)
            run.finish(retry_in)
