"""The process's background thread survives its jobs: renewals go on whatever one job does.

Each test runs a real renewing ``Lock`` with a one-second lease on a scheduler
of its own (the process's watchdog pointed at it), next to a job that
misbehaves: it asks for a turn further off than ``threading`` can wait, it
raises, or it ends the thread. The lease must be renewed past its TTL while
the holder works, so that nobody else can take the name. Every wait is on an
event the code under test sets, bounded only to fail instead of hanging.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_redislock.core import Lock
from django_redislock.core.io import background
from django_redislock.core.io.background import Scheduler

BOUND = 30.0  # seconds; only ever reached when the test fails


class _Watched(threading.Condition):
    """The scheduler's condition, telling when its thread sleeps for long."""

    def __init__(self) -> None:
        super().__init__()
        self.long_sleep = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None and timeout > 60:
            self.long_sleep.set()
        return super().wait(timeout)


class Renewing(Lock):
    """A renewing lock that counts its renewals (``renewed``, one per renewal)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, renew=True, **kwargs)
        self.renewed = threading.Semaphore(0)

    def _renew_once(self) -> float | None:
        try:
            return super()._renew_once()
        finally:
            self.renewed.release()


@pytest.fixture
def scheduler(monkeypatch: pytest.MonkeyPatch) -> Iterator[Scheduler]:
    on = Scheduler(name="redislock-scheduler-test")
    on._cond = _Watched()
    monkeypatch.setattr(background, "watchdog", background.Watchdog(on))
    yield on


def _outlives_its_lease(r: redis.Redis, name: str) -> None:
    """A lock with a 1 s lease, renewed three times (past its TTL) while held."""
    lock = Renewing(r, name, ttl=1, wait=0)
    assert lock.acquire()
    try:
        for _ in range(4):  # each a third of the TTL: past the first lease's end
            assert lock.renewed.acquire(timeout=BOUND), "the lease was not renewed"
        assert lock.held and lock.owned()
        assert not Lock(r, name, ttl=1, wait=0).acquire()
    finally:
        lock.release()


def test_a_job_due_beyond_what_threading_waits_does_not_stop_renewals(
    scheduler: Scheduler, r: redis.Redis
) -> None:
    # A renewal of a lease of 3e10 s asks to run again in 1e10 s, more than
    # threading.TIMEOUT_MAX: the thread must not die of the wait.
    asked = threading.Event()

    def far() -> float:
        asked.set()
        return 1e10

    scheduler.add(far)
    assert asked.wait(BOUND)
    assert scheduler._cond.long_sleep.wait(BOUND)  # type: ignore[attr-defined]
    _outlives_its_lease(r, "far-neighbour")
    assert scheduler.running


def test_a_job_that_raises_is_dropped_and_logged_and_the_others_go_on(
    scheduler: Scheduler, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    failed = threading.Event()
    runs: list[int] = []

    def broken() -> float:
        runs.append(1)
        failed.set()
        raise RuntimeError("a job's bug")

    with caplog.at_level(logging.ERROR, logger="django_redislock.scheduler"):
        scheduler.add(broken)
        assert failed.wait(BOUND)
        _outlives_its_lease(r, "broken-neighbour")
    assert runs == [1]  # dropped: never run again
    assert [rec.name for rec in caplog.records] == ["django_redislock.scheduler"]
    assert "a job's bug" in caplog.text


# The thread's end is the point: pytest reports any exception that ends a thread.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_thread_ended_by_a_job_is_replaced_at_the_next_one(
    scheduler: Scheduler, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # SystemExit is not caught (it would be an interrupt held back): it ends
    # the thread, which says so, and the next job starts a new one.
    def leaving() -> float:
        raise SystemExit("a job that ends its thread")

    with caplog.at_level(logging.ERROR, logger="django_redislock.scheduler"):
        scheduler.add(leaving)
        first = scheduler._thread
        assert first is not None
        first.join(BOUND)
        assert not first.is_alive() and not scheduler.running
        _outlives_its_lease(r, "after-the-end")
    assert scheduler._thread is not first
    assert "the background thread ended" in caplog.text
