"""Give back, off the caller's path, what a call with an unknown outcome may hold.

An acquire whose reply did not come in time may still run when Redis
resumes and grant a lease to nobody: the name would be blocked for the whole
lease. The caller must not wait for Redis to come back, so it only enqueues a
give-back (the cancel script for its token); it runs here, again and again
with a short back-off, until Redis answers or the lease it guards is over.

Ordering matters: the late acquire is still in Redis's buffer on its own
connection. A cancel sent on another connection could run first and the late
acquire after it. So that connection is kept (``drain``) until its replies are
read, and a give-back that follows such a call (``after=``) is sent twice:
once after the drain's first look for the late replies (not after all of
them, so that a reply lost on the way does not hold it until the drain gives
up), and again once they have been read, so that a late request that ran
after the first gives back nothing it granted. The cancel scripts are safe
to repeat. Sync and asyncio code follow this one policy (``calls_base.Pending``).

Sync code runs them here, on the process's one background thread
(``background.py``: started on first use, started anew in a forked child);
asyncio code runs each give-back as a task on the running loop
(``giveback_async.py``, the name ``tools/gen_sync.py`` maps to this module).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import background
from .calls_base import DRAIN_POLL, FIRST_DELAY, MAX_DELAY, Pending, pending_of

__all__ = ["drain", "submit"]

logger = logging.getLogger("django_redislock.giveback")

# Drains and give-backs are jobs of the process's scheduler (``background.py``),
# the thread that also renews leases. Each takes turns with the others: a
# drain polls its connection briefly per turn, so a reply that never comes
# (lost on the way) does not hold up the give-backs that need not wait for it.


class _Drain:
    """Reads the late replies of one connection, a short poll per turn, so
    that a reply that never comes does not hold up the other connections."""

    def __init__(self, pending: Pending) -> None:
        self.pending = pending

    def __call__(self) -> float | None:
        pending = self.pending
        conn = pending.conn
        left = pending.deadline - time.monotonic()
        if pending.unread and left > 0:
            try:
                if not conn.can_read(timeout=min(DRAIN_POLL, left)):
                    return 0.0
                conn.read_response(disconnect_on_error=False)
            except ResponseError:
                pass
            except (TimeoutError, RedisTimeoutError):
                return 0.0
            except Exception:
                # Closed by Redis (or Redis restarted): what was unread is gone.
                logger.debug("connection with late replies closed", exc_info=True)
                self.finish()
                return None
            pending.unread -= 1
            if pending.unread:
                return 0.0
        self.finish()
        return None

    def finish(self) -> None:
        pending = self.pending
        pending.answered = pending.unread == 0
        try:
            if not pending.answered:
                pending.conn.disconnect()
            pending.release()
        finally:
            pending.done.set()
            pending.settle()


def drain(pending: Pending) -> None:
    """Take over a connection whose replies are late: read them, then free it."""
    background.current().add(_Drain(pending))


class _GiveBack:
    """One give-back: an attempt per turn, with a growing pause between them."""

    def __init__(self, call: Callable[[], Any], deadline: float, what: str) -> None:
        self.call = call
        self.deadline = deadline
        self.what = what
        self.delay = FIRST_DELAY
        self.attempts = 0

    def __call__(self) -> float | None:
        self.attempts += 1
        try:
            self.call()
        except Exception as exc:
            now = time.monotonic()
            if now + self.delay >= self.deadline:
                logger.warning(
                    "gave up giving back %s after %d attempt(s): %s", self.what, self.attempts, exc
                )
                return None
            logger.debug("giving back %s failed (%s); trying again", self.what, exc)
            delay = self.delay
            self.delay = min(self.delay * 2, MAX_DELAY)
            return delay
        if self.attempts > 1:
            logger.info("gave back %s after %d attempts", self.what, self.attempts)
        return None


def submit(
    call: Callable[[], Any],
    *,
    within: float,
    after: BaseException | None = None,
    what: str = "a lease",
) -> None:
    """Run ``call`` in the background until it succeeds or ``within`` seconds pass.

    ``after``: the failed call this one gives back for; if its connection
    still waits for late replies, they are kept being read until
    ``deadline``, ``call``'s first attempt comes after the drain's first
    look for them, and ``call`` runs again once they are read (the module's
    docstring says why). Returns at once.
    """
    deadline = time.monotonic() + within
    pending = pending_of(after)
    if pending is not None:
        pending.keep_until(deadline)
        pending.once_answered(
            lambda: background.current().add(_GiveBack(call, deadline, what + " (again)"))
        )
    # The drain of ``after`` was queued before this, due sooner: its first
    # turn (a short poll for the late replies) comes before the first attempt.
    background.current().add(_GiveBack(call, deadline, what))
