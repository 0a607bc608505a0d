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
while it is in use and for ``TAG_IDLE`` seconds after, then is dropped. Each
listener checks once a second that its tags still belong to its node (slot
moved, failover) and moves them otherwise; waiters of a tag are woken to look
again whenever its subscription was lost, so a missed message costs at most
the time the lock's state needs to change by itself, as on one server.

A node without sharded pub/sub (Redis before 7.0) refuses SSUBSCRIBE as an
unknown command. Its listener then subscribes the same channels with plain
SUBSCRIBE, and the waiter entries of those tags carry ``p``: the script
PUBLISHes on the lock's node, where the listener is, so the count of receivers
it sees is still ours (a Cluster also copies the message to every other node,
which costs bus traffic and nothing else). Which kind a tag is on is learnt
from its subscription's confirmation, so a Cluster that mixes versions is
served node by node.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any, cast

from ..clients import RedisClient
from ..engine.keys import KeySpace
from .notify_sharded_base import (
    NodeListenerBase,
    ShardedBase,
    SubscribedTag,
    logger,
    no_sharded_pubsub,
)
from .wakeup import Handed, Liveness, Reconnect, Wakeup

if TYPE_CHECKING:
    import redis
    from redis.cluster import RedisCluster

# ShardedBase and SubscribedTag are shared with the asyncio twin (notify_sharded_base.py).
__all__ = ["TAG_IDLE", "ShardedBase", "ShardedNotifier", "SubscribedTag", "no_sharded_pubsub"]

# A tag nobody waits on stays subscribed this long: a busy lock does not pay
# a subscription round trip for every contended acquire.
TAG_IDLE = 30.0


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
                    self.pubsub = self.redis.pubsub()
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
            self._on_message(message, node)

    def _maintain(self, listener: _NodeListener) -> None:
        """Once a second per listener: drop idle tags, move tags whose slot moved."""
        now = time.monotonic()
        drop: list[bytes] = []
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
                            self._wake_tag(tag)
        for channel in drop:
            listener.remove(channel)

    def _listener_down(self, listener: _NodeListener) -> None:
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
