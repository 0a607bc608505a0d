"""Renewal: extend held leases until release, loss or a maximum hold.

Every renewing ``Lock`` of the process is renewed from the process's one
background thread (``scheduler.py``); asyncio locks renew from a task of their
own, see ``lock_async.py``. Each lock is renewed after a third of its TTL, so
two renewals can fail before the lease runs out. A lock whose renewal finds the
lease gone, or that cannot reach Redis before its conservative validity ends,
is marked lost and renewal stops: loss is reported, never silent. A forked
child renews nothing it inherited.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Protocol

from . import scheduler
from .green import RENEWAL_HINT, green_runtime, renewal_warning

__all__ = ["Renewable", "Watchdog", "watchdog"]

logger = logging.getLogger("django_redislock.renew")


class Renewable(Protocol):
    def _renew_once(self) -> float | None:
        """Renew now; return seconds until the next renewal, or None to stop."""


class Watchdog:
    """Adds renewals to a scheduler (by default the process's) and withdraws them."""

    def __init__(self, on: scheduler.Scheduler | None = None) -> None:
        self._on = on
        self._runtime_checked = False

    @property
    def scheduler(self) -> scheduler.Scheduler:
        return self._on if self._on is not None else scheduler.current()

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
            logger.exception("renewal failed unexpectedly; it stops for this lock")
            return None

    return renew


def _warn_if_green() -> None:
    runtime = green_runtime()
    if runtime is not None:
        logger.warning("%s %s (django_redislock.W004)", renewal_warning(runtime), RENEWAL_HINT)


watchdog = Watchdog()


def _after_fork_in_child() -> None:
    global watchdog
    watchdog = Watchdog()


os.register_at_fork(after_in_child=_after_fork_in_child)
