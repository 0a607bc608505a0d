"""What the thread and asyncio Cluster notifiers share: tags, slots, nodes, messages.

See ``notify_sharded.py`` for the design: one sharded channel per hash tag
waited on, per process, on the node that serves the tag's slot; plain
SUBSCRIBE on a node without sharded pub/sub.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from redis.exceptions import ResponseError

from ..engine.keys import KeySpace
from ..engine.wakeup_message import NO_CHANNEL, parse_wakeup
from .wakeup import IDLE_TIMEOUT, Reconnect

if TYPE_CHECKING:
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

__all__ = [
    "MAP_REFRESH_INTERVAL",
    "NodeListenerBase",
    "ShardedBase",
    "SubscribedTag",
    "logger",
    "no_sharded_pubsub",
]

logger = logging.getLogger("django_redislock.notify")

# A node that dropped our subscriptions (its slots moved, or a failover made
# it a replica), or that we lost, has the slot map read again before its
# tags are routed anew: at most once in this many seconds per notifier.
MAP_REFRESH_INTERVAL = 1.0


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
