"""Signals sent by locks, semaphores and the throttling middleware.

Every signal is sent with ``sender`` = the class of the object concerned and:

* ``lock_acquired``: ``name``, ``fence``, ``waited`` (seconds)
* ``lock_busy``: ``name``, ``waited``
* ``lock_released``: ``name``, ``fence``, ``held`` (seconds)
* ``lock_lost``: ``name``, ``fence``, ``reason``, and why and how
  (``core/engine/loss.py``): ``cause`` (``expired``, ``force_released``,
  ``redis_lost``), ``held`` and ``ttl`` (seconds), ``owner``, ``label``,
  ``template`` and ``forced_by`` (who force-released it, or None)
* ``redis_unavailable``: ``name``, ``error``, ``fail_open`` (bool), ``lock`` (the
  handle whose acquire failed, or None when there was none yet)
* ``request_throttled``: ``rule``, ``request``, ``status``
* ``task_duplicate``: ``name`` (the unique key's lock name), ``task`` (the task
  whose enqueue was refused), ``task_id`` (the existing task's id, or None),
  ``on_duplicate``; the sender is the task's class

Metrics backends (``ops/metrics.py``) hear the same events as *sinks*, called
directly before each signal is sent: the dispatch of a Django signal would
cost a locked request more than the counting does. With no backend on, the
list of sinks is empty.

What the library will count is also *declared* here, before anything is
counted (``declare``): a decorator's template at import, a throttling rule,
a unique task. A backend makes every series of a declared name at 0, so the
first loss or outage after a deploy moves a counter that already exists (an
alert on ``increase()`` sees it). Declaring touches no network.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

from .core import LockBase, Observer

__all__ = [
    "KEY_FAMILIES",
    "KEY_OUTCOMES",
    "SignalObserver",
    "add_sink",
    "count_key",
    "declare",
    "declared",
    "lock_acquired",
    "lock_busy",
    "lock_lost",
    "lock_released",
    "redis_unavailable",
    "remove_sink",
    "request_throttled",
    "task_duplicate",
]

lock_acquired = Signal()
lock_busy = Signal()
lock_released = Signal()
lock_lost = Signal()
redis_unavailable = Signal()
request_throttled = Signal()
task_duplicate = Signal()


logger = logging.getLogger("django_redislock.signals")

# Objects with ``acquired(lock, waited)``, ``busy(lock, waited)``,
# ``released(lock, held)``, ``lost(lock, reason)`` and ``unavailable(sender,
# name, error, fail_open, lock)``. A tuple, replaced whole: a lock in another
# thread iterates the old one undisturbed.
_sinks: tuple[Any, ...] = ()


def add_sink(sink: Any) -> None:
    global _sinks
    if sink not in _sinks:
        _sinks = (*_sinks, sink)


# (name, kind) declared so far, in order: a backend switched on later makes
# their series too. Bounded: a name built from per-call data must not grow it
# (a backend admits names against its own bound as well, ops/metrics.py).
MAX_DECLARED = 1000
_declared: dict[tuple[str, str], None] = {}


def declare(name: str | None, kind: str) -> None:
    """Say that locks named ``name`` in metrics (a template, a rule's name)
    of ``kind`` (``"lock"`` or ``"semaphore"``) will be counted: the metrics
    backends make their series now, at 0. Touches no network; repeatable."""
    if not isinstance(name, str) or not name:
        return
    key = (name, kind)
    if key not in _declared:
        if len(_declared) >= MAX_DECLARED:
            return
        _declared[key] = None
    if _sinks:
        _tell("declared", name, kind)


def declared() -> list[tuple[str, str]]:
    """Every ``(name, kind)`` declared in this process, in order."""
    return list(_declared)


# Keys that are not locks in their users' eyes, and what happens to them:
# an Idempotency-Key (``idempotency``, named by the view's label) and a unique
# task's key (``unique_task``, named ``unique:<template>``). ``claimed``: the
# first request or enqueue took it; ``replayed``: a duplicate got the first
# one's answer (the stored response, the queued task); ``refused``: a
# duplicate was turned away (409, 422, TaskNotUnique); ``released``: the key
# was let go (a task ended, a request that stored nothing).
KEY_FAMILIES = ("idempotency", "unique_task")
KEY_OUTCOMES = ("claimed", "replayed", "refused", "released")


def count_key(family: str, name: str, outcome: str) -> None:
    """One event of a key of ``family`` (``KEY_FAMILIES``): to the metrics
    backends only (no Django signal). Costs an empty-tuple test with none on."""
    if _sinks:
        _tell("key", family, name, outcome)


def remove_sink(sink: Any) -> None:
    global _sinks
    _sinks = tuple(s for s in _sinks if s is not sink)


def _tell(event: str, *args: Any) -> None:
    for sink in _sinks:
        try:
            getattr(sink, event)(*args)
        except Exception:
            # As for a receiver: a failing metric must not break the lock.
            logger.exception("metrics sink %r failed on %s", sink, event)


def _send(signal: Signal, sender: Any, **kwargs: Any) -> None:
    # A failing receiver must not break the lock it reports on: raised from
    # inside acquire, it would leave a lease taken that nobody releases.
    for receiver, result in signal.send_robust(sender, **kwargs):
        if isinstance(result, Exception):
            logger.error(
                "signal receiver %r failed",
                receiver,
                exc_info=(type(result), result, result.__traceback__),
            )


class SignalObserver(Observer):
    """Logs as the core does, then sends the Django signal."""

    def acquired(self, lock: LockBase, waited: float) -> None:
        super().acquired(lock, waited)
        _report("acquired", lock_acquired, lock, waited, fence=lock.fence, waited=waited)

    def busy(self, lock: LockBase, waited: float) -> None:
        super().busy(lock, waited)
        _report("busy", lock_busy, lock, waited, waited=waited)

    def released(self, lock: LockBase, held: float) -> None:
        super().released(lock, held)
        _report("released", lock_released, lock, held, fence=lock.fence, held=held)

    def lost(self, lock: LockBase, reason: str) -> None:
        super().lost(lock, reason)
        loss = lock.loss
        fields = lock.log_fields()
        _report(
            "lost",
            lock_lost,
            lock,
            reason,
            fence=lock.fence,
            reason=reason,
            cause=loss.cause if loss is not None else None,
            held=loss.held_seconds if loss is not None else None,
            ttl=loss.ttl_seconds if loss is not None else None,
            forced_by=loss.forced_by if loss is not None else None,
            owner=fields["owner"],
            label=fields["label"],
            template=fields["template"],
        )


def _report(event: str, signal: Signal, lock: LockBase, detail: Any, **fields: Any) -> None:
    """An event of ``lock`` to the metrics sinks, then as ``signal`` to its receivers."""
    if _sinks:
        _tell(event, lock, detail)
    if signal.receivers:  # nobody listening (the common case): nothing to build
        _send(signal, type(lock), name=lock.name, lock=lock, **fields)


observer = SignalObserver()


def send_unavailable(
    sender: Any,
    name: str,
    error: BaseException,
    fail_open: bool,
    lock: LockBase | None = None,
) -> None:
    if _sinks:
        _tell("unavailable", sender, name, error, fail_open, lock)
    _send(redis_unavailable, sender, name=name, error=error, fail_open=fail_open, lock=lock)


def send_task_duplicate(task: Any, *, name: str, task_id: str | None, on_duplicate: str) -> None:
    _send(
        task_duplicate,
        type(task),
        name=name,
        task=task,
        task_id=task_id,
        on_duplicate=on_duplicate,
    )
