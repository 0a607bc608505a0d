"""A unique task's checked arguments, and the claim that travels with its message."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

from ..conf import conf
from ..core import LockError, check_seconds
from ..locking.naming import Namer

__all__ = [
    "DUPLICATE",
    "HEADER",
    "KWARG",
    "ON_DUPLICATE",
    "PREFIX",
    "UNTIL",
    "Claim",
    "TaskNotUnique",
    "UniqueOptions",
    "make_options",
]

logger = logging.getLogger("django_redislock.unique")

UNTIL = ("enqueue", "start", "finish")
ON_DUPLICATE = ("existing", "raise")
# Where the claim travels: a keyword argument of a Django task, a Celery header.
KWARG = "_redislock_unique"
HEADER = "redislock_unique"
# The header of a refused duplicate sent under an id its caller fixed (a
# canvas's frozen signature): the worker fails it with TaskNotUnique.
DUPLICATE = "redislock_duplicate"
# Lock names of unique tasks start with this, apart from redis_locked's: a
# task may be both unique and serialised by the same template.
PREFIX = "unique:"


class TaskNotUnique(LockError):
    """A task with the same unique key is already queued or running.

    ``name`` is the lock's name, ``task_id`` the existing task's id (None
    when its enqueuer had not written it in time, see ``claims.ID_WAIT``).
    """

    def __init__(self, name: str, task_id: str | None) -> None:
        self.name = name
        self.task_id = task_id
        # The arguments are what rebuilds it: Celery stores a task's exception
        # as its type and args (JSON) or pickles it, and a duplicate in a
        # canvas fails with this one.
        super().__init__(name, task_id)

    def __str__(self) -> str:
        held_by = f"task {self.task_id}" if self.task_id else "a task whose id is not known yet"
        return f"unique key {self.name!r} is held by {held_by}; not enqueued again"


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
    # Seconds the key is kept after a successful run (None: let go at once).
    keep_for: float | None = None

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
    keep_for: float | None = None,
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
            for name, value in (("ttl", ttl), ("lease", lease), ("keep_for", keep_for))
        }
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{who}: {exc}") from None
    if keep_for is not None and until == "enqueue":
        raise ValueError(
            f"{who}: keep_for keeps the key after a successful run, and with "
            "until='enqueue' the run does not hold it; use until='finish' or 'start'"
        )
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
        keep_for=checked["keep_for"],
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
    # The CACHES alias of the key's Redis, when not the default: a worker
    # that does not know the task can still let its key go.
    alias: str | None = None

    def payload(self) -> dict[str, Any]:
        # JSON-friendly and short: it is stored with every queued message.
        payload: dict[str, Any] = {
            "n": self.name,
            "t": self.token,
            "f": self.fence,
            "u": self.until,
            "l": self.lease,
            "p": self.ttl,
        }
        if self.alias is not None:
            payload["a"] = self.alias
        return payload

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
                alias=None if payload.get("a") is None else str(payload["a"]),
            )
        except (KeyError, TypeError, ValueError):
            logger.warning("ignoring a malformed unique-task claim %r", payload)
            return None
        if claim.until not in UNTIL:
            logger.warning("ignoring a unique-task claim with until=%r", claim.until)
            return None
        return claim
