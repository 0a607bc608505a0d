"""Wake-up channels' addresses, their upkeep, and the events waiters sleep on.

Below every notifier and driver, so that none of them imports another for it.
What a wake-up message says is the protocol's (``engine/wakeup_message.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..engine.wakeup_message import Handed
from ..topology import is_cluster, is_sentinel
from .aio_calls import wait_for

if TYPE_CHECKING:
    from ..engine.keys import KeySpace

__all__ = [
    "FOLLOW_INTERVAL",
    "IDLE_TIMEOUT",
    "LIVENESS_INTERVAL",
    "Liveness",
    "AsyncWakeup",
    "Reconnect",
    "Wakeup",
    "found",
    "moved_from",
    "plain_address",
    "registered",
]

# How long a channel reader may sit without hearing from Redis before it
# pings, and then how long the pong may take before it reconnects: a
# blackholed connection is noticed within about twice this.
LIVENESS_INTERVAL = 5.0
# A channel (or a Cluster node's listener) with no waiters for this long is closed.
IDLE_TIMEOUT = 60.0
# How often a Sentinel client's channel, while anyone waits on it, asks the
# sentinels where the primary is, and subscribes there if it moved: the
# sentinels drop a demoted primary's listeners only seconds after they named
# the new one, and a stopped primary says nothing at all.
FOLLOW_INTERVAL = 1.0

# Reconnection back-off bounds, seconds (Reconnect).
BACKOFF_MIN, BACKOFF_MAX = 0.05, 1.0


def plain_address(client: Any, channel: bytes) -> bytes:
    """How the scripts wake a waiter on ``channel``, a plain pub/sub channel
    of ``client``'s server: the mode letter (see ``_prelude.lua``), then the
    channel.

    ``p``: PUBLISH, whose count of receivers is the server's own listeners,
    and no listener anywhere else hears it: none means the waiter's process is
    gone. ``c`` for a Sentinel client: its listener may sit on a server that
    is (or has just become) a replica, which hears through replication
    whatever the primary publishes while the primary counts nobody. There, as
    on a Cluster, no count stands for liveness and a waiter not seen
    listening on the primary is handed a claim to confirm.
    """
    return (b"c" if is_sentinel(client) else b"p") + channel


def moved_from(connection: Any, primary: Any) -> bool:
    """Whether the server ``connection`` is connected to is not ``primary``,
    an address (host, port) as the sentinels name it."""
    if connection is None or primary is None:
        return False
    host, port = primary
    here = (str(getattr(connection, "host", "")), str(getattr(connection, "port", "")))
    return here != (str(host.decode() if isinstance(host, bytes) else host), str(port))


class Reconnect:
    """When a wake-up channel's reader tries again after losing its
    connection, and how loudly it says so. One policy, no I/O, for every
    reader: the sync and asyncio notifiers and a Cluster node's listeners.

    The back-off doubles from ``BACKOFF_MIN`` to ``BACKOFF_MAX`` with each
    failure of one outage. An outage ends only once the channel stayed up for
    ``LIVENESS_INTERVAL``: a connection that drops as soon as it subscribes
    must not wake every waiter at 20 Hz, nor log a warning each time.
    """

    def __init__(self) -> None:
        self.failures = 0  # of the current outage
        self.delay = BACKOFF_MIN  # before the attempt after the next failure
        self._up_since: float | None = None
        self._told = True  # the end of this outage was logged

    def up(self, now: float) -> int:
        """The channel is subscribed at ``now``. Returns how many failures the
        outage it may end had, once per outage (0: nothing to tell)."""
        self._up_since = now
        if self._told:
            return 0
        self._told = True
        return self.failures

    def failed(self, now: float) -> float:
        """The connection failed at ``now``: seconds to wait before the next attempt."""
        if self._up_since is not None and now - self._up_since >= LIVENESS_INTERVAL:
            # Up for a while before this: a new outage, not the same one.
            self.failures = 0
            self.delay = BACKOFF_MIN
        self._up_since = None
        self._told = False
        self.failures += 1
        delay = self.delay
        self.delay = min(self.delay * 2, BACKOFF_MAX)
        return delay

    @property
    def first(self) -> bool:
        """Whether the last failure started an outage: the one worth a warning."""
        return self.failures == 1


class Liveness:
    """When a quiet wake-up channel is pinged, and when it counts as lost. One
    policy, no I/O, for every reader, as ``Reconnect`` is.

    A channel that said nothing for ``LIVENESS_INTERVAL`` gets a PING; one
    whose PING went unanswered for as long is lost (``ping_due`` raises).
    """

    def __init__(self, now: float) -> None:
        self.last_heard = now
        self.ping_sent: float | None = None

    def heard(self, now: float) -> None:
        self.last_heard = now
        self.ping_sent = None

    def ping_due(self, now: float) -> bool:
        """Whether to send a PING at ``now``; raises TimeoutError when the
        last one went unanswered too long."""
        if self.ping_sent is not None:
            if now - self.ping_sent >= LIVENESS_INTERVAL:
                raise TimeoutError("no answer to PING on the wake-up channel")
            return False
        return now - self.last_heard >= LIVENESS_INTERVAL

    def next_check(self) -> float:
        """When ``ping_due`` may next say something new."""
        return (self.last_heard if self.ping_sent is None else self.ping_sent) + LIVENESS_INTERVAL


class Wakeup(threading.Event):
    """A waiting thread's event.

    ``fired``: its turn came (``handed`` set when the lease was handed to it)
    or the channel asks everyone to look again. ``promoted``: it is to read
    the channel for the others. Both change only under the notifier's mutex.
    ``needs_channel``: set by the waiter while it is queued without the
    channel (it was down): it is woken to queue again once the channel is up.
    """

    handed: Handed | None = None
    fired: bool = False
    promoted: bool = False
    needs_channel: bool = False


class AsyncWakeup(asyncio.Event):
    """A waiting task's event; ``handed`` as for ``Wakeup``."""

    handed: Handed | None = None
    needs_channel: bool = False

    async def take(self, timeout: float) -> Handed | None:
        """Sleep until set or ``timeout`` passes; the lease handed over (if
        any), and the event cleared for the next sleep."""
        with contextlib.suppress(asyncio.TimeoutError):
            await wait_for(self.wait(), timeout)
        handed, self.handed = self.handed, None
        self.clear()
        return handed


_Plain = TypeVar("_Plain")
_Sharded = TypeVar("_Sharded")


def _pool_of(client: Any) -> Any:
    """What a notifier is registered for: the client's pool, or the client
    itself when it has none (a Cluster)."""
    pool = getattr(client, "connection_pool", None)
    return client if pool is None else pool


def found(registry: dict[tuple[int, str], tuple[Any, Any]], client: Any, keyspace: KeySpace) -> Any:
    """The notifier in ``registry`` for the client's pool and prefix, or None.
    A dict read, safe without the registry's lock: every acquire that may
    wait asks, and only the first one makes it (``registered``)."""
    pool = _pool_of(client)
    entry = registry.get((id(pool), keyspace.prefix))
    return entry[1] if entry is not None and entry[0] is pool else None


def registered(
    registry: dict[tuple[int, str], tuple[Any, Any]],
    client: Any,
    keyspace: KeySpace,
    plain: Callable[[Any, KeySpace], _Plain],
    sharded: Callable[[Any, KeySpace], _Sharded],
) -> _Plain | _Sharded:
    """The notifier in ``registry`` for the client's pool and prefix, made if
    missing: ``sharded`` for a Cluster (which has no single pool), else ``plain``."""
    notifier = found(registry, client, keyspace)
    if notifier is None:
        pool = _pool_of(client)
        notifier = (sharded if is_cluster(client) else plain)(client, keyspace)
        registry[(id(pool), keyspace.prefix)] = (pool, notifier)
    return notifier
