"""Unique tasks kept in the process that enqueues them: the seam of the test kit.

``django_redislock.testing.local_unique_tasks`` turns ``here`` on for a
block. While it is on, a Celery ``UniqueTask`` is run at once in the thread
that enqueues it (as Celery's eager mode runs a task) rather than sent to a
broker, and every key a unique task takes in this process is written down,
so that the block can let go of those still held when it ends: a task that
never ran (a Django task on the dummy backend), a key kept after a
successful run (``keep_for``). Nothing else in the library reads it.
"""

from __future__ import annotations

import threading

from .options import Claim

__all__ = ["Here", "here"]


class Here:
    """Whether unique tasks run here, and the keys taken while they do."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._depth = 0
        self._claims: list[Claim] = []

    @property
    def active(self) -> bool:
        return self._depth > 0

    def start(self) -> None:
        with self._mutex:
            self._depth += 1

    def stop(self) -> list[Claim]:
        """Leave one block; the keys taken since the outermost began, when it ends."""
        with self._mutex:
            self._depth -= 1
            if self._depth:
                return []
            claims, self._claims = self._claims, []
            return claims

    def taken(self) -> list[Claim]:
        """The keys taken so far, forgotten here (the block goes on)."""
        with self._mutex:
            claims, self._claims = self._claims, []
            return claims

    def noted(self, claim: Claim) -> None:
        """A unique task took a key (its enqueuer did), in any thread."""
        if self._depth:
            with self._mutex:
                self._claims.append(claim)


here = Here()
