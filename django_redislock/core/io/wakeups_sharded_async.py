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
connections subscribe them one per command instead (``node_pubsub``).

This asyncio source is the one place these decisions are written; the thread
notifier (``wakeups_sharded.py``) is generated from it. Where a thread and a
task differ (a listener is a thread or a task, the state is guarded by a
mutex or by the loop, a listener's client is the Cluster client's or its
own), the code names ``_wakeup_prims_async.py``, whose twin says what it
means for threads. Among those names is ``Waiters``, a waiter's turn
(register, sleep, unregister) and a listener's reading of a message: steps of
``ShardedBase`` that threads take under the notifier's mutex and a loop takes
bare, written once per world so that neither pays a call the other needs.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, cast

from ..clients import AsyncRedisClient
from ..engine.keys import KeySpace
from . import breaker
from ._wakeup_prims_async import (
    Cluster,
    Mutex,
    Runner,
    Waiters,
    at_home,
    close_node_client,
    close_pubsub,
    connected,
    home,
    node_client,
    node_pubsub,
    opened_here,
    running,
    sleep,
    start,
)
from .calls_async import refresh_slots_async
from .interrupts_async import Cancelled
from .wakeups_base import (
    Liveness,
    NodeListenerBase,
    Reconnect,
    SubscribedTag,
    logger,
)

__all__ = ["AsyncShardedNotifier"]


class _AsyncNodeListener(NodeListenerBase):
    """Reads one node's sharded subscriptions, in a runner of its own."""

    def __init__(self, owner: AsyncShardedNotifier, name: str, redis_client: Any) -> None:
        super().__init__(name, owner._unsharded)
        self.redis = redis_client
        self.owner = owner
        # Guards ``wanted`` and ``pubsub`` against the owner's calls (threads).
        self.lock = Mutex()
        self.runner: Runner | None = None

    async def add(self, channel: bytes) -> None:
        with self.lock:
            self.wanted.add(channel)
            if self.pubsub is not None:
                try:
                    await self.command(self.pubsub, "subscribe")(channel)
                except Exception as exc:  # the reader notices and reconnects
                    logger.info("could not subscribe %r on %s: %s", channel, self.name, exc)

    async def remove(self, channel: bytes) -> None:
        with self.lock:
            self.forget(channel)
            if self.pubsub is not None:
                with contextlib.suppress(Exception):
                    await self.command(self.pubsub, "unsubscribe")(channel)

    async def run(self) -> None:
        reconnect = Reconnect()
        delay = 0.0
        try:
            while True:
                pubsub = node_pubsub(self.redis)
                try:
                    with self.lock:
                        # One SSUBSCRIBE per channel: they are in different slots.
                        for channel in sorted(self.wanted):
                            await self.command(pubsub, "subscribe")(channel)
                        self.pubsub = pubsub
                    reconnect.up(time.monotonic())
                    if await self._listen():
                        return
                except Cancelled:
                    raise
                except Exception as exc:
                    delay = self.lost(exc, reconnect)
                finally:
                    with self.lock:
                        self.pubsub = None
                    await close_pubsub(pubsub)
                    await self.owner._listener_down(self)
                if self.owner._retire(self):
                    return
                await sleep(delay)
        finally:
            await close_node_client(self.redis)

    async def _listen(self) -> bool:
        """Read until the connection fails (raises) or the listener retires (True)."""
        liveness = Liveness(time.monotonic())
        self.checked_at = liveness.last_heard
        while True:
            if connected(self.pubsub):
                message = await self.pubsub.get_message(timeout=1.0)
            else:
                await sleep(0.05)
                message = None
            now = time.monotonic()
            if message is not None:
                liveness.heard(now)
                await self.owner._handle(message, self)
            if self.upkeep_due(now):
                await self.owner._maintain(self)
                if self.idle(now):
                    return self.owner._retire(self)
            # Pinged only while a tag is wanted: an empty listener retires.
            if (
                message is None
                and connected(self.pubsub)
                and liveness.ping_due(now)
                and self.wanted
            ):
                with self.lock:
                    await self.pubsub.ping()
                liveness.ping_sent = now


class AsyncShardedNotifier(Waiters):
    """The notifier of a Cluster client (``get_async_notifier``): SSUBSCRIBE per waited-on tag."""

    def __init__(self, client: AsyncRedisClient, keyspace: KeySpace) -> None:
        # Made only for a client that ``is_cluster`` says is one (``get_async_notifier``).
        super().__init__(cast("Cluster", client), keyspace)
        self._listeners: dict[str, _AsyncNodeListener] = {}
        self._home = home()
        breaker.on_open(self._on_breaker_open)

    def _on_breaker_open(self, opened: breaker.Breaker) -> None:
        # A node of this Cluster timed out: every waiter looks again now (one
        # on another node at the cost of a round trip), and those of that
        # node fail fast rather than sleep out their wait. Called from
        # whichever thread saw the timeout.
        if opened_here(self._client, opened):
            at_home(self._home, self._wake_everyone)

    def _wake_everyone(self) -> None:
        with self._mutex:
            for event, _tag in list(self._slots.values()):
                event.set()

    # -- waiters' side (registering and sleeping: ``Waiters``) ---------------
    async def wait_ready(self, timeout: float, tag: bytes = b"") -> bool:
        state = self._tags.get(tag)
        if state is None:
            return False
        return await state.ready.within(timeout)

    # -- listeners ------------------------------------------------------------
    async def _route(self, state: SubscribedTag) -> None:
        """Subscribe a tag on the node that owns its slot (under the mutex)."""
        if state.node is not None:
            return
        try:
            node = self._node_of(state.channel)
            listener = self._listeners.get(node.name)
            fresh = listener is None or not running(listener.runner)
            redis_client = node_client(self._client, node) if fresh else None
        except Exception as exc:  # slot not covered yet: the next maintenance retries
            logger.info("no node for wake-up channel %r yet: %s", state.channel, exc)
            return
        state.node = node.name
        if listener is None or fresh:
            listener = _AsyncNodeListener(self, node.name, redis_client)
            self._listeners[node.name] = listener
            listener.wanted.add(state.channel)
            listener.runner = start(listener.run, f"redislock-notify-{node.name}")
            return
        await listener.add(state.channel)

    async def _follow(self, listener: _AsyncNodeListener, dropped: list[bytes]) -> None:
        """``listener``'s node dropped ``dropped`` unasked: forget them there,
        read the slot map again and subscribe their tags where it says (or at
        the next upkeep, if the map was read less than a second ago)."""
        for channel in dropped:
            await listener.remove(channel)
        if self._map_due():
            await refresh_slots_async(self._client)
            with self._mutex:
                for state in self._unrouted():
                    await self._route(state)

    async def _maintain(self, listener: _AsyncNodeListener) -> None:
        """Once a second per listener: drop idle tags, move tags whose slot moved."""
        now = time.monotonic()
        with self._mutex:
            unrouted = bool(self._unrouted())
        if unrouted and self._map_due():
            # Tags nobody serves: their node is gone, or dropped them.
            await refresh_slots_async(self._client)
        drop: list[tuple[_AsyncNodeListener, bytes]] = []
        with self._mutex:
            for state in self._drop_idle(now):
                owner = self._listeners.get(state.node or "")
                if owner is not None:
                    drop.append((owner, state.channel))
            for state in list(self._tags.values()):
                if state.node is None and state.users > 0:
                    await self._route(state)
                elif state.node == listener.name and self._moved(state, listener.name):
                    state.ready.clear()
                    state.node = None
                    drop.append((listener, state.channel))
                    await self._route(state)
        # Unsubscribed outside the mutex: waiters need not wait on the node.
        for owner, channel in drop:
            await owner.remove(channel)

    async def _listener_down(self, listener: _AsyncNodeListener) -> None:
        with self._mutex:
            served = any(s.node == listener.name and s.users > 0 for s in self._tags.values())
        if served and self._map_due():
            # The node may be gone for good (a failover): ask where its slots went.
            await refresh_slots_async(self._client)
        with self._mutex:
            self._listener_lost(listener.name)
            with listener.lock:
                listener.wanted.clear()
            # The listener stays the node's: a tag routed to the node again joins
            # it, and it reconnects after its back-off (Reconnect), not at once.
            for state in self._unrouted():
                await self._route(state)

    def _retire(self, listener: _AsyncNodeListener) -> bool:
        """Whether ``listener`` is to end: no longer the node's, or nothing to read."""
        with self._mutex, listener.lock:
            if self._listeners.get(listener.name) is not listener:
                return True
            if listener.wanted:
                return False
            del self._listeners[listener.name]
            return True
