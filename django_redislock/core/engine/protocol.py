"""The lock protocol's decisions, with no I/O.

The sync drivers (``lock.py``, ``semaphore.py``) and the asyncio drivers
(``lock_async.py``, ``semaphore_async.py``) only send, receive and wait; what a
reply means and what to do next is decided here, once, for both:

* what an acquire reply says, and whether a grant arrived too late to count;
* in a wait loop: listen first, queue again with the channel, or sleep, and
  whether a lease handed over while sleeping may be taken as it is;
* what a failed call leaves behind (``may_have_run``) and so whether a
  give-back must follow it;
* after a failed renewal: try again, or report the loss while Redis still
  has the key;
* whether a token and fence handed from elsewhere can be adopted.

Nothing here reads a clock: times are passed in, so every decision can be
tested with plain numbers.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from redis.exceptions import TimeoutError as RedisTimeoutError

from .wakeup_message import NO_CHANNEL, Handed

__all__ = [
    "STATE_KEEP_MS",
    "BARGE_DEFER",
    "BARGE_LIMIT",
    "Acquisition",
    "Move",
    "Step",
    "acquire_reply",
    "check_adopted",
    "may_have_run",
    "renew_interval",
    "renewal_pace",
    "retry_renewal_in",
    "short_of_replicas",
    "validity",
]

# The state hash (last fence, recent releases, queue details) outlives the
# lease by this much: long enough to make a retried release repeatable and to
# floor fences across small clock corrections, short enough that a site taking
# a lock per request on distinct names keeps few of them (one small hash per
# name for TTL + 10 s). The Lua scripts get it as KEEP (scripts.load).
STATE_KEEP_MS = 10_000

# The barging order (``Lock(..., fair=False)``): once a waiter is at the head
# of the queue, at most this many others take the lock before it does. Each
# barge saves a switch to another process; each is also one more turn the
# head waits. See docs/locks.rst ("Barging") for the numbers behind it.
BARGE_LIMIT = 64
# The barging order: a waiter woken to look again (nothing handed over) waits
# this much longer before it does. Linux runs a process woken from its socket
# ahead of the one that just released, so a waiter retrying at once takes
# most freed leases, each a switch between processes, and barging turns into
# first come, first served plus a round trip. Measured on two cores: 2,800
# critical sections per second with 8 workers retrying at once, 4,200 with
# this pause. It is also the latency of a release to an idle lock's waiter.
BARGE_DEFER = 0.002

# Longest a first contended acquire waits for its process's wake-up channel
# to come up before it queues without one (and relies on its timer).
LISTEN_TIMEOUT = 2.0

# The pause before an acquire attempt again after Redis refused one, saying
# to try again (Acquisition.on_refused): it doubles from the first to the
# last. A slot's migration ends in milliseconds, a failover in about twice
# cluster-node-timeout; the call itself already tried again for one socket
# timeout (core/io/calls_base.py).
REFUSED_PAUSES = (0.05, 0.5)


def acquire_reply(reply: Any) -> tuple[int, int]:
    """``(1, fence)`` or ``(0, ms until the state can change)`` from the acquire
    script's reply: the fence comes as text, the wait as an integer."""
    if isinstance(reply, int):
        return 0, reply
    return 1, int(reply)


def may_have_run(exc: BaseException) -> bool:
    """Whether the failed script call that raised ``exc`` may still have run.

    The transport says so when it knows (``exc.may_have_run``: a timeout, or a
    connection that broke once the script was written); otherwise a timeout
    leaves it open (the request may have arrived, or may still arrive, and
    run) and a refused connection does not.
    """
    known = getattr(exc, "may_have_run", None)
    if known is not None:
        return bool(known)
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    return isinstance(cause, (RedisTimeoutError, TimeoutError))


def validity(sent: float, ttl_ms: int, drift_factor: float) -> float:
    """Until when (monotonic clock) a lease granted by a call sent at ``sent``
    counts as held: conservative by the drift allowance and 2 ms."""
    ttl = ttl_ms / 1000
    return sent + ttl - ttl * drift_factor - 0.002


def short_of_replicas(granted: int, acked: int, wanted: int) -> bool:
    """A grant fewer replicas acknowledged than asked: a failover now could
    hand the lock to a replica that never saw it, so it is given back."""
    return granted == 1 and acked < wanted


def renew_interval(ttl_ms: int) -> float:
    """Renew a third of the way into the lease: two more tries before it ends."""
    return ttl_ms / 3000


def renewal_pace(ttl_ms: int) -> float:
    """After a failed renewal, the most a renewing holder waits before it
    tries again; also what it keeps in hand for its thread or task to run
    late (a loaded host, a long pause of the collector), so that the loss
    it reports still comes while Redis has the key."""
    return max(0.05, ttl_ms / 10000)


def retry_renewal_in(valid_until: float, now: float, slowest: float, ttl_ms: int) -> float | None:
    """After a renewal that could not reach Redis: seconds until the next try,
    or None to report the lease lost now.

    ``slowest`` is the longest any failed attempt took since the last one
    that Redis answered. The next may block as long: an attempt refused at
    once (a connection refused while Redis restarts) says nothing of the
    next, which may wait out a whole socket timeout. Another attempt is made
    only if one as slow can end inside the lease with as much again to
    spare, and a pace besides (``renewal_pace``) for the thread or task that
    runs it to be scheduled late; otherwise the loss is reported now, while
    Redis still holds the key.
    """
    pace = renewal_pace(ttl_ms)
    spare = valid_until - now - 2 * slowest - pace
    if spare <= 0:
        return None
    return min(spare, pace)


class Move(enum.Enum):
    ACCEPT = "accept"  # hold it: Step.fence
    GIVE_BACK = "give back"  # granted, but it does not count: give it back
    GIVE_UP = "give up"  # out of time: leave the queue, report busy
    LISTEN = "listen"  # first contention: start the wake-up channel (Step.timeout)
    SLEEP = "sleep"  # wait for a wake-up, at most Step.timeout
    RETRY = "retry"  # run the acquire script again


@dataclass(frozen=True)
class Step:
    move: Move
    fence: int = 0
    timeout: float = 0.0


class Acquisition:
    """The wait loop of one ``acquire()`` call, as decisions.

    The driver calls ``attempt`` before each acquire script it sends,
    ``on_reply`` with the script's reply, and ``on_wakeup`` after each sleep.
    Attempts are numbered (``round``); the number travels with the queue
    entry, and a lease handed over names the attempt it answers. Only a
    lease handed in answer to the latest attempt, whose reply has arrived,
    can be taken as it is: it was granted after that attempt's send time, so
    counting its validity from there is conservative. Anything else (a
    message that was in flight while a later attempt went out, a fence from
    an earlier round whose lease may since have expired and gone to someone
    else) is only a reason to look again.
    """

    def __init__(
        self,
        *,
        ttl_ms: int,
        deadline: float,
        drift_factor: float,
        can_take_handed: bool,
        now: float,
        defer: float = 0.0,
    ) -> None:
        self.ttl_ms = ttl_ms
        self.deadline = deadline
        self.drift_factor = drift_factor
        # With replicas to wait for, a handed lease is never taken as it is:
        # only an acquire that runs WAIT after it can say it was replicated.
        self.can_take_handed = can_take_handed
        self.round = 0
        self.sent = now
        self.replied = False
        # Whether some attempt may have left a queue entry to take back.
        self.queued = False
        self.listening = False
        self.address = NO_CHANNEL
        self.retry_after: float | None = None
        # Barging (BARGE_DEFER): how long a waiter woken to look again lets
        # others go first; whether it has, since its last attempt.
        self.defer = defer
        self._deferred = False
        # The pause before an attempt again after one that Redis refused (on_refused).
        self._refused_pause = REFUSED_PAUSES[0]

    def attempt(self, now: float) -> tuple[int, int]:
        """An acquire script is about to be sent: ``(round, wait ms)``.

        The script queues the caller only when asked to wait, and the caller
        asks only while it listens for its turn (an uncontended acquire must
        not start a channel, and a queued waiter nobody can wake would only
        cost the others its turn).
        """
        self.round += 1
        self.sent = now
        self.replied = False
        self._deferred = False
        wait_ms = max(1, int((self.deadline - now) * 1000)) if self.listening else 0
        self.queued = self.queued or wait_ms > 0
        return self.round, wait_ms

    def on_reply(self, granted: int, value: int, now: float) -> Step:
        """After the acquire script answered ``acquire_reply``'s ``(granted, value)``."""
        self.replied = True
        if granted == 1:
            if now >= validity(self.sent, self.ttl_ms, self.drift_factor):
                # The reply came so late that the lease may already be over:
                # not an acquisition (invariant 6).
                return Step(Move.GIVE_BACK)
            return Step(Move.ACCEPT, fence=value)
        self.retry_after = max(value, 0) / 1000
        remaining = self.deadline - now
        if remaining <= 0:
            return Step(Move.GIVE_UP)
        if not self.listening:
            return Step(Move.LISTEN, timeout=min(remaining, LISTEN_TIMEOUT))
        # Sleep until woken, or until the state can change by itself.
        return Step(Move.SLEEP, timeout=min(remaining, max(value, 1) / 1000))

    def on_refused(self, said_retry: bool, now: float) -> float | None:
        """After an attempt that failed: seconds to pause before the next, or
        None to give up and raise.

        Only an attempt that Redis refused without running it, saying to try
        again (``failures.said_retry``: a Cluster's slot migrating, or its
        failover), is made again, and only within the caller's wait. Nothing
        else is: a script that may have run is never sent again blindly, and
        a Redis that cannot be reached is not busy (it fails at once).
        """
        remaining = self.deadline - now
        if not said_retry or remaining <= 0:
            return None
        pause = min(self._refused_pause, remaining)
        self._refused_pause = min(self._refused_pause * 2, REFUSED_PAUSES[1])
        return pause

    def listening_on(self, address: bytes | None) -> None:
        """The driver registered for wake-ups; ``address`` if the channel is up."""
        self.listening = True
        if address is not None:
            self.address = address

    @property
    def queued_without_channel(self) -> bool:
        return self.address == NO_CHANNEL

    def channel_up(self, address: bytes) -> None:
        """The channel came up after the caller queued without it: the next
        attempt queues again, with it, at once."""
        self.address = address

    def on_wakeup(self, handed: Handed | None, now: float) -> Step:
        """After a sleep: take a lease handed over, look again, or (barging,
        woken with nothing handed over) sleep ``defer`` more first."""
        if handed is None and self.defer > 0 and not self._deferred:
            remaining = self.deadline - now
            if remaining > 0:
                self._deferred = True
                return Step(Move.SLEEP, timeout=min(remaining, self.defer))
        if (
            handed is not None
            and self.can_take_handed
            and self.replied
            and handed.round == self.round
            # With more than half of it left no round trip is needed;
            # otherwise the next attempt finds the lease ours and restarts it.
            and validity(self.sent, self.ttl_ms, self.drift_factor) - now > self.ttl_ms / 2000
        ):
            return Step(Move.ACCEPT, fence=handed.fence)
        return Step(Move.RETRY)


def check_adopted(token: object, fence: object) -> tuple[str, int]:
    """Validate the token and fence a handle is asked to ``adopt``."""
    # The scripts rely on the shape of tokens (16 hex digits: see `d` in
    # _prelude.lua); anything else cannot be a token this library issued.
    if not isinstance(token, str) or len(token) != 16 or token.strip("0123456789abcdef"):
        raise ValueError(
            f"adopt() needs the token of a lease, as acquire() set it (16 hex digits); "
            f"got {token!r}"
        )
    if isinstance(fence, bool) or not isinstance(fence, int) or fence < 0:
        raise ValueError(
            f"adopt() needs the fence of that lease, as acquire() set it; got {fence!r}"
        )
    return token, fence
