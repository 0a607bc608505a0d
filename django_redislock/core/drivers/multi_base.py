"""Several names, taken all together or not at all (``MultiLock``, ``AsyncMultiLock``).

A cart locks every product in it. Taking names one by one, each with a
wait, while holding the ones before deadlocks as soon as two callers list
the same names in different orders (A then B against B then A). A
``MultiLock`` never waits while it holds anything:

* it tries every name once without waiting, in one fixed order (sorted);
* at the first busy name it gives back what it took, then waits in that
  name's queue, holding nothing else; the engine hands it that name in turn;
* holding that one name, it tries the others again without waiting, and
  starts over from the next busy name if there is one.

So all names are held or none, no set of callers can deadlock whatever order
they list names in, and each name's queue stays first come first served.
What it does not promise is order across names: a caller gives its turn on
one name back when another of its names is busy, so while its other names
stay busy it can use up its whole ``wait`` where a caller of one name would
have had its turn.

Each name keeps its own lease, fence, renewal and Cluster slot: uncontended,
taking k names costs k round trips, the same as k single locks. The waits,
give-backs and lost-reply handling are the single lock's own.

This module holds what both drivers share, ``MultiBase``: the names, their
handles and what is read off them. The algorithm is written once, for
asyncio, in ``multi_async.py``; ``multi.py`` is generated from it
(``tools/gen_sync.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from ..clients import AnyRedisClient
from ..validate import check_seconds
from .base import DEFAULT_OBSERVER, LockBase, Observer

__all__ = ["MultiBase", "lock_names"]

_L = TypeVar("_L", bound=LockBase)


def lock_names(names: Iterable[str]) -> tuple[str, ...]:
    """The distinct names of ``names``, in the order every caller takes them."""
    if isinstance(names, (str, bytes)):
        raise TypeError(
            f"a MultiLock takes an iterable of names, got the single name {names!r}: "
            "use Lock for one name, or wrap it in a list"
        )
    unique: set[str] = set()
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"lock names must be str, got {type(name).__name__}: {name!r}")
        if not name:
            raise ValueError("lock names must not be empty, got ''")
        unique.add(name)
    if not unique:
        raise ValueError("a MultiLock needs at least one name, got none")
    return tuple(sorted(unique))


class _LossOnly(Observer):
    """The observer of the names inside a ``MultiLock``: tries and give-backs
    are the multi-lock's business, reported once it holds every name or stays
    busy; a loss is reported as it happens."""

    def __init__(self, outer: Observer) -> None:
        self.outer = outer

    def acquired(self, lock: LockBase, waited: float) -> None:
        pass

    def busy(self, lock: LockBase, waited: float) -> None:
        pass

    def released(self, lock: LockBase, held: float) -> None:
        pass

    def lost(self, lock: LockBase, reason: str) -> None:
        self.outer.lost(lock, reason)


class MultiBase(Generic[_L]):
    """The names, their handles and what is read off them, for both drivers."""

    _handle: Callable[..., _L]

    def __init__(
        self,
        # The kind its handles take (``_handle``): sync, or asyncio.
        client: AnyRedisClient,
        names: Iterable[str],
        *,
        wait: float = 10.0,
        observer: Observer | None = None,
        metric_name: str | None = None,
        **options: Any,
    ) -> None:
        self.names = lock_names(names)
        self.wait = check_seconds("wait", wait, allow_zero=True)
        self.observer = observer if observer is not None else DEFAULT_OBSERVER
        self.metric_name = metric_name
        inner = _LossOnly(self.observer)
        self.locks: dict[str, _L] = {}
        for name in self.names:
            lock = self._handle(client, name, wait=wait, observer=inner, **options)
            lock.metric_name = metric_name
            self.locks[name] = lock
        first = self.locks[self.names[0]]
        self.ttl = first.ttl
        self.client = client
        # Set when an acquire gives up: the busy name's hint, in seconds.
        self.retry_after: float | None = None
        self._acquired_at = 0.0

    @property
    def name(self) -> str:
        """All names, for messages: ``"a, b, c"``."""
        return ", ".join(self.names)

    def __repr__(self) -> str:
        state = "held" if self.held else "free"
        return f"<{type(self).__name__} {list(self.names)!r} {state}>"

    def __iter__(self) -> Iterator[_L]:
        return iter(self.locks.values())

    @property
    def token(self) -> str | None:
        """The names' tokens, comma-separated, while any is held; else None."""
        tokens = [lock.token for lock in self.locks.values() if lock.token is not None]
        return ",".join(tokens) if tokens else None

    @property
    def held(self) -> bool:
        """True while every name is held and none is known lost."""
        return all(lock.held for lock in self.locks.values())

    @property
    def lost(self) -> bool:
        """True once any of the names was lost."""
        return any(lock.lost for lock in self.locks.values())

    @property
    def remaining(self) -> float:
        """Seconds the shortest of the leases has left (0 when not held)."""
        return min(lock.remaining for lock in self.locks.values())

    @property
    def fences(self) -> dict[str, int | None]:
        """Each name's fencing token (None for a name not held)."""
        return {name: lock.fence for name, lock in self.locks.items()}

    @property
    def fence(self) -> None:
        """A multi-lock has a fence per name: ``fence_of(name)``, ``fences``."""
        return None

    def fence_of(self, name: str) -> int | None:
        """The fencing token of ``name``; a name not in the lock is a KeyError."""
        try:
            return self.locks[name].fence
        except KeyError:
            raise KeyError(
                f"{name!r} is not one of this lock's names ({self.name}); "
                "pass one of them to fence_of()"
            ) from None

    def _wait_s(self, wait: float | None) -> float:
        return self.wait if wait is None else check_seconds("wait", wait, allow_zero=True)

    def _taken(self, started: float) -> None:
        self._acquired_at = time.monotonic()
        waited = self._acquired_at - started
        for lock in self.locks.values():
            self.observer.acquired(lock, waited)

    def _stayed_busy(self, busy: _L, started: float) -> None:
        self.retry_after = getattr(busy, "retry_after", None)
        waited = time.monotonic() - started
        # Once per name, as an acquire and a release are: a lock on several
        # names counts once per name in every metric.
        for lock in self.locks.values():
            self.observer.busy(lock, waited)

    def _released(self, lock: _L) -> None:
        self.observer.released(lock, time.monotonic() - self._acquired_at)
