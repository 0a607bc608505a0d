"""Signals sent by locks, semaphores and the throttling middleware.

Every signal is sent with ``sender`` = the class of the object concerned and:

* ``lock_acquired``: ``name``, ``fence``, ``waited`` (seconds)
* ``lock_busy``: ``name``, ``waited``
* ``lock_released``: ``name``, ``fence``, ``held`` (seconds)
* ``lock_lost``: ``name``, ``fence``, ``reason``
* ``redis_unavailable``: ``name``, ``error``, ``fail_open`` (bool)
* ``request_throttled``: ``rule``, ``request``, ``status``
"""

from __future__ import annotations

from typing import Any

from django.dispatch import Signal

from .core.base import LockBase, Observer

__all__ = [
    "SignalObserver",
    "lock_acquired",
    "lock_busy",
    "lock_lost",
    "lock_released",
    "redis_unavailable",
    "request_throttled",
]

lock_acquired = Signal()
lock_busy = Signal()
lock_released = Signal()
lock_lost = Signal()
redis_unavailable = Signal()
request_throttled = Signal()


class SignalObserver(Observer):
    """Logs as the core does, then sends the Django signal."""

    def acquired(self, lock: LockBase, waited: float) -> None:
        super().acquired(lock, waited)
        lock_acquired.send(type(lock), name=lock.name, fence=lock.fence, waited=waited, lock=lock)

    def busy(self, lock: LockBase, waited: float) -> None:
        super().busy(lock, waited)
        lock_busy.send(type(lock), name=lock.name, waited=waited, lock=lock)

    def released(self, lock: LockBase, held: float) -> None:
        super().released(lock, held)
        lock_released.send(type(lock), name=lock.name, fence=lock.fence, held=held, lock=lock)

    def lost(self, lock: LockBase, reason: str) -> None:
        super().lost(lock, reason)
        lock_lost.send(type(lock), name=lock.name, fence=lock.fence, reason=reason, lock=lock)


observer = SignalObserver()


def send_unavailable(sender: Any, name: str, error: BaseException, fail_open: bool) -> None:
    redis_unavailable.send(sender, name=name, error=error, fail_open=fail_open)
