"""A watchdog thread that extends held leases until release, loss or a maximum hold.

One daemon thread per process serves every renewing ``Lock`` (asyncio locks
renew from a task of their own, see ``lock_async.py``). Each lock is renewed after a
third of its TTL, so two renewals can fail before the lease runs out. A lock
whose renewal finds the lease gone, or that cannot reach Redis before its
conservative validity ends, is marked lost and renewal stops: loss is reported,
never silent. A forked child renews nothing it inherited.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from typing import Protocol

from .green import RENEWAL_HINT, green_runtime, renewal_warning

__all__ = ["Renewable", "watchdog"]

logger = logging.getLogger("django_redislock.renew")


class Renewable(Protocol):
    def _renew_once(self) -> float | None:
        """Renew now; return seconds until the next renewal, or None to stop."""


class Watchdog:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Renewable]] = []
        self._active: dict[int, int] = {}  # id(lock) -> sequence number of its entry
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._runtime_checked = False

    def add(self, lock: Renewable, delay: float) -> None:
        if not self._runtime_checked and getattr(lock, "renew", False):
            # Once per process (a fork starts a new watchdog), at the first
            # renewing lock: gunicorn's and Celery's green workers patch before
            # they load the project, and show no system check (W004).
            self._runtime_checked = True
            _warn_if_green()
        with self._cond:
            seq = next(self._seq)
            self._active[id(lock)] = seq
            heapq.heappush(self._heap, (time.monotonic() + delay, seq, lock))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="redislock-renew", daemon=True
                )
                self._thread.start()
            if self._heap[0][1] == seq:
                # Due before whatever the thread sleeps until. Otherwise it
                # wakes in time by itself: waking it on every acquire would
                # take the GIL from the holder inside its critical section.
                self._cond.notify()

    def discard(self, lock: Renewable) -> None:
        with self._cond:
            self._active.pop(id(lock), None)

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    # Drop entries of locks that were discarded or rescheduled.
                    while self._heap and self._active.get(id(self._heap[0][2])) != self._heap[0][1]:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        self._cond.wait()
                        continue
                    due, seq, lock = self._heap[0]
                    delay = due - time.monotonic()
                    if delay <= 0:
                        heapq.heappop(self._heap)
                        break
                    self._cond.wait(delay)
            try:
                again = lock._renew_once()
            except Exception:
                logger.exception("renewal failed unexpectedly; it stops for this lock")
                again = None
            with self._cond:
                if self._active.get(id(lock)) != seq:
                    continue  # released (or re-added) while we were renewing
                if again is None:
                    del self._active[id(lock)]
                else:
                    heapq.heappush(self._heap, (time.monotonic() + again, seq, lock))


def _warn_if_green() -> None:
    runtime = green_runtime()
    if runtime is not None:
        logger.warning("%s %s (django_redislock.W004)", renewal_warning(runtime), RENEWAL_HINT)


watchdog = Watchdog()


def _after_fork_in_child() -> None:
    global watchdog
    watchdog = Watchdog()


os.register_at_fork(after_in_child=_after_fork_in_child)
