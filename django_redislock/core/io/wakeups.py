"""Wake-ups for waiters, one pub/sub connection per process (and per pool).

A waiter does not poll and does not block a pooled connection. It joins the
lock's FIFO queue in Redis together with the name of its process's wake-up
channel; when its turn comes, the script that freed the lock publishes the
waiter's token there. Hundreds of waiters in one process therefore cost one
connection, and the holder's release never queues behind them for a socket.

The channel is read by the waiters themselves, one at a time (leader and
followers): the first waiter to sleep reads the socket and sets the events of
the others as their turns come; when its own turn comes it hands the reading
to a sleeping follower. A waiter alone in its process, the common case,
therefore wakes straight from the socket, with no thread in between. A small
housekeeping thread closes the connection after a minute without waiters.

Waiters still bound every sleep by the time the lock's state can change by
itself (the holder's lease or a reservation running out), so a lost message,
a dropped connection or a crashed holder costs at most that, never a hang.
When the channel comes back after a loss, every local waiter looks again.

Through Sentinel, the channel follows the primary: while anyone waits, the
housekeeping thread asks the sentinels once a second (``FOLLOW_INTERVAL``)
where the primary is, and when it is no longer where the channel is
subscribed, the reader subscribes anew there (the sentinels' answer also has
the pool drop its idle connections to the old one), and every local waiter
looks again. Waiters queue with the mode letter ``c`` there (``plain_address``):
a count of receivers proves nothing while a listener may sit on a replica.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from typing import Any

from ..clients import RedisClient
from ..engine.keys import KeySpace
from ..engine.wakeup_message import Handed, parse_wakeup
from . import breaker
from .wakeups_base import (
    FOLLOW_INTERVAL,
    IDLE_TIMEOUT,
    LIVENESS_INTERVAL,
    Liveness,
    PlainChannel,
    Wakeup,
    found,
    moved_from,
    opened_for,
    plain_address,
    registered,
)
from .wakeups_sharded import ShardedNotifier

__all__ = ["Notifier", "get_notifier"]

# How often the housekeeping thread looks.
HOUSEKEEPING_INTERVAL = 5.0
# The waiter reading the channel looks at its own event at least this often:
# it may be woken from another thread (its Redis's breaker opened) while the
# channel says nothing, as a frozen Redis's does.
READ_SLICE = 0.25
# How long a SUBSCRIBE may go unconfirmed before it counts as failed. A leader
# whose own wait ends first leaves it pending for the next one to finish.
SUBSCRIBE_TIMEOUT = LIVENESS_INTERVAL


class Notifier:
    """The wake-up channel of this process for one Redis connection pool."""

    def __init__(self, client: RedisClient, keyspace: KeySpace) -> None:
        self._client = client
        self.process_id = secrets.token_hex(8)
        self.channel = keyspace.channel(self.process_id)
        # The form the lock scripts take: PUBLISH on this channel, p or c
        # (a Sentinel client: its count of receivers proves nothing).
        self.address = plain_address(client, self.channel)
        # A Sentinel client's channel follows the primary (_housekeep); the
        # primary's address once the sentinels named another than the
        # channel's, for the reader to subscribe there.
        self._channel = PlainChannel(client)
        self._moved: Any = None
        self._slots: dict[str, Wakeup] = {}
        self._mutex = threading.Lock()
        # Set when leadership is given up, for wait_ready() callers; how many
        # wait on it (under the mutex), so that nobody notifies an empty room.
        self._led = threading.Condition(self._mutex)
        self._awaiting_leader = 0
        self._leading = False
        # Touched only by the leader, or under the mutex while nobody leads.
        self._pubsub: Any = None
        self._pending: Any = None  # a SUBSCRIBE sent, not yet confirmed
        self._pending_since = 0.0
        self._retry_at = 0.0
        self._liveness = Liveness(0.0)
        self._idle_since = time.monotonic()
        self._housekeeper: threading.Thread | None = None
        breaker.on_open(self._on_breaker_open)

    # -- waiters' side -----------------------------------------------------
    # One process-wide channel and PUBLISH: the tag arguments are for the
    # Cluster notifier (wakeups_sharded.py), which listens per hash slot.

    def address_for(self, tag: bytes = b"") -> bytes:
        return self.address

    def register(self, token: str, tag: bytes = b"") -> Wakeup:
        event = Wakeup()
        with self._mutex:
            self._slots[token] = event
        return event

    def register_if_ready(self, token: str, tag: bytes = b"") -> Wakeup | None:
        """Register ``token`` if the channel is subscribed, else None: the
        check and the registration are one step, so the channel cannot be
        closed as idle in between."""
        with self._mutex:
            if self._pubsub is None:
                return None
            event = self._slots[token] = Wakeup()
            return event

    def unregister(self, token: str) -> None:
        with self._mutex:
            event = self._slots.pop(token, None)
            if not self._slots:
                self._idle_since = time.monotonic()
            if event is not None and event.promoted:
                # It was to read for the others but left first: pass it on.
                self._promote()

    def is_ready(self, tag: bytes = b"") -> bool:
        """Whether the channel is subscribed (a plain read)."""
        return self._pubsub is not None

    def wait_ready(self, timeout: float, tag: bytes = b"") -> bool:
        """Whether the channel is subscribed; with a timeout, subscribe it.

        Every contended acquire asks with timeout 0 first: a plain read.
        """
        if self._pubsub is not None:
            return True
        if timeout <= 0:
            return False
        deadline = time.monotonic() + timeout
        lead = False
        try:
            with self._mutex:
                while self._leading:
                    # The leader is connecting, or reading a live channel.
                    if self._pubsub is not None or not self._await_leader(deadline):
                        return self._pubsub is not None
                lead = self._leading = True
            while not self._connect(deadline):
                # Backing off, or the confirmation is slow: try again in time.
                now = time.monotonic()
                if self._pending is None and self._retry_at < deadline:
                    time.sleep(max(0.0, self._retry_at - now))
                    continue
                return False
            return True
        finally:
            if lead:
                self._stop_leading()

    def wait(self, event: Wakeup, timeout: float) -> Handed | None:
        """Sleep until ``event`` fires or ``timeout`` passes; read the channel
        meanwhile if nobody else does. Returns the fence of a lease handed
        over (with the attempt it answers), else None (woken to look again, or
        timed out)."""
        deadline = time.monotonic() + timeout
        while True:
            lead = False
            try:
                with self._mutex:
                    remaining = deadline - time.monotonic()
                    if event.fired or remaining <= 0:
                        promoted = event.promoted
                        handed = event.take_turn()
                        if promoted:
                            # Asked to read for the others, but done waiting: pass it on.
                            self._promote(exclude=event)
                        return handed
                    if event.promoted:
                        event.promoted = False
                        event.clear()
                    if not self._leading:
                        lead = self._leading = True
                if lead:
                    self._read(event, deadline)
                    if event.fired:
                        # Its turn, read by itself (the usual case): leadership
                        # given up and the turn taken in one step, as the
                        # next round of this loop would after _stop_leading
                        # (an interrupt before it returns: the finally below).
                        handed = self._stop_leading_with_turn(event)
                        lead = False
                        return handed
                else:
                    event.wait(remaining)  # fired, or promoted to read
            finally:
                if lead:
                    self._stop_leading(event)

    # -- leadership (under the mutex) ----------------------------------------
    def _await_leader(self, deadline: float) -> bool:
        """Wait (holding the mutex) until leadership is given up or the
        channel comes up; False at ``deadline``."""
        self._awaiting_leader += 1
        try:
            return self._led.wait(deadline - time.monotonic())
        finally:
            self._awaiting_leader -= 1

    def _notify_led(self) -> None:
        # Under the mutex. Waiters on their turn never wait here: only a
        # first contention waiting for the channel does.
        if self._awaiting_leader:
            self._led.notify_all()

    def _stop_leading(self, leaving: Wakeup | None = None) -> None:
        with self._mutex:
            self._leading = False
            self._promote(exclude=leaving)
            self._notify_led()

    def _stop_leading_with_turn(self, event: Wakeup) -> Handed | None:
        """The reader ``event``, fired, stops leading and takes its turn."""
        with self._mutex:
            self._leading = False
            handed = event.take_turn()
            self._promote(exclude=event)
            self._notify_led()
        return handed

    def _promote(self, exclude: Wakeup | None = None) -> None:
        """Ask a sleeping waiter to read the channel (caller holds the mutex);
        never ``exclude``, the waiter that is done reading."""
        if self._leading:
            return
        for event in self._slots.values():
            if event is not exclude and not event.is_set():
                event.promoted = True
                event.set()
                return

    def _fire(self, event: Wakeup, handed: Handed | None) -> None:
        event.handed = handed
        event.fired = True
        event.set()

    def _wake_all(self) -> None:
        with self._mutex:
            for event in self._slots.values():
                self._fire(event, event.handed)

    def _on_breaker_open(self, opened: breaker.Breaker) -> None:
        # A call to this Redis timed out: the waiters look again now, and
        # fail fast, rather than sleep out their wait on a silent channel.
        if opened_for(self._client, opened):
            self._wake_all()

    # -- the leader's side -------------------------------------------------------
    def _connect(self, deadline: float) -> bool:
        """Subscribe the channel, waiting for the confirmation until
        ``deadline``; False if it is not confirmed by then (still pending, or
        failed and backing off)."""
        if self._pubsub is not None:
            return True
        if self._pending is None:
            if time.monotonic() < self._retry_at:
                return False
            pubsub = None
            try:
                pubsub = self._client.pubsub()
                pubsub.subscribe(self.channel)
            except Exception as exc:  # any failure: back off, waiters use their timers
                self._close(pubsub)
                self._failed(exc)
                return False
            self._pending, self._pending_since = pubsub, time.monotonic()
        pubsub = self._pending
        give_up = self._pending_since + SUBSCRIBE_TIMEOUT
        try:
            while True:
                message = pubsub.get_message(
                    timeout=max(0.0, min(deadline, give_up) - time.monotonic())
                )
                if message is not None and message["type"] in ("subscribe", b"subscribe"):
                    break
                if message is None:
                    if time.monotonic() < give_up:
                        return False  # out of this caller's time; the next goes on
                    raise TimeoutError("no confirmation of SUBSCRIBE in time")
        except Exception as exc:
            self._pending = None
            self._close(pubsub)
            self._failed(exc)
            return False
        self._pending = None
        self._pubsub = pubsub
        self._subscribed()
        with self._mutex:
            self._notify_led()  # wait_ready() callers: the channel is up
        self._start_housekeeping()
        return True

    @staticmethod
    def _close(pubsub: Any) -> None:
        if pubsub is not None:
            # Already broken, perhaps: there is nothing left to release.
            with contextlib.suppress(Exception):
                pubsub.close()

    def _subscribed(self) -> None:
        self._moved = None  # subscribed anew: where the sentinels say the primary is
        now = time.monotonic()
        self._liveness.heard(now)
        self._retry_at = 0.0
        with self._mutex:
            for event in self._channel.up(now, self._slots.values()):
                self._fire(event, event.handed)

    def _failed(self, exc: BaseException) -> None:
        now = time.monotonic()
        with self._mutex:
            waiting = bool(self._slots)
        self._retry_at = now + self._channel.lost(now, exc, waiting)

    def _drop(self, exc: BaseException) -> None:
        pubsub, self._pubsub = self._pubsub, None
        self._close(pubsub)
        self._failed(exc)
        if self._channel.loss_wakes:
            self._wake_all()

    def _read(self, event: Wakeup, deadline: float) -> None:
        """Read the channel until ``event`` fires or ``deadline`` passes."""
        while not event.fired:
            now = time.monotonic()
            if now >= deadline:
                return
            if self._pubsub is None:
                if not self._connect(deadline):
                    # Backing off, or out of time: sleep on our own event (a
                    # fire still wakes us) until the next attempt or our deadline.
                    now = time.monotonic()
                    if now < deadline:
                        event.wait(max(0.001, min(deadline, self._retry_at) - now))
                        with self._mutex:
                            if not event.fired:
                                event.clear()
                continue  # connected: subscribing may have fired our own event
            if self._moved is not None:
                self._follow()
                continue
            # A slice at most: a breaker that opened meanwhile is seen soon.
            until = min(deadline, self._liveness.next_check(), now + READ_SLICE)
            if self._channel.sentinel:
                # Back within a second to see whether the primary moved.
                until = min(until, now + FOLLOW_INTERVAL)
            try:
                self._read_once(until - now, event)
            except Exception as exc:
                self._drop(exc)

    def _follow(self) -> None:
        """The sentinels named another primary than the channel's: subscribe
        there. No back-off, nothing to warn of; the confirmation wakes every
        waiter to look again (grants may have gone unheard meanwhile)."""
        primary, self._moved = self._moved, None
        self._channel.follows(primary)
        pubsub, self._pubsub = self._pubsub, None
        self._close(pubsub)
        self._retry_at = 0.0

    def _read_once(self, timeout: float, reader: Wakeup | None = None) -> None:
        """One message or ``timeout``; ``reader``: the event of the waiter
        reading, which this very thread finds fired on its return."""
        message = self._pubsub.get_message(timeout=max(0.0, timeout))
        now = time.monotonic()
        if message is None:
            if self._liveness.ping_due(now):
                self._pubsub.ping()
                self._liveness.ping_sent = now
            return
        self._liveness.heard(now)
        kind = message["type"]
        if kind == "message":
            token, handed = parse_wakeup(message["data"])
            with self._mutex:
                target = self._slots.get(token)
                if target is reader and target is not None:
                    # Our own turn (the usual case, one waiter per process):
                    # the reader sees ``fired`` as it returns; nobody sleeps
                    # on its event, so it need not be set.
                    target.handed, target.fired = handed, True
                elif target is not None:
                    self._fire(target, handed)
        elif kind == "subscribe":
            # redis-py reconnected and subscribed again by itself.
            self._subscribed()

    # -- housekeeping ------------------------------------------------------------
    def _start_housekeeping(self) -> None:
        with self._mutex:
            if self._housekeeper is None or not self._housekeeper.is_alive():
                self._housekeeper = threading.Thread(
                    target=self._housekeep, name="redislock-notify", daemon=True
                )
                self._housekeeper.start()

    def _housekeep(self) -> None:
        """Close the channel once nobody has waited for IDLE_TIMEOUT; through
        Sentinel, see once a second that it is subscribed on the primary."""
        while True:
            time.sleep(FOLLOW_INTERVAL if self._channel.sentinel else HOUSEKEEPING_INTERVAL)
            with self._mutex:
                pubsub = self._pubsub
                waiting = bool(self._slots)
                # Nobody leads, so nobody reads: the channel may be taken here,
                # where register_if_ready() cannot slip in between.
                busy = self._leading or waiting
                if not busy and time.monotonic() - self._idle_since >= IDLE_TIMEOUT:
                    pubsubs = (self._pubsub, self._pending)
                    self._pubsub = self._pending = None
                    self._channel.closed()
                    self._housekeeper = None
                    break
            if self._channel.sentinel and waiting and pubsub is not None:
                self._see_primary(pubsub)
        for pubsub in pubsubs:
            self._close(pubsub)

    def _see_primary(self, pubsub: Any) -> None:
        """Ask the sentinels where the primary is (off every waiter's path,
        bounded by the sentinels' timeouts); if not where ``pubsub`` is
        subscribed, have the reader follow it (``_follow``)."""
        try:
            primary = self._client.connection_pool.get_master_address()  # type: ignore[attr-defined]
        except Exception as exc:  # no sentinel answers: the channel stays where it is
            self._channel.unanswered(exc)
            return
        if pubsub is self._pubsub and moved_from(pubsub.connection, primary):
            self._moved = primary


_registry: dict[tuple[int, str], tuple[Any, Notifier | ShardedNotifier]] = {}
_registry_lock = threading.Lock()


def get_notifier(client: RedisClient, keyspace: KeySpace) -> Notifier | ShardedNotifier:
    """The process's notifier for the client's connection pool and prefix.

    A ``RedisCluster`` (which has no single pool) gets a ``ShardedNotifier``.
    """
    # Asked by every acquire that may wait: found without the lock once made
    # (a dict read is atomic), made under it.
    notifier = found(_registry, client, keyspace)
    if notifier is not None:
        return notifier
    with _registry_lock:
        return registered(_registry, client, keyspace, Notifier, ShardedNotifier)


def _after_fork_in_child() -> None:
    # The listener thread does not exist in a child; it starts its own.
    global _registry_lock
    _registry.clear()
    _registry_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
