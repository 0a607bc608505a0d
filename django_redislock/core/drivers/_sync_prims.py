"""The sync side of what the drivers wait, hold and cancel with.

The twin of ``_async_prims.py``, name for name: the generated sync drivers
(``lock.py``, ``semaphore.py``, ``rwlock.py``, ``multi.py``) import these
where their asyncio source imports those. A thread cannot be cancelled, so
the cancellation helpers here do nothing and their exceptions are never
raised: the generated code keeps the asyncio driver's shape at no cost.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, TypeAlias, TypeVar

from ..io import background
from ..io.aio_calls import CLEANUP_TIMEOUT as CLEANUP_TIMEOUT
from ..io.interrupts import CallTimeout as CallTimeout
from ..io.interrupts import Cancelled as Cancelled

# The names are ``_async_prims.__all__``: the generated drivers import them
# from here where their source imports them from there, and mypy checks both.

T = TypeVar("T")

# What holds a handle, in messages ("acquired by another thread").
HOLDER_KIND = "thread"
Holder: TypeAlias = int
Renewer: TypeAlias = bool


def pause(seconds: float) -> None:
    """Wait ``seconds`` before trying again (the thread sleeps)."""
    time.sleep(seconds)


def current_holder() -> Holder | None:
    """Who may release what it acquires: the running thread."""
    return threading.get_ident()


def current_name() -> str:
    """The running thread's name, for the owner metadata."""
    return threading.current_thread().name


def cancel_requests() -> int:
    return 0


def raise_if_cancelled_since(count: int) -> None:
    """Nothing to raise: a thread's call cannot swallow a cancellation."""


def keep_cancellation(value: T) -> T:
    return value


def complete(value: T, timeout: float) -> T:
    """The call already ran to its end: a thread is not cut short."""
    return value


class Gate:
    """One holder of a handle at a time: a ``threading.Lock``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def acquire(self, timeout: float) -> bool:
        """Take the gate, waiting up to ``timeout`` seconds (0: only if free)."""
        # Almost always free: try it before paying for a timed wait.
        return self._lock.acquire(False) or (timeout > 0 and self._lock.acquire(timeout=timeout))

    def release(self) -> None:
        self._lock.release()


class Renewing(Protocol):
    def _renew_once(self) -> float | None:
        """Renew now; return seconds until the next renewal, or None to stop."""


def start_renewal(handle: Renewing, delay: float) -> Renewer:
    """Renew ``handle`` after ``delay`` seconds, and then as it says: on the
    process's background thread (``background.py``)."""
    background.watchdog.add(handle, delay)
    return True


def stop_renewal(handle: Renewing, renewer: Renewer | None) -> None:
    if renewer:
        background.watchdog.discard(handle)
