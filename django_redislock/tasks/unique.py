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

A duplicate gets the existing task's result handle (``on_duplicate="existing"``)
or ``TaskNotUnique`` (``"raise"``; also when the existing task cannot be
fetched); either way ``task_duplicate`` is sent and the refusal is logged
under ``django_redislock.unique``. Never a silent drop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction, sync_to_async
from redis.exceptions import RedisError

from ..conf import conf
from ..core import scripts
from ..core.base import check_seconds
from ..core.exceptions import LockError, RedisUnavailable
from ..core.lock import Lock
from ..core.lock_async import AsyncLock
from ..locking.factories import get_async_lock, get_lock
from ..locking.naming import Namer, describe
from ..locking.options import django_task
from ..signals import send_task_duplicate

__all__ = ["HEADER", "KWARG", "TaskNotUnique", "UniqueOptions", "unique_task"]

logger = logging.getLogger("django_redislock.unique")

UNTIL = ("enqueue", "start", "finish")
ON_DUPLICATE = ("existing", "raise")
# Where the claim travels: a keyword argument of a Django task, a Celery header.
KWARG = "_redislock_unique"
HEADER = "redislock_unique"
# Lock names of unique tasks start with this, apart from redis_locked's: a
# task may be both unique and serialised by the same template.
PREFIX = "unique:"
# How long a duplicate waits for the first enqueuer to write its task id: the
# id is written one round trip after the key is taken (Celery) or once the
# backend has queued the task (Django), so it is normally there at once.
ID_WAIT = 1.0

_F = TypeVar("_F")

# Write the task id and the owner into a lease, if our token still holds it
# (the header of the script says more). Repeatable: it writes the same again.
_NOTE = scripts.load("unique_note", prelude=None, repeatable=True)


class TaskNotUnique(LockError):
    """A task with the same unique key is already queued or running.

    ``name`` is the lock's name, ``task_id`` the existing task's id (None
    when its enqueuer had not written it in time, see ``ID_WAIT``).
    """

    def __init__(self, name: str, task_id: str | None) -> None:
        self.name = name
        self.task_id = task_id
        held_by = f"task {task_id}" if task_id else "a task whose id is not known yet"
        super().__init__(f"unique key {name!r} is held by {held_by}; not enqueued again")


# -- options --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class UniqueOptions:
    """The checked arguments of one unique task."""

    namer: Namer
    until: str
    on_duplicate: str
    ttl: float | None
    lease: float | None
    alias: str | None
    label: str

    @property
    def pending_ttl(self) -> float:
        return conf.UNIQUE_TTL if self.ttl is None else self.ttl

    @property
    def run_lease(self) -> float:
        return conf.TIMEOUT if self.lease is None else self.lease

    def lock_name(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        name = self.namer(args, kwargs)
        if not isinstance(name, str):
            raise TypeError(
                f"the unique key callable of {self.namer.where} returned several names "
                f"({', '.join(name)}); a unique task has one key: return one str"
            )
        return PREFIX + name

    @property
    def metric_name(self) -> str:
        """What metrics call these locks: the template, never a filled-in name."""
        key = self.namer.key
        return PREFIX + (key if isinstance(key, str) else self.label)


def _fail(exc: Exception, who: str) -> Exception:
    # naming.py speaks for redis_locked(); say whose key it is.
    return type(exc)(str(exc).replace("redis_locked():", f"{who}:"))


def _without_first(func: Callable[..., Any]) -> Callable[..., Any]:
    """A stand-in with ``func``'s signature less its first parameter (the
    ``context`` of a Django task, the ``self`` of a bound Celery task)."""
    signature = inspect.signature(func)

    @functools.wraps(func)
    def stand_in(*args: Any, **kwargs: Any) -> Any:  # never called
        raise AssertionError

    stand_in.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=list(signature.parameters.values())[1:]
    )
    return stand_in


def make_options(
    key: str | Callable[..., str],
    func: Callable[..., Any],
    *,
    skip_first: bool,
    until: str,
    on_duplicate: str,
    ttl: float | None,
    lease: float | None,
    alias: str | None,
    label: str,
    who: str,
) -> UniqueOptions:
    """Check every argument now (at import), with errors that name the fix."""
    if not (isinstance(key, str) and key) and not callable(key):
        raise TypeError(
            f"{who}: the key must be a non-empty str.format template such as "
            f"'import:{{feed_id}}', or a callable returning the name; got {key!r}"
        )
    if until not in UNTIL:
        raise ValueError(
            f"{who}: until must be one of {', '.join(map(repr, UNTIL))}; got {until!r}"
        )
    if on_duplicate not in ON_DUPLICATE:
        raise ValueError(
            f"{who}: on_duplicate must be one of {', '.join(map(repr, ON_DUPLICATE))}; "
            f"got {on_duplicate!r}"
        )
    try:
        checked = {
            name: None if value is None else check_seconds(name, value, allow_zero=False)
            for name, value in (("ttl", ttl), ("lease", lease))
        }
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{who}: {exc}") from None
    if alias is not None and not isinstance(alias, str):
        raise TypeError(f"{who}: alias must be a CACHES alias (str) or None; got {alias!r}")
    target = _without_first(func) if skip_first else func
    try:
        namer = Namer(key, target)
    except (TypeError, ValueError) as exc:
        raise _fail(exc, who) from None
    return UniqueOptions(
        namer=namer,
        until=until,
        on_duplicate=on_duplicate,
        ttl=checked["ttl"],
        lease=checked["lease"],
        alias=alias,
        label=label,
    )


# -- the claim that travels with the task ---------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Claim:
    """What a worker needs to adopt the key: it travels in the task's message."""

    name: str
    token: str
    fence: int
    until: str
    lease: float
    ttl: float

    def payload(self) -> dict[str, Any]:
        # JSON-friendly and short: it is stored with every queued message.
        return {
            "n": self.name,
            "t": self.token,
            "f": self.fence,
            "u": self.until,
            "l": self.lease,
            "p": self.ttl,
        }

    @classmethod
    def from_payload(cls, payload: Any) -> Claim | None:
        try:
            claim = cls(
                name=str(payload["n"]),
                token=str(payload["t"]),
                fence=int(payload["f"]),
                until=str(payload["u"]),
                lease=float(payload["l"]),
                ttl=float(payload["p"]),
            )
        except (KeyError, TypeError, ValueError):
            logger.warning("ignoring a malformed unique-task claim %r", payload)
            return None
        if claim.until not in UNTIL:
            logger.warning("ignoring a unique-task claim with until=%r", claim.until)
            return None
        return claim


# -- the enqueuer's side --------------------------------------------------------------------
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


def _note(lock: Lock, token: str, task_id: str | None, owner: str = "") -> None:
    """Write the task id beside the token, for duplicates to find, and the
    owner (a worker that adopted the lease) for operators."""
    try:
        scripts.run(lock.client, _NOTE, (lock.keys.lease,), (token, task_id or "", owner))
    except RedisUnavailable as exc:
        _not_noted(lock.name, task_id, exc)


async def _note_async(lock: AsyncLock, token: str, task_id: str | None, owner: str = "") -> None:
    """``_note`` for the asyncio driver."""
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
            if task_id is not None:
                _note(lock, lock.token, task_id)
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


def give_up(lock: Lock) -> None:
    """The enqueue failed after the key was taken: let the key go at once."""
    try:
        lock.release()
    except (LockError, RedisUnavailable) as exc:
        logger.warning("could not free unique key %r after a failed enqueue: %s", lock.name, exc)


def drop(lock: Lock, token: str, task_id: str | None) -> None:
    """The task is queued: record its id and leave the lease to it.

    The enqueuer's handle is dropped as it is: it does not renew, and nothing
    releases a handle that is dropped, so the lease is the task's now.
    """
    if task_id is not None:
        _note(lock, token, task_id)


# -- the worker's side --------------------------------------------------------------------
class Run:
    """One run of a unique task in a worker: adopt the key, then let it go.

    The decisions and messages live here; ``start``/``finish`` are the sync
    driver, ``start_async``/``finish_async`` the asyncio one (an ``async def`` task).
    """

    def __init__(self, claim: Claim, opts: UniqueOptions | None, label: str) -> None:
        self.claim = claim
        self.alias = opts.alias if opts is not None else None
        self.metric_name = opts.metric_name if opts is not None else None
        self.label = label
        self.lock: Lock | None = None
        self.alock: AsyncLock | None = None
        # Seconds until the retry this run sent may run; None: none was sent.
        self.retry_in: float | None = None

    def retrying(self, delay: float) -> None:
        """This run sent its own retry (the same task id and claim), to run in
        ``delay`` seconds: the key goes with it, however the run then ends."""
        self.retry_in = delay if self.retry_in is None else max(self.retry_in, delay)

    def _lock_kwargs(self) -> dict[str, Any]:
        return {
            "timeout": self.claim.lease,
            "wait": 0,
            "renew": True,
            # However long the run: a worker that dies stops renewing.
            "renew_max": None,
            "alias": self.alias,
            "label": self.label,
            "metric_name": self.metric_name,
        }

    def _unreachable(self, exc: BaseException) -> None:
        logger.warning(
            "could not adopt unique key %r for %s (%s); running without it; its lease "
            "runs out by itself",
            self.claim.name,
            self.label,
            exc,
        )

    def _not_adopted(self) -> None:
        logger.warning(
            "unique key %r of %s was no longer held by this task (it waited longer than "
            "its ttl, or was force-released); running without it",
            self.claim.name,
            self.label,
        )

    def _hands_on(self, retry_in: float | None) -> float | None:
        """The lease for the retry to adopt, or None to release now.

        A retry is known by the message this run sent (``retrying``: a
        ``self.retry(throw=False)`` returns normally) or by the ``Retry`` it
        raised (an eager retry sends no message)."""
        delays = [d for d in (retry_in, self.retry_in) if d is not None]
        if delays and self.claim.until == "finish":
            return self.claim.ttl + max(delays)
        return None

    def _not_handed(self, exc: BaseException) -> None:
        logger.warning(
            "could not hand unique key %r to the retry of %s: %s",
            self.claim.name,
            self.label,
            exc,
        )

    def _not_released(self, exc: BaseException) -> None:
        # A loss was reported already (lock_lost); Redis down: it runs out.
        logger.warning(
            "could not release unique key %r of %s: %s", self.claim.name, self.label, exc
        )

    # -- sync ---------------------------------------------------------------------------
    def start(self, task_id: str | None = None) -> bool:
        """Adopt the key; False when this task no longer holds it (the run
        goes on without it: unique is a guard, not exactly-once)."""
        claim = self.claim
        lock = get_lock(claim.name, **self._lock_kwargs())
        try:
            adopted = lock.adopt(claim.token, claim.fence, ttl=claim.lease)
        except RedisUnavailable as exc:
            self._unreachable(exc)
            return False
        if not adopted:
            self._not_adopted()
            return False
        if claim.until == "enqueue":
            self._release(lock)
            return True
        # From now on operators see this worker, not the enqueuer, as the holder.
        _note(lock, claim.token, task_id, lock.owner_metadata(threading.current_thread().name))
        self.lock = lock
        return True

    def finish(self, retry_in: float | None = None) -> None:
        """The run ended; ``retry_in``: it asked for a retry in that many seconds."""
        lock, self.lock = self.lock, None
        if lock is None:
            return
        handed = self._hands_on(retry_in)
        if handed is None:
            self._release(lock)
            return
        # The retry carries the same claim and adopts the key in turn.
        try:
            lock.detach(ttl=handed)
        except (LockError, RedisUnavailable) as exc:
            self._not_handed(exc)

    def _release(self, lock: Lock) -> None:
        try:
            lock.release()
        except (LockError, RedisUnavailable) as exc:
            self._not_released(exc)

    # -- asyncio ------------------------------------------------------------------------
    async def start_async(self, task_id: str | None = None) -> bool:
        """``start`` for a coroutine task, on its event loop."""
        claim = self.claim
        lock = get_async_lock(claim.name, **self._lock_kwargs())
        try:
            adopted = await lock.adopt(claim.token, claim.fence, ttl=claim.lease)
        except RedisUnavailable as exc:
            self._unreachable(exc)
            return False
        if not adopted:
            self._not_adopted()
            return False
        if claim.until == "enqueue":
            await self._release_async(lock)
            return True
        current = asyncio.current_task()
        who = current.get_name() if current is not None else "?"
        await _note_async(lock, claim.token, task_id, lock.owner_metadata(who))
        self.alock = lock
        return True

    async def finish_async(self, retry_in: float | None = None) -> None:
        """``finish`` for a coroutine task."""
        lock, self.alock = self.alock, None
        if lock is None:
            return
        handed = self._hands_on(retry_in)
        if handed is None:
            await self._release_async(lock)
            return
        try:
            await lock.detach(ttl=handed)
        except (LockError, RedisUnavailable) as exc:
            self._not_handed(exc)

    async def _release_async(self, lock: AsyncLock) -> None:
        try:
            await lock.release()
        except (LockError, RedisUnavailable) as exc:
            self._not_released(exc)


# -- Django tasks -------------------------------------------------------------------------
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
            try:
                return await func(*args, **kwargs)
            finally:
                await this.finish_async()

        arun._redislock_unique = opts  # type: ignore[attr-defined]
        return arun

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        this, task_id = claimed(args, kwargs)
        if this is None:
            return func(*args, **kwargs)
        this.start(task_id)
        try:
            return func(*args, **kwargs)
        finally:
            this.finish()

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
        )
        fields = {f.name: getattr(task, f.name) for f in dataclasses.fields(task) if f.init}  # type: ignore[arg-type]
        fields["func"] = _runner(func, opts, task.takes_context)  # type: ignore[attr-defined]
        return _unique_class(type(task))(**fields)

    return decorate
