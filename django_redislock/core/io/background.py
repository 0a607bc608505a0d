"""The process's background work: one thread for timed jobs, lease renewal on it,
and whether green threads run it.

**The thread.** A job is a callable that does one step and returns the seconds
until it wants to run again, or None when it is done. Jobs run one at a time,
in the order they fall due, so each step must be short and bounded: a renewal
or a give-back attempt is one Redis call under the library's own socket
timeout, and reading a connection's late replies polls it briefly and comes
back later. A step that waits on a stalled Redis delays the others by at most
that bound, never indefinitely, and they take turns: a give-back that Redis
keeps refusing never holds up a renewal that falls due.

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

**Renewal** extends held leases until release, loss or a maximum hold. Every
renewing ``Lock`` of the process is renewed from this thread (``watchdog``);
asyncio locks renew from a task of their own, see ``lock_async.py``. Each
lock is renewed after a third of its TTL, so two renewals can fail before the
lease runs out. A lock whose renewal finds the lease gone, or that cannot
reach Redis before its conservative validity ends, is marked lost and renewal
stops: loss is reported, never silent. A forked child renews nothing it
inherited.

**Green threads** (gevent or eventlet monkey patching): the thread is then a
greenlet, and the renewals and give-backs run only when the code holding a
lock yields to the hub (a patched socket, ``time.sleep``). A CPU-bound
stretch, or a database driver that blocks the process, keeps them from
running, and a renewed lease can run out mid-call. docs/servers.rst says what
holds under each server model. Neither library is imported here: one that is
not imported yet has patched nothing.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Hashable
from typing import Protocol

from . import breaker

__all__ = [
    "RENEWAL_HINT",
    "Job",
    "Renewable",
    "Scheduler",
    "Watchdog",
    "current",
    "green_runtime",
    "renewal_warning",
    "watchdog",
]

logger = logging.getLogger("django_redislock.scheduler")
log_renew = logging.getLogger("django_redislock.renew")

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


def _new_scheduler_after_fork() -> None:
    global _scheduler
    _scheduler = Scheduler()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_scheduler_after_fork)


# -- green threads ----------------------------------------------------------


def green_runtime() -> str | None:
    """``"gevent"`` or ``"eventlet"`` if it has monkey-patched ``threading``, else None."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        return "gevent"
    patcher = sys.modules.get("eventlet.patcher")
    # eventlet names the threading patch "thread".
    if patcher is not None and patcher.is_monkey_patched("thread"):
        return "eventlet"
    return None


# The system check (django_redislock.W004) and the log at the first renewal say this.
def renewal_warning(runtime: str) -> str:
    """What to tell a user who renews leases under ``runtime``."""
    return (
        f"Lease renewal runs on {runtime} green threads in this process (threading is "
        "monkey-patched): a renewal runs only while the code holding the lock yields to the "
        "hub. A CPU-bound stretch, or a database driver that blocks the process (psycopg2 "
        "without psycogreen, psycopg 3 under eventlet), longer than the lease lets the lease "
        "run out while the holder works, and another request take the lock."
    )


RENEWAL_HINT = (
    "Use a cooperative database driver, keep CPU-bound work out of locked code (or give "
    "the lock a TIMEOUT longer than it), and write under the lock with fencing tokens "
    "(fenced_update), which refuse a holder whose lease ran out. See 'Server models' in "
    "docs/servers.rst."
)


# -- renewal ----------------------------------------------------------------


class Renewable(Protocol):
    def _renew_once(self) -> float | None:
        """Renew now; return seconds until the next renewal, or None to stop."""


class Watchdog:
    """Adds renewals to a scheduler (by default the process's) and withdraws them."""

    def __init__(self, on: Scheduler | None = None) -> None:
        self._on = on
        self._runtime_checked = False

    @property
    def scheduler(self) -> Scheduler:
        return self._on if self._on is not None else current()

    def add(self, lock: Renewable, delay: float) -> None:
        if not self._runtime_checked and getattr(lock, "renew", False):
            # Once per process (a fork starts a new watchdog), at the first
            # renewing lock: gunicorn's and Celery's green workers patch before
            # they load the project, and show no system check (W004).
            self._runtime_checked = True
            _warn_if_green()
        self.scheduler.add(_renewal_of(lock), delay, key=_key(lock))

    def discard(self, lock: Renewable) -> None:
        self.scheduler.discard(_key(lock))


def _key(lock: Renewable) -> tuple[str, int]:
    return ("renew", id(lock))


def _renewal_of(lock: Renewable) -> Callable[[], float | None]:
    def renew() -> float | None:
        try:
            return lock._renew_once()
        except Exception:
            log_renew.exception("renewal failed unexpectedly; it stops for this lock")
            return None

    return renew


def _warn_if_green() -> None:
    runtime = green_runtime()
    if runtime is not None:
        log_renew.warning("%s %s (django_redislock.W004)", renewal_warning(runtime), RENEWAL_HINT)


watchdog = Watchdog()


def _new_watchdog_after_fork() -> None:
    global watchdog
    watchdog = Watchdog()


os.register_at_fork(after_in_child=_new_watchdog_after_fork)
