"""What every wake-up notifier shares, with no I/O: channels' addresses, their
upkeep, the events waiters sleep on, and the Cluster notifiers' tags and messages.

Below every notifier and driver, so that none of them imports another for it.
What a wake-up message says is the protocol's (``engine/wakeup_message.py``).
The notifiers themselves are ``wakeups.py`` (threads), ``wakeups_async.py``
(asyncio) and, on a Cluster, ``wakeups_sharded_async.py`` with its generated
twin ``wakeups_sharded.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from redis.exceptions import ResponseError

from ..engine.keys import KeySpace
from ..engine.wakeup_message import NO_CHANNEL, Handed, parse_wakeup
from ..topology import is_cluster, is_sentinel
from . import breaker
from .aio_calls import wait_for

if TYPE_CHECKING:
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

__all__ = [
    "FOLLOW_INTERVAL",
    "IDLE_TIMEOUT",
    "LIVENESS_INTERVAL",
    "MAP_REFRESH_INTERVAL",
    "TAG_IDLE",
    "AsyncWakeup",
    "Liveness",
    "NodeListenerBase",
    "PlainChannel",
    "Reconnect",
    "ShardedBase",
    "SubscribedTag",
    "Wakeup",
    "found",
    "logger",
    "moved_from",
    "no_sharded_pubsub",
    "opened_for",
    "plain_address",
    "registered",
]

logger = logging.getLogger("django_redislock.notify")

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


class Wakeup:
    """A waiting thread's event: ``threading.Event``'s ``set``, ``clear``,
    ``is_set`` and ``wait``, for the one thread that waits on it.

    ``fired``: its turn came (``handed`` set when the lease was handed to it)
    or the channel asks everyone to look again. ``promoted``: it is to read
    the channel for the others. Both change only under the notifier's mutex.
    ``needs_channel``: set by the waiter while it is queued without the
    channel (it was down): it is woken to queue again once the channel is up.

    Made for every contended acquire, and most are never slept on (a waiter
    alone in its process reads its own turn off the channel): one lock, held
    while the event is clear, costs a tenth of an Event's condition to make.
    ``set`` and ``clear`` are called under the notifier's mutex, ``clear``
    and ``wait`` by the waiting thread alone.
    """

    __slots__ = ("_flag", "_held", "fired", "handed", "needs_channel", "promoted")

    def __init__(self) -> None:
        self._flag = False
        self._held = threading.Lock()
        self._held.acquire()
        self.handed: Handed | None = None
        self.fired = False
        self.promoted = False
        self.needs_channel = False

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        if not self._flag:
            self._flag = True
            self._held.release()

    def clear(self) -> None:
        if self._flag:
            self._flag = False
            self._held.acquire()

    def wait(self, timeout: float) -> bool:
        """Sleep until set or ``timeout`` passes; whether it is set."""
        if self._held.acquire(timeout=max(0.0, timeout)):
            self._held.release()
            return True
        return self._flag

    def take_turn(self) -> Handed | None:
        """The lease handed over (if any), and the flags reset for the next
        wait (the caller holds the notifier's mutex)."""
        handed, self.handed = self.handed, None
        self.fired = self.promoted = False
        self.clear()  # set by a fire from another thread, or a promotion
        return handed


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


_Waiter = TypeVar("_Waiter", "Wakeup", "AsyncWakeup")


class PlainChannel:
    """What a plain notifier (one channel per process and pool: ``wakeups.py``
    for threads, ``wakeups_async.py`` for a loop) decides about its channel,
    without I/O: how loudly it tells a loss and a recovery, and whom each wakes."""

    def __init__(self, client: Any) -> None:
        # Through Sentinel the channel follows the primary, and its count of
        # receivers proves nothing (``plain_address``).
        self.sentinel = is_sentinel(client)
        self.reconnect = Reconnect()
        # Subscribed before: a confirmation now is a recovery, and wake-ups
        # may have been missed meanwhile.
        self.connected_before = False

    def up(self, now: float, waiters: Iterable[_Waiter]) -> list[_Waiter]:
        """The subscription is confirmed at ``now``: the waiters to wake to
        look again (the notifier's mutex held, in threads)."""
        failures = self.reconnect.up(now)
        if failures:
            logger.info("wake-up channel back after %d attempt(s)", failures)
        # Back after an outage, wake-ups may have been missed; and whoever
        # queued without the channel can now queue with it.
        woken = [w for w in waiters if self.connected_before or w.needs_channel]
        self.connected_before = True
        return woken

    def lost(self, now: float, exc: BaseException, waiting: bool) -> float:
        """The connection failed at ``now``: seconds until the next attempt."""
        delay = self.reconnect.failed(now)
        # One warning per outage, and only if someone is waiting: an idle
        # channel losing its connection affects nobody.
        log = logger.warning if self.reconnect.first and waiting else logger.debug
        log("wake-up channel lost, reconnecting: %s", exc)
        return delay

    @property
    def loss_wakes(self) -> bool:
        """Whether a lost channel wakes every waiter to look again: waiters
        must not sleep on a channel nobody reads. Not through Sentinel: the
        primary may be gone, and a look now would meet it and fail at once;
        the confirmation of the next subscription (where the sentinels say)
        wakes them instead."""
        return not self.sentinel

    def closed(self) -> None:
        """Closed on purpose (idle): the next subscription recovers nothing."""
        self.connected_before = False

    # Through Sentinel: asking where the primary is, off every waiter's path.
    def unanswered(self, exc: BaseException) -> None:
        """No sentinel answered: the channel stays where it is."""
        logger.debug("could not ask the sentinels for the primary: %s", exc)

    def follows(self, primary: Any) -> None:
        """The sentinels named another primary than the channel's: it is
        subscribed there, with no back-off and nothing to warn of."""
        logger.info("the primary moved to %s:%s: the wake-up channel follows", *primary)


def opened_for(client: Any, opened: Any) -> bool:
    """Whether ``opened`` is the breaker of ``client``'s pool: a call to this
    Redis timed out, and its waiters look again now, and fail fast, rather
    than sleep out their wait on a silent channel."""
    pool = getattr(client, "connection_pool", None)
    return pool is not None and opened is breaker.breaker_of(pool)


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


# -- a Cluster's sharded channels ---------------------------------------------

# A node that dropped our subscriptions (its slots moved, or a failover made
# it a replica), or that we lost, has the slot map read again before its
# tags are routed anew: at most once in this many seconds per notifier.
MAP_REFRESH_INTERVAL = 1.0
# A tag nobody waits on stays subscribed this long: a busy lock does not pay
# a subscription round trip for every contended acquire.
TAG_IDLE = 30.0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _channel_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def no_sharded_pubsub(exc: BaseException) -> bool:
    """Whether ``exc`` is a node refusing SSUBSCRIBE as an unknown command:
    Redis before 7.0, or the command renamed away."""
    text = str(exc).lower()
    return isinstance(exc, ResponseError) and "unknown command" in text and "ssubscribe" in text


# Confirmations and messages of plain pub/sub, read as their sharded kinds.
_KINDS = {"message": "smessage", "subscribe": "ssubscribe", "unsubscribe": "sunsubscribe"}


class SubscribedTag:
    """One subscribed hash tag: its channel and who waits on it."""

    __slots__ = ("channel", "users", "idle_since", "node", "ready", "confirmed_before", "mode")

    def __init__(self, channel: bytes, ready: Any) -> None:
        self.channel = channel
        self.users = 0
        self.idle_since = time.monotonic()
        self.node: str | None = None
        self.ready = ready
        self.confirmed_before = False
        # The scripts' publish mode for this tag: s = SPUBLISH, c = PUBLISH
        # (its node has no sharded pub/sub); set by the confirmation.
        self.mode = b"s"


# The Cluster client of a notifier: sync for the thread one, asyncio for the other.
_K = TypeVar("_K", bound="RedisCluster | AsyncRedisCluster")


class ShardedBase(Generic[_K]):
    """What the thread and asyncio sharded notifiers share: tags, slots, nodes."""

    def __init__(self, client: _K, keyspace: KeySpace) -> None:
        self._client: _K = client
        self._keyspace = keyspace
        self.process_id = secrets.token_hex(8)
        self._slots: dict[str, tuple[Any, bytes]] = {}
        self._tags: dict[bytes, SubscribedTag] = {}
        self._by_channel: dict[bytes, bytes] = {}
        # Nodes that refused SSUBSCRIBE: their listeners, present and future,
        # use plain SUBSCRIBE.
        self._unsharded: set[str] = set()
        # When the slot map was last read again (MAP_REFRESH_INTERVAL).
        self._map_read_at = float("-inf")

    # Callers that pass no tag cannot be woken on a Cluster (a channel outside
    # the keys' slot would fail the script): they queue without an address
    # and fall back to their timer, which is bounded by the state's own clock.
    address = NO_CHANNEL
    ready = False

    def channel(self, tag: bytes) -> bytes:
        return self._keyspace.channel(self.process_id, tag)

    def address_for(self, tag: bytes) -> bytes:
        # s = SPUBLISH: the prelude's wake() publishes on the lock's shard;
        # c = PUBLISH, where the tag's node has no sharded pub/sub. Either way
        # the count of receivers is the node's alone (_prelude.lua).
        if not tag:
            return self.address
        state = self._tags.get(tag)
        return (b"s" if state is None else state.mode) + self.channel(tag)

    def _node_of(self, channel: bytes) -> Any:
        # Annotated ``str`` by the asyncio client, which takes bytes keys as every command does.
        return self._client.get_node_from_key(channel)  # type: ignore[arg-type]

    def _wake_tag(self, tag: bytes, *, channel_less_only: bool = False) -> None:
        for event, t in list(self._slots.values()):
            if t == tag and (event.needs_channel or not channel_less_only):
                event.set()

    def _on_message(self, message: dict[str, Any], node: str) -> list[bytes]:
        """Act on a message of node ``node``'s listener. Returns the channels
        the node dropped unasked: the owner reads the slot map again and
        routes their tags anew (``_follow``)."""
        kind = _text(message["type"])
        plain = kind in _KINDS
        kind = _KINDS.get(kind, kind)
        channel = _channel_bytes(message.get("channel", b""))
        if kind == "smessage":
            token, handed = parse_wakeup(message["data"])
            entry = self._slots.get(token)
            if entry is not None:
                entry[0].handed = handed
                entry[0].set()
            return []
        tag = self._by_channel.get(channel)
        state = self._tags.get(tag) if tag is not None else None
        if state is None:
            return []
        if kind == "ssubscribe" and state.node == node:
            state.mode = b"c" if plain else b"s"
            state.ready.set()
            # Subscribed again after losing it, wake-ups may have been missed;
            # and whoever queued without the channel can now queue with it.
            self._wake_tag(tag, channel_less_only=not state.confirmed_before)  # type: ignore[arg-type]
            state.confirmed_before = True
        elif kind == "sunsubscribe" and state.node == node:
            # Not asked for (we forget a tag before unsubscribing it): the
            # node no longer serves its slot (the slot moved, or a failover
            # made the node a replica). Its waiters sleep on: the
            # confirmation on the slot's new node wakes them to look again.
            state.ready.clear()
            state.node = None
            return [channel]
        return []

    def _listener_lost(self, name: str) -> None:
        """The listener of node ``name`` is down: its tags are not subscribed.

        Their waiters are not woken now: on a node that died, a look would
        only fail until its replica takes over. They wake when the tag is
        subscribed again (the confirmation may follow a wake-up they missed),
        or at their timer, as after any lost wake-up.
        """
        for state in self._tags.values():
            if state.node == name:
                state.ready.clear()
                state.node = None

    def _map_due(self) -> bool:
        """Whether the slot map may be read again now (``MAP_REFRESH_INTERVAL``)."""
        now = time.monotonic()
        if now - self._map_read_at < MAP_REFRESH_INTERVAL:
            return False
        self._map_read_at = now
        return True

    def _unrouted(self) -> list[SubscribedTag]:
        """Tags someone waits on that no node's listener serves."""
        return [s for s in self._tags.values() if s.node is None and s.users > 0]

    def is_ready(self, tag: bytes = b"") -> bool:
        state = self._tags.get(tag)
        return state is not None and state.ready.is_set()

    def _join(
        self, token: str, event: Any, tag: bytes, new_ready: Callable[[], Any]
    ) -> SubscribedTag | None:
        """Count a waiter of ``tag`` in; its tag when no node serves it yet.

        ``new_ready``: the kind of event a new tag's subscription sets when
        confirmed (``threading.Event`` or ``asyncio.Event``).
        """
        self._slots[token] = (event, tag)
        if not tag:
            return None
        state = self._tags.get(tag)
        if state is None:
            state = SubscribedTag(self.channel(tag), new_ready())
            self._tags[tag] = state
            self._by_channel[state.channel] = tag
        state.users += 1
        return state if state.node is None else None

    def _forget(self, token: str) -> None:
        """Forget a waiter; its tag stays subscribed, idle from now if it was the last."""
        entry = self._slots.pop(token, None)
        if entry is None:
            return
        state = self._tags.get(entry[1])
        if state is not None:
            state.users -= 1
            if state.users <= 0:
                state.idle_since = time.monotonic()

    def _drop_idle(self, now: float) -> list[SubscribedTag]:
        """Forget the tags nobody has waited on for ``TAG_IDLE``; the owner
        unsubscribes them where they are (``state.node``)."""
        idle = [
            (tag, state)
            for tag, state in self._tags.items()
            if state.users <= 0 and now - state.idle_since > TAG_IDLE
        ]
        for tag, state in idle:
            del self._tags[tag]
            self._by_channel.pop(state.channel, None)
        return [state for _tag, state in idle]

    def _moved(self, state: SubscribedTag, name: str) -> bool:
        """Whether the client's slot map (which every MOVED a lock call meets
        updates) puts ``state``'s channel on another node than ``name``."""
        try:
            return bool(self._node_of(state.channel).name != name)
        except Exception:  # slot not covered: where it goes is the next upkeep's
            return False


class NodeListenerBase:
    """What a node's listener keeps, a thread's or a task's: its channels and connection."""

    def __init__(self, name: str, unsharded: set[str]) -> None:
        self.name = name
        self.wanted: set[bytes] = set()
        self.pubsub: Any = None
        self.empty_since = self.checked_at = time.monotonic()
        self._unsharded = unsharded  # the notifier's: nodes that refused SSUBSCRIBE

    @property
    def sharded(self) -> bool:
        return self.name not in self._unsharded

    def command(self, pubsub: Any, verb: str) -> Any:
        """``pubsub``'s method to ``verb`` ("subscribe", "unsubscribe") a channel
        here: the sharded one, or the plain one on a node without sharded pub/sub."""
        return getattr(pubsub, "s" + verb if self.sharded else verb)

    def upkeep_due(self, now: float) -> bool:
        """Once a second: time to look after this node's tags (the owner's ``_maintain``)."""
        if now - self.checked_at < 1.0:
            return False
        self.checked_at = now
        return True

    def idle(self, now: float) -> bool:
        return not self.wanted and now - self.empty_since > IDLE_TIMEOUT

    def forget(self, channel: bytes) -> None:
        self.wanted.discard(channel)
        if not self.wanted:
            self.empty_since = time.monotonic()

    def lost(self, exc: BaseException, reconnect: Reconnect) -> float:
        """Tell of a lost (or refused) subscription; seconds until the next try."""
        delay = reconnect.failed(time.monotonic())
        if self.sharded and no_sharded_pubsub(exc):
            self._unsharded.add(self.name)
            logger.info("%s has no sharded pub/sub: waking by PUBLISH there", self.name)
        else:
            # One warning per outage; each retry after it is only a debug line.
            log = logger.warning if reconnect.first else logger.debug
            log("wake-up channel on %s lost, reconnecting: %s", self.name, exc)
        return delay
