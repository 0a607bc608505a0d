"""Unique tasks: a duplicate enqueue is refused while a task with the same key is pending.

``@unique_task("import:{feed_id}")`` above Django's ``@task`` (Celery:
``base=UniqueTask`` from ``contrib.celery_unique``) makes ``enqueue`` take a
Redis lock named ``unique:<key>`` before the task goes to the queue. The lock
is an ordinary ``Lock``; what is particular is who holds it:

* **The enqueuer takes it** (wait 0), with a lease of ``ttl`` seconds: how
  long a task that never starts (its message lost) keeps the key. It writes
  the task id beside the token (field ``j`` of the lease hash), so that a
  duplicate can be given the existing task.
* **The token travels with the task**: the claim (name, token, fence,
  ``until``, leases) rides in the task's kwargs (Django) or message headers
  (Celery). The enqueuer's handle is dropped without releasing anything.
* **The worker adopts it** (``Lock.adopt``: the same token, one round trip)
  and renews it while the run lasts, with a lease of ``lease`` seconds: a
  worker killed mid-run frees the key within that lease, and it writes its
  own owner metadata into the lease, so operators see the worker, not the
  enqueuer. A retry carries the same claim, so it keeps ownership; another
  task, with another token, can neither adopt nor release it.

``until`` says when the key is let go:

* ``"enqueue"``: when a worker starts the run (Laravel's
  ``ShouldBeUniqueUntilProcessing``): a duplicate may be enqueued while it runs.
* ``"start"``: when the run that started ends, however it ends; a retry it
  asks for runs without the key.
* ``"finish"`` (default): when the task is finished for good. A retry keeps
  the key (its lease is reset to ``ttl`` plus the retry's delay): the run
  knows of it by the message it sent (``Run.retrying``, Celery) or by the
  ``Retry`` it raised, and hands the key on however it then ends. The key
  goes when a run ends without asking for one (success or final failure).

``keep_for`` keeps the key that many seconds after a run that succeeded
(with ``until="finish"`` or ``"start"``): at most one run per key in that
time. A failed run lets it go, as without it.

A duplicate gets the existing task's result handle (``on_duplicate="existing"``)
or ``TaskNotUnique`` (``"raise"``; also when the existing task cannot be
fetched); either way ``task_duplicate`` is sent and the refusal is logged
under ``django_redislock.unique``. Never a silent drop.

The parts: ``options.py`` (the checked arguments and the claim), ``claims.py``
(the enqueuer's side), ``run.py`` (the worker's side); this module is the
glue for Django's tasks.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction, sync_to_async

from ..conf import conf
from ..locking.naming import describe
from ..locking.options import django_task
from ..signals import declare
from .claims import claim, drop, give_up, refused, seconds_until
from .options import KWARG, Claim, TaskNotUnique, UniqueOptions, make_options
from .run import Run

__all__ = ["unique_task"]

_F = TypeVar("_F")


def _enqueue(base: Any, task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    opts: UniqueOptions = task.func._redislock_unique
    if not conf.ENABLED or KWARG in kwargs:
        return base.enqueue(task, *args, **kwargs)
    name = opts.lock_name(args, kwargs)
    delay = seconds_until(task.run_after)
    lock, outcome = claim(opts, name, delay)
    if isinstance(outcome, TaskNotUnique):
        refused(task, opts, outcome)
        if opts.on_duplicate == "existing" and outcome.task_id is not None:
            try:
                return task.get_result(outcome.task_id)
            except Exception as exc:
                # The backend keeps no results (immediate), or no longer this one.
                raise outcome from exc
        raise outcome
    assert lock is not None
    try:
        result = base.enqueue(task, *args, **{**kwargs, KWARG: outcome.payload()})
    except BaseException:
        give_up(lock)
        raise
    drop(lock, outcome.token, str(result.id))
    return result


_classes: dict[type, type] = {}


def _unique_class(base: type) -> type:
    """A subclass of the backend's task class whose ``enqueue`` claims the key."""
    cls = _classes.get(base)
    if cls is not None:
        return cls

    def enqueue(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _enqueue(base, self, args, kwargs)

    async def aenqueue(self: Any, *args: Any, **kwargs: Any) -> Any:
        return await sync_to_async(_enqueue)(base, self, args, kwargs)

    enqueue.__doc__ = "Queue the task, unless a task with the same unique key is pending."
    cls = type(
        f"Unique{base.__name__}",
        (base,),
        {"__slots__": (), "__module__": __name__, "enqueue": enqueue, "aenqueue": aenqueue},
    )
    _classes[base] = cls
    return cls


def _runner(func: Callable[..., Any], opts: UniqueOptions, takes_context: bool) -> Any:
    def claimed(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Run | None, str | None]:
        payload = kwargs.pop(KWARG, None)
        found = Claim.from_payload(payload) if payload is not None else None
        if found is None or not conf.ENABLED:
            return None, None
        # With a context the run knows its id: a duplicate enqueued while an
        # immediate backend runs it (before enqueue returns) is told the id.
        task_id = str(args[0].task_result.id) if takes_context and args else None
        return Run(found, opts, opts.label), task_id

    if iscoroutinefunction(func):

        @functools.wraps(func)
        async def arun(*args: Any, **kwargs: Any) -> Any:
            this, task_id = claimed(args, kwargs)
            if this is None:
                return await func(*args, **kwargs)
            await this.start_async(task_id)
            succeeded = False
            try:
                result = await func(*args, **kwargs)
                succeeded = True
                return result
            finally:
                await this.finish_async(succeeded=succeeded)

        arun._redislock_unique = opts  # type: ignore[attr-defined]
        return arun

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        this, task_id = claimed(args, kwargs)
        if this is None:
            return func(*args, **kwargs)
        this.start(task_id)
        succeeded = False
        try:
            result = func(*args, **kwargs)
            succeeded = True
            return result
        finally:
            this.finish(succeeded=succeeded)

    run._redislock_unique = opts  # type: ignore[attr-defined]
    return run


def unique_task(
    key: str | Callable[..., str],
    *,
    until: str = "finish",
    on_duplicate: str = "existing",
    ttl: float | None = None,
    lease: float | None = None,
    alias: str | None = None,
    keep_for: float | None = None,
) -> Callable[[_F], _F]:
    """Make a Django task unique by ``key`` while it is queued or running.

    Goes above ``@task``. ``key`` is a ``str.format`` template over the task's
    arguments (``"import:{feed_id}"``), checked now, or a callable returning
    the name. ``until``: ``"enqueue"``, ``"start"`` or ``"finish"`` (see the
    module docstring). ``on_duplicate``: ``"existing"`` returns the queued
    task's ``TaskResult`` (``TaskNotUnique`` when the backend cannot fetch
    it), ``"raise"`` raises ``TaskNotUnique``. ``ttl``: how long a task that
    never starts keeps the key (default ``REDISLOCK['UNIQUE_TTL']``, plus any
    ``run_after``); ``lease``: the running lease, renewed while the task runs
    (default ``REDISLOCK['TIMEOUT']``): a dead worker frees the key within it.
    ``keep_for``: seconds the key is kept after a successful run (at most one
    run per key in that time; a failed run lets it go at once).
    """

    def decorate(task: _F) -> _F:
        if django_task(task) is None:
            raise TypeError(
                "unique_task() goes above @task (django.tasks or the django_tasks backport), "
                f"got {task!r}; for Celery, use base=UniqueTask from "
                "django_redislock.contrib.celery_unique"
            )
        func = task.func  # type: ignore[attr-defined]
        label = f"{getattr(func, '__module__', '')}.{describe(func)}"
        opts = make_options(
            key,
            func,
            skip_first=task.takes_context,  # type: ignore[attr-defined]
            until=until,
            on_duplicate=on_duplicate,
            ttl=ttl,
            lease=lease,
            alias=alias,
            label=label,
            who="unique_task()",
            keep_for=keep_for,
        )
        declare(opts.metric_name, "lock")
        declare(opts.metric_name, "unique_task")
        fields = {f.name: getattr(task, f.name) for f in dataclasses.fields(task) if f.init}  # type: ignore[arg-type]
        fields["func"] = _runner(func, opts, task.takes_context)  # type: ignore[attr-defined]
        return _unique_class(type(task))(**fields)

    return decorate
