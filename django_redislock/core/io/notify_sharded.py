"""Wake-ups on a Redis Cluster: sharded pub/sub, one channel per lock slot.

Plain PUBLISH on a Cluster is broadcast to every node over the cluster bus,
and a channel has no slot, so a lock script could not address it safely. On a
Cluster each process therefore listens on one *sharded* channel per hash tag
it is waiting on, ``P:N:{T}:<process id>``: it hashes to the same slot as the
lock's keys, so the script that frees the lock SPUBLISHes on its own node and
the waiter entry's address starts with ``s``.

Per process (and cluster client) there is one listener per node holding
subscribed tags; its connection comes from the cluster client's own node
settings. A tag is subscribed the first time a local waiter needs it (the
waiter queues only once the subscription is confirmed), stays subscribed
while it is in use and for ``TAG_IDLE`` seconds after, then is dropped.

Subscriptions follow the slot's primary. A node that no longer serves a
slot (it moved, or a failover made the node a replica) drops our
subscriptions of it unasked, and a listener may lose its node: either way
the slot map is read again (``MAP_REFRESH_INTERVAL``) and the tags are
subscribed where it says. Each listener also checks once a second that its
tags still belong to its node by the client's map (which every MOVED a lock
call meets updates) and moves them otherwise. The waiters of a tag are woken
to look again once it is subscribed again (a wake-up may have been missed
meanwhile), not when it was lost: a missed message costs at most the time
the lock's state needs to change by itself, as on one server.

A node counts only its own listeners as receivers of a wake-up, while Redis
delivers it to every node of the shard: a listener left on a replica hears
it. The scripts therefore never take a count of 0 for a dead waiter on a
Cluster, and hand a waiter not seen listening on the lock's node a claim it
confirms (``_lock.lua``, ``hand_off``); following the primary keeps that
rare.

A node without sharded pub/sub (Redis before 7.0) refuses SSUBSCRIBE as an
unknown command. Its listener then subscribes the same channels with plain
SUBSCRIBE, and the waiter entries of those tags carry ``c``: the script
PUBLISHes on the lock's node (a Cluster copies the message to every other
node, which costs bus traffic, and is why a count there is no proof either).
Which kind a tag is on is learnt from its subscription's confirmation, so a
Cluster that mixes versions is served node by node.

redis-py subscribes a connection made anew to all its sharded channels with
one SSUBSCRIBE, which Redis refuses across slots (CROSSSLOT): the listeners'
connections subscribe them one per command instead (``slotwise``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any, cast

from redis.client import PubSub

from ..clients import RedisClient
from ..engine.keys import KeySpace
from ..engine.wakeup_message import Handed
from . import breaker
from .calls import refresh_slots
from .notify_sharded_base import (
    NodeListenerBase,
    ShardedBase,
    SubscribedTag,
    logger,
    no_sharded_pubsub,
)
from .wakeup import Liveness, Reconnect, Wakeup

if TYPE_CHECKING:
    import redis
    from redis.cluster import RedisCluster

# ShardedBase and SubscribedTag are shared with the asyncio twin (notify_sharded_base.py).
__all__ = [
    "TAG_IDLE",
    "ShardedBase",
    "ShardedNotifier",
    "SubscribedTag",
    "no_sharded_pubsub",
    "slotwise",
]

# A tag nobody waits on stays subscribed this long: a busy lock does not pay
# a subscription round trip for every contended acquire.
TAG_IDLE = 30.0


class _SlotwisePubSub(PubSub):
    """redis-py's ``PubSub``, but a connection made anew subscribes its
    sharded channels again one per SSUBSCRIBE: they live in different slots,
    and Redis refuses one command across slots (CROSSSLOT)."""

    def on_connect(self, connection: Any) -> None:
        sharded = getattr(self, "shard_channels", None)
        if not sharded:
            super().on_connect(connection)
            return
        self.shard_channels = {}
        try:
            super().on_connect(connection)
        finally:
            self.shard_channels = sharded
        for channel in list(sharded):
            self.execute_command("SSUBSCRIBE", channel)


def slotwise(pubsub: Any) -> Any:
    """``pubsub`` (a node client's ``pubsub()``), made to subscribe its sharded
    channels again one per command when its connection is made anew."""
    if type(pubsub) is PubSub:
        pubsub.__class__ = _SlotwisePubSub
    return pubsub


class _NodeListener(NodeListenerBase):
    """Reads one node's sharded subscriptions in a thread of its own."""

    def __init__(self, owner: ShardedNotifier, name: str, redis_client: redis.Redis) -> None:
        super().__init__(name, owner._unsharded)
        self.redis = redis_client
        self.owner = owner
        self.lock = threading.Lock()
        self.thread = threading.Thread(
            target=self._run, name=f"redislock-notify-{name}", daemon=True
        )

    def add(self, channel: bytes) -> None:
        with self.lock:
            self.wanted.add(channel)
            if self.pubsub is not None:
                try:
                    self.command(self.pubsub, "subscribe")(channel)
                except Exception as exc:  # the reader notices and reconnects
                    logger.info("could not subscribe %r on %s: %s", channel, self.name, exc)

    def remove(self, channel: bytes) -> None:
        with self.lock:
            self.forget(channel)
            if self.pubsub is not None:
                with contextlib.suppress(Exception):
                    self.command(self.pubsub, "unsubscribe")(channel)

    def _run(self) -> None:
        reconnect = Reconnect()
        delay = 0.0
        while True:
            try:
                with self.lock:
                    self.pubsub = slotwise(self.redis.pubsub())
                    # One SSUBSCRIBE per channel: they are in different slots.
                    for channel in sorted(self.wanted):
                        self.command(self.pubsub, "subscribe")(channel)
                reconnect.up(time.monotonic())
                if self._listen():
                    return
            except Exception as exc:
                delay = self.lost(exc, reconnect)
            finally:
                with self.lock:
                    pubsub, self.pubsub = self.pubsub, None
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        pubsub.close()
                self.owner._listener_down(self)
            if self.owner._retire(self):
                return
            time.sleep(delay)

    def _listen(self) -> bool:
        """Read until the connection fails (raises) or the listener retires (True)."""
        liveness = Liveness(time.monotonic())
        self.checked_at = liveness.last_heard
        while True:
            message = self.pubsub.get_message(timeout=1.0)
            now = time.monotonic()
            if message is not None:
                self.owner._handle(message, self.name)
                liveness.heard(now)
            if self.upkeep_due(now):
                self.owner._maintain(self)
                with self.lock:
                    if self.idle(now):
                        return self.owner._retire(self)
            # Pinged only while a tag is wanted: an empty listener retires.
            if message is None and liveness.ping_due(now) and self.wanted:
                with self.lock:
                    self.pubsub.ping()
                liveness.ping_sent = now


class ShardedNotifier(ShardedBase["RedisCluster"]):
    """``Notifier`` for a sync ``RedisCluster``: SSUBSCRIBE per waited-on tag."""

    def __init__(self, client: RedisClient, keyspace: KeySpace) -> None:
        # Made only for a client that ``is_cluster`` says is one (``get_notifier``).
        super().__init__(cast("RedisCluster", client), keyspace)
        self._mutex = threading.RLock()
        self._listeners: dict[str, _NodeListener] = {}
        breaker.on_open(self._on_breaker_open)

    def _on_breaker_open(self, opened: breaker.Breaker) -> None:
        # A node of this Cluster timed out: every waiter looks again now (one
        # on another node at the cost of a round trip), and those of that
        # node fail fast rather than sleep out their wait.
        pools = (
            getattr(node.redis_connection, "connection_pool", None)
            for node in self._client.get_nodes()
        )
        if any(pool is not None and breaker.breaker_of(pool) is opened for pool in pools):
            with self._mutex:
                for event, _tag in list(self._slots.values()):
                    event.set()

    # -- waiters' side -----------------------------------------------------
    def register(self, token: str, tag: bytes = b"") -> Wakeup:
        event = Wakeup()
        with self._mutex:
            unrouted = self._join(token, event, tag, threading.Event)
            if unrouted is not None:
                self._route(unrouted)
        return event

    def register_if_ready(self, token: str, tag: bytes = b"") -> Wakeup | None:
        """Register ``token`` if its tag's channel is subscribed, else None."""
        with self._mutex:
            if not self.wait_ready(0, tag):
                return None
            return self.register(token, tag)

    def unregister(self, token: str) -> None:
        with self._mutex:
            self._forget(token)

    def wait(self, event: Wakeup, timeout: float) -> Handed | None:
        """Sleep until a listener sets ``event`` or ``timeout`` passes; the
        fence of a lease handed over, else None."""
        event.wait(timeout)
        with self._mutex:
            handed, event.handed = event.handed, None
            event.clear()
        return handed

    def wait_ready(self, timeout: float, tag: bytes = b"") -> bool:
        state = self._tags.get(tag)
        if state is None:
            return False
        return bool(state.ready.wait(timeout))

    # -- listeners ------------------------------------------------------------
    def _route(self, state: SubscribedTag) -> None:
        """Subscribe a tag on the node that owns its slot (under the mutex)."""
        try:
            node = self._node_of(state.channel)
            redis_client = self._client.get_redis_connection(node)
        except Exception as exc:  # slot not covered yet: the next maintenance retries
            logger.info("no node for wake-up channel %r yet: %s", state.channel, exc)
            return
        listener = self._listeners.get(node.name)
        if listener is None or not listener.thread.is_alive():
            listener = _NodeListener(self, node.name, redis_client)
            self._listeners[node.name] = listener
            state.node = node.name
            listener.wanted.add(state.channel)
            listener.thread.start()
            return
        state.node = node.name
        listener.add(state.channel)

    def _handle(self, message: dict[str, Any], node: str) -> None:
        with self._mutex:
            dropped = self._on_message(message, node)
        if dropped:
            self._follow(node, dropped)

    def _follow(self, name: str, dropped: list[bytes]) -> None:
        """Node ``name`` dropped ``dropped`` unasked: forget them there, read
        the slot map again and subscribe their tags where it says (or at the
        next upkeep, if the map was read less than a second ago)."""
        listener = self._listeners.get(name)
        if listener is not None:
            for channel in dropped:
                listener.remove(channel)
        if self._map_due():
            refresh_slots(self._client)
            with self._mutex:
                for state in self._unrouted():
                    self._route(state)

    def _maintain(self, listener: _NodeListener) -> None:
        """Once a second per listener: drop idle tags, move tags whose slot moved."""
        now = time.monotonic()
        drop: list[bytes] = []
        with self._mutex:
            unrouted = bool(self._unrouted())
        if unrouted and self._map_due():
            # Tags nobody serves: their node is gone, or dropped them.
            refresh_slots(self._client)
        with self._mutex:
            for tag, state in list(self._tags.items()):
                if state.users <= 0 and now - state.idle_since > TAG_IDLE:
                    del self._tags[tag]
                    self._by_channel.pop(state.channel, None)
                    if state.node == listener.name:
                        drop.append(state.channel)
                    elif state.node is not None and state.node in self._listeners:
                        self._listeners[state.node].remove(state.channel)
                    continue
                if state.node is None and state.users > 0:
                    self._route(state)
                elif state.node == listener.name:
                    with contextlib.suppress(Exception):
                        if self._node_of(state.channel).name != listener.name:
                            state.ready.clear()
                            drop.append(state.channel)
                            self._route(state)
        for channel in drop:
            listener.remove(channel)

    def _listener_down(self, listener: _NodeListener) -> None:
        with self._mutex:
            served = any(s.node == listener.name and s.users > 0 for s in self._tags.values())
        if served and self._map_due():
            # The node may be gone for good (a failover): ask where its slots went.
            refresh_slots(self._client)
        with self._mutex:
            self._listener_lost(listener.name)
            with listener.lock:
                listener.wanted.clear()
            for state in self._unrouted():
                self._route(state)

    def _retire(self, listener: _NodeListener) -> bool:
        with self._mutex, listener.lock:
            if listener.wanted or self._listeners.get(listener.name) is not listener:
                return self._listeners.get(listener.name) is not listener
            del self._listeners[listener.name]
            return True
