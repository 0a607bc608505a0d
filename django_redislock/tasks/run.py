"""The worker's side of a unique task: adopt the key for the run, then let it go.

See ``unique.py`` for the whole protocol.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from typing import Any

from ..core import AsyncLock, Lock, LockError, RedisUnavailable
from ..locking.factories import get_async_lock, get_lock
from ..signals import count_key
from ..stepping import Steps, run_steps, run_steps_async
from .claims import note, note_async
from .options import Claim, UniqueOptions

__all__ = ["Run"]

logger = logging.getLogger("django_redislock.unique")


class Run:
    """One run of a unique task in a worker: adopt the key, then let it go.

    The decisions and messages are one body each (``_starting``,
    ``_finishing``); ``start``/``finish`` step it with blocking calls,
    ``start_async``/``finish_async`` on the event loop (an ``async def`` task).
    """

    def __init__(self, claim: Claim, opts: UniqueOptions | None, label: str) -> None:
        self.claim = claim
        self.alias = opts.alias if opts is not None else None
        self.metric_name = opts.metric_name if opts is not None else None
        self.label = label
        self.keep_for = opts.keep_for if opts is not None else None
        # The adopted lease, while the run holds it (an AsyncLock for an async task).
        self.lock: Lock | AsyncLock | None = None
        # Seconds until the retry this run sent may run; None: none was sent.
        self.retry_in: float | None = None
        # Seconds until that retry expires (Celery's ``expires``), if it does.
        self.retry_limit: float | None = None

    def retrying(self, delay: float, limit: float | None = None) -> None:
        """This run sent its own retry (the same task id and claim), to run in
        ``delay`` seconds and never after ``limit`` seconds (its expiry): the
        key goes with it, however the run then ends."""
        self.retry_in = delay if self.retry_in is None else max(self.retry_in, delay)
        if limit is not None:
            self.retry_limit = limit if self.retry_limit is None else min(self.retry_limit, limit)

    def _lock_kwargs(self) -> dict[str, Any]:
        return {
            "timeout": self.claim.lease,
            "wait": 0,
            "renew": True,
            # However long the run: a worker that dies stops renewing.
            "renew_max": None,
            "alias": self.alias,
            "label": self.label,
            "metric_name": self.metric_name,
        }

    def _unreachable(self, exc: BaseException) -> None:
        logger.warning(
            "could not adopt unique key %r for %s (%s); running without it; its lease "
            "runs out by itself",
            self.claim.name,
            self.label,
            exc,
        )

    def _not_adopted(self) -> None:
        logger.warning(
            "unique key %r of %s was no longer held by this task (it waited longer than "
            "its ttl, or was force-released); running without it",
            self.claim.name,
            self.label,
        )

    def _hands_on(self, retry_in: float | None) -> float | None:
        """The lease for the retry to adopt, or None to release now.

        A retry is known by the message this run sent (``retrying``: a
        ``self.retry(throw=False)`` returns normally) or by the ``Retry`` it
        raised (an eager retry sends no message)."""
        delays = [d for d in (retry_in, self.retry_in) if d is not None]
        if not delays or self.claim.until != "finish":
            return None
        ttl = self.claim.ttl + max(delays)
        if self.retry_limit is None:
            return ttl
        # No longer than the retry's message lives: an expired retry is
        # thrown away, and its key must not outlive it.
        return min(ttl, self.retry_limit) if self.retry_limit > 0 else None

    def _kept(self, retry_in: float | None, succeeded: bool, redelivered: bool) -> float | None:
        """How long the key outlives this run (None: it is let go now)."""
        handed = self._hands_on(retry_in)
        if handed is not None:
            return handed
        if succeeded and self.keep_for is not None:
            return self.keep_for  # at most once per keep_for (the option's promise)
        if redelivered and self.claim.until == "finish":
            # The same message comes again (a Celery message not yet
            # acknowledged, or rejected back to its queue): it adopts the
            # key, as a task still queued would, within the pending ttl.
            return self.claim.ttl
        return None

    def _not_handed(self, exc: BaseException) -> None:
        logger.warning(
            "could not keep unique key %r of %s after the run: %s",
            self.claim.name,
            self.label,
            exc,
        )

    def _not_released(self, exc: BaseException) -> None:
        # A loss was reported already (lock_lost); Redis down: it runs out.
        logger.warning(
            "could not release unique key %r of %s: %s", self.claim.name, self.label, exc
        )

    # -- one body for both drivers -----------------------------------------------------
    def _starting(
        self, lock: Lock | AsyncLock, task_id: str | None, who: str, note_call: Any
    ) -> Steps[bool]:
        claim = self.claim
        try:
            adopted = yield functools.partial(lock.adopt, claim.token, claim.fence, ttl=claim.lease)
        except RedisUnavailable as exc:
            self._unreachable(exc)
            return False
        if not adopted:
            self._not_adopted()
            return False
        if claim.until == "enqueue":
            yield from self._releasing(lock)
            return True
        # From now on operators see this worker, not the enqueuer, as the holder.
        owner = lock.owner_metadata(who)
        yield functools.partial(note_call, lock, claim.token, task_id, owner)
        self.lock = lock
        return True

    def _finishing(self, retry_in: float | None, succeeded: bool, redelivered: bool) -> Steps[None]:
        lock, self.lock = self.lock, None
        if lock is None:
            return
        handed = self._kept(retry_in, succeeded, redelivered)
        if handed is None:
            yield from self._releasing(lock)
            return
        # Held on: a retry or a redelivery carries the same claim and adopts
        # it in turn; a key kept after a success runs out by itself.
        try:
            yield functools.partial(lock.detach, ttl=handed)
        except (LockError, RedisUnavailable) as exc:
            self._not_handed(exc)

    def _releasing(self, lock: Lock | AsyncLock) -> Steps[None]:
        try:
            yield lock.release
        except (LockError, RedisUnavailable) as exc:
            self._not_released(exc)
        else:
            count_key("unique_task", str(lock.metric_name), "released")

    # -- sync ---------------------------------------------------------------------------
    def start(self, task_id: str | None = None) -> bool:
        """Adopt the key; False when this task no longer holds it (the run
        goes on without it: unique is a guard, not exactly-once)."""
        lock = get_lock(self.claim.name, **self._lock_kwargs())
        who = threading.current_thread().name
        return run_steps(self._starting(lock, task_id, who, note))

    def finish(
        self, retry_in: float | None = None, *, succeeded: bool = False, redelivered: bool = False
    ) -> None:
        """The run ended. ``retry_in``: it asked for a retry in that many
        seconds; ``succeeded``: it returned (``keep_for`` applies);
        ``redelivered``: its message will be delivered again."""
        run_steps(self._finishing(retry_in, succeeded, redelivered))

    # -- asyncio ------------------------------------------------------------------------
    async def start_async(self, task_id: str | None = None) -> bool:
        """``start`` for a coroutine task, on its event loop."""
        lock = get_async_lock(self.claim.name, **self._lock_kwargs())
        current = asyncio.current_task()
        who = current.get_name() if current is not None else "?"
        return await run_steps_async(self._starting(lock, task_id, who, note_async))

    async def finish_async(
        self, retry_in: float | None = None, *, succeeded: bool = False, redelivered: bool = False
    ) -> None:
        """``finish`` for a coroutine task."""
        await run_steps_async(self._finishing(retry_in, succeeded, redelivered))
