"""The process's one background thread for timed work: renewals and give-backs.

A job is a callable that does one step and returns the seconds until it wants
to run again, or None when it is done. Jobs run one at a time, in the order
they fall due, so each step must be short and bounded: a renewal or a
give-back attempt is one Redis call under the library's own socket timeout,
and reading a connection's late replies polls it briefly and comes back later.
A step that waits on a stalled Redis delays the others by at most that bound,
never indefinitely, and they take turns: a give-back that Redis keeps refusing
never holds up a renewal that falls due.

The thread is a daemon, started at the first job and kept for the life of the
process (an idle one sleeps on a condition). A forked child has none of its
parent's threads, and the parent's jobs use the parent's connections and
leases: it starts with an empty schedule and a thread of its own, on demand.

Nothing a job does stops the others. A job that raises is logged
(``django_redislock.scheduler``) and dropped, and the others go on; a failure
of the thread's own bookkeeping is logged and the loop goes on. Only what is
not an ``Exception`` (``SystemExit`` raised in a job, gevent's
``GreenletExit``) ends the thread, as it must: it is logged, and the next
``add`` starts a new thread, which runs every job still scheduled.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Hashable

from . import breaker

__all__ = ["Job", "Scheduler", "current"]

logger = logging.getLogger("django_redislock.scheduler")

# The longest the thread sleeps at once: ``threading`` refuses waits beyond
# its TIMEOUT_MAX (OverflowError), so a job due later is looked at again then.
_LONGEST_SLEEP = 3600.0

# One step; seconds until the next, or None when the job is done.
Job = Callable[[], "float | None"]


class Scheduler:
    """Runs jobs on one daemon thread, each when it falls due (monotonic clock).

    A job added with a ``key`` can be withdrawn with ``discard(key)``, and a
    new ``add`` under the same key replaces it: a lock stops or restarts its
    renewal this way. The withdrawn entry stays in the heap and is skipped when
    its time comes, so neither call wakes the thread.
    """

    def __init__(self, name: str = "redislock-scheduler") -> None:
        self.name = name
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Hashable | None, Job]] = []
        self._live: dict[Hashable, int] = {}  # key -> sequence number of its entry
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """Whether this process's thread is running."""
        return self._thread is not None and self._thread.is_alive()

    def add(self, job: Job, delay: float = 0.0, *, key: Hashable | None = None) -> None:
        """Run ``job`` in ``delay`` seconds, then whenever it asks to run again."""
        if not _is_delay(delay):
            raise ValueError(f"a job's delay must be a finite number of seconds; got {delay!r}")
        with self._cond:
            seq = next(self._seq)
            if key is not None:
                self._live[key] = seq
            heapq.heappush(self._heap, (time.monotonic() + delay, seq, key, job))
            if self._thread is None or not self._thread.is_alive():
                # The first job, or the thread ended (see the module's docstring).
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            if self._heap[0][1] == seq:
                # Due before whatever the thread sleeps until. Otherwise it
                # wakes in time by itself: waking it on every acquire would
                # take the GIL from the holder inside its critical section.
                self._cond.notify()

    def discard(self, key: Hashable) -> None:
        """Withdraw the job added under ``key``; a step under way finishes."""
        with self._cond:
            self._live.pop(key, None)

    def _is_live(self, seq: int, key: Hashable | None) -> bool:
        return key is None or self._live.get(key) == seq

    def _next(self) -> tuple[int, Hashable | None, Job]:
        """Wait for the next live job that falls due, and take it off the heap."""
        with self._cond:
            while True:
                while self._heap and not self._is_live(self._heap[0][1], self._heap[0][2]):
                    heapq.heappop(self._heap)  # withdrawn or replaced
                if not self._heap:
                    self._cond.wait()
                    continue
                delay = self._heap[0][0] - time.monotonic()
                if delay <= 0:
                    _, seq, key, job = heapq.heappop(self._heap)
                    return seq, key, job
                self._cond.wait(min(delay, _LONGEST_SLEEP))

    def _run(self) -> None:
        # Renewals and give-backs hold no request: never refused by a breaker.
        breaker.off_path()
        try:
            while True:
                try:
                    self._step()
                except Exception:  # never the thread's end: the other jobs go on
                    logger.exception("the background thread's bookkeeping failed; it goes on")
        except BaseException as exc:
            logger.error("the background thread ended (%r); the next job starts a new one", exc)
            raise

    def _step(self) -> None:
        """Run the next job that falls due, and schedule it again if it asks."""
        seq, key, job = self._next()
        try:
            again = job()
        except Exception:  # one job's bug must never stop the ones behind it
            logger.exception("a background job failed; it stops")
            again = None
        if again is not None and not _is_delay(again):
            logger.error("a background job asked to run again in %r s; it stops", again)
            again = None
        with self._cond:
            if not self._is_live(seq, key):
                return  # withdrawn (or replaced) while it ran
            if again is None:
                if key is not None:
                    del self._live[key]
            else:
                # Only this thread waits on the condition: no need to wake it.
                heapq.heappush(self._heap, (time.monotonic() + again, seq, key, job))


def _is_delay(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


_scheduler = Scheduler()


def current() -> Scheduler:
    """This process's scheduler (a forked child gets a new, empty one)."""
    return _scheduler


def _after_fork_in_child() -> None:
    global _scheduler
    _scheduler = Scheduler()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
