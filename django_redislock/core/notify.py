"""Wake-ups for waiters, one pub/sub connection per process (and per pool).

A waiter does not poll and does not block a pooled connection. It joins the
lock's FIFO queue in Redis together with the name of its process's wake-up
channel; when its turn comes, the script that freed the lock publishes the
waiter's token there. One listener thread per process reads that channel and
sets the waiter's event. Hundreds of waiters in one process therefore cost one
connection, and the holder's release never queues behind them for a socket.

Waiters still bound every sleep by the time the lock's state can change by
itself (the holder's lease or a reservation running out), so a lost message,
a dropped connection or a crashed holder costs at most that, never a hang.
When the listener reconnects it wakes every local waiter to look again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
import time
from typing import Any

from .keys import KeySpace

__all__ = ["Notifier", "get_notifier"]

logger = logging.getLogger("django_redislock.notify")

# How long the listener may sit without hearing from Redis before it pings,
# and then how long the pong may take before it reconnects: a blackholed
# connection is noticed within about twice this.
LIVENESS_INTERVAL = 5.0
# A listener with no waiters for this long closes its connection.
IDLE_TIMEOUT = 60.0


class Notifier:
    """The wake-up channel of this process for one Redis connection pool."""

    def __init__(self, client: Any, keyspace: KeySpace) -> None:
        self._client = client
        self.process_id = secrets.token_hex(8)
        self.channel = keyspace.channel(self.process_id)
        # The form the lock scripts take: p = PUBLISH on this channel.
        self.address = b"p" + self.channel
        self._slots: dict[str, Wakeup] = {}
        self._mutex = threading.Lock()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._idle_since = time.monotonic()
        self._connected_before = False
        self._failures = 0

    # -- waiters' side -----------------------------------------------------
    # One process-wide channel and PUBLISH: the tag arguments are for the
    # Cluster notifier (notify_sharded.py), which listens per hash slot.

    def address_for(self, tag: bytes = b"") -> bytes:
        return self.address

    def register(self, token: str, tag: bytes = b"") -> Wakeup:
        event = Wakeup()
        with self._mutex:
            self._slots[token] = event
            if self._thread is None or not self._thread.is_alive():
                self._ready.clear()
                self._thread = threading.Thread(
                    target=self._run, name="redislock-notify", daemon=True
                )
                self._thread.start()
        return event

    def unregister(self, token: str) -> None:
        with self._mutex:
            self._slots.pop(token, None)
            if not self._slots:
                self._idle_since = time.monotonic()

    def wait_ready(self, timeout: float, tag: bytes = b"") -> bool:
        """Wait until the channel is subscribed; False if it is not by then."""
        # Every uncontended acquire asks with timeout 0: is_set() skips the
        # condition variable that Event.wait() would take.
        return self._ready.is_set() or (timeout > 0 and self._ready.wait(timeout))

    # -- listener thread ----------------------------------------------------
    def _wake_all(self) -> None:
        with self._mutex:
            events = list(self._slots.values())
        for event in events:
            event.set()

    def _idle(self) -> bool:
        with self._mutex:
            return not self._slots and time.monotonic() - self._idle_since > IDLE_TIMEOUT

    def _run(self) -> None:
        backoff = 0.05
        while True:
            pubsub = None
            try:
                pubsub = self._client.pubsub()
                pubsub.subscribe(self.channel)
                self._listen(pubsub)
                backoff = 0.05
            except Exception as exc:  # any failure: reconnect, never die silently
                self._failures += 1
                # One warning per outage, and only if someone is waiting: an
                # idle listener losing its connection affects nobody.
                with self._mutex:
                    waiting = bool(self._slots)
                log = logger.warning if self._failures == 1 and waiting else logger.debug
                log("wake-up channel lost, reconnecting: %s", exc)
            finally:
                self._ready.clear()
                if pubsub is not None:
                    # Already broken, perhaps: there is nothing left to release.
                    with contextlib.suppress(Exception):
                        pubsub.close()
                # Waiters must not sleep on a channel nobody is reading.
                self._wake_all()
            with self._mutex:
                # Nobody waiting and the channel broken (or long idle): stop;
                # the next waiter starts a fresh listener.
                if not self._slots and (
                    self._failures or time.monotonic() - self._idle_since > IDLE_TIMEOUT
                ):
                    self._thread = None
                    return
            time.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    def _listen(self, pubsub: Any) -> None:
        last_heard = time.monotonic()
        ping_sent: float | None = None
        while True:
            message = pubsub.get_message(timeout=1.0)
            now = time.monotonic()
            if message is None:
                if ping_sent is not None and now - ping_sent > LIVENESS_INTERVAL:
                    raise TimeoutError("no answer to PING on the wake-up channel")
                if ping_sent is None and now - last_heard > LIVENESS_INTERVAL:
                    if self._idle():
                        return
                    pubsub.ping()
                    ping_sent = now
                continue
            last_heard = now
            ping_sent = None
            kind = message["type"]
            if kind == "message":
                token, fence = parse_wakeup(message["data"])
                with self._mutex:
                    event = self._slots.get(token)
                if event is not None:
                    event.fence = fence
                    event.set()
            elif kind == "subscribe":
                if self._failures:
                    logger.info("wake-up channel back after %d attempt(s)", self._failures)
                    self._failures = 0
                self._ready.set()
                if self._connected_before:
                    # Back after an outage: wake-ups may have been missed.
                    self._wake_all()
                self._connected_before = True


class Wakeup(threading.Event):
    """A waiter's event; ``fence`` is set when the lease was handed to it."""

    fence: int | None = None


def parse_wakeup(data: bytes | str) -> tuple[str, int | None]:
    """``b"<token>"`` or ``b"<token>:<fence>"`` (a lease handed over) -> parts."""
    text = data.decode() if isinstance(data, bytes) else str(data)
    token, colon, fence = text.partition(":")
    return token, (int(fence) if colon else None)


_registry: dict[tuple[int, str], tuple[Any, Any]] = {}
_registry_lock = threading.Lock()


def get_notifier(client: Any, keyspace: KeySpace) -> Any:
    """The process's notifier for the client's connection pool and prefix.

    A ``RedisCluster`` (which has no single pool) gets a ``ShardedNotifier``.
    """
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        pool = client
    key = (id(pool), keyspace.prefix)
    entry = _registry.get(key)
    if entry is not None and entry[0] is pool:
        return entry[1]
    with _registry_lock:
        entry = _registry.get(key)
        if entry is None or entry[0] is not pool:
            from .notify_sharded import ShardedNotifier, is_cluster

            kind = ShardedNotifier if is_cluster(client) else Notifier
            entry = (pool, kind(client, keyspace))
            _registry[key] = entry
        return entry[1]


def _after_fork_in_child() -> None:
    # The listener thread does not exist in a child; it starts its own.
    global _registry_lock
    _registry.clear()
    _registry_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
