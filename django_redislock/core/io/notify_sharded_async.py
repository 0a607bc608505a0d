"""Wake-ups on a Redis Cluster for asyncio waiters: ``notify_sharded.py``'s twin.

The same sharded channels, one per lock slot, read by one task per node per
event loop instead of a thread; plain SUBSCRIBE on a node that has no sharded
pub/sub, following the slot's primary, and one SSUBSCRIBE per channel on a
connection made anew, as there.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any, cast

from redis.asyncio.client import PubSub as AsyncPubSub

from ..clients import AsyncRedisClient
from ..engine.keys import KeySpace
from ..engine.wakeup_message import Handed
from . import breaker, notify_sharded
from .calls_async import refresh_slots_async
from .notify_sharded_base import NodeListenerBase, ShardedBase, SubscribedTag, logger
from .wakeup import AsyncWakeup, Liveness, Reconnect

if TYPE_CHECKING:
    import redis.asyncio
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

__all__ = ["AsyncShardedNotifier"]


class _AsyncNodeListener(NodeListenerBase):
    """Reads one node's sharded subscriptions in a task of its own."""

    def __init__(
        self, owner: AsyncShardedNotifier, name: str, redis_client: redis.asyncio.Redis
    ) -> None:
        super().__init__(name, owner._unsharded)
        self.redis = redis_client
        self.owner = owner
        self.task: asyncio.Task[None] | None = None

    async def add(self, channel: bytes) -> None:
        self.wanted.add(channel)
        if self.pubsub is not None:
            try:
                await self.command(self.pubsub, "subscribe")(channel)
            except Exception as exc:
                logger.info("could not subscribe %r on %s: %s", channel, self.name, exc)

    async def remove(self, channel: bytes) -> None:
        self.forget(channel)
        if self.pubsub is not None:
            with contextlib.suppress(Exception):
                await self.command(self.pubsub, "unsubscribe")(channel)

    async def run(self) -> None:
        reconnect = Reconnect()
        delay = 0.0
        try:
            while True:
                pubsub = _async_pubsub(self.redis)
                try:
                    for channel in sorted(self.wanted):
                        await self.command(pubsub, "subscribe")(channel)
                    self.pubsub = pubsub
                    reconnect.up(time.monotonic())
                    if await self._listen():
                        return
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    delay = self.lost(exc, reconnect)
                finally:
                    self.pubsub = None
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()
                    await self.owner._listener_down(self)
                if self.owner._retire(self):
                    return
                await asyncio.sleep(delay)
        finally:
            with contextlib.suppress(Exception):
                await self.redis.aclose()

    async def _listen(self) -> bool:
        liveness = Liveness(time.monotonic())
        self.checked_at = liveness.last_heard
        while True:
            if self.pubsub.connection is None:
                await asyncio.sleep(0.05)
                message = None
            else:
                message = await self.pubsub.get_message(timeout=1.0)
            now = time.monotonic()
            if message is not None:
                liveness.heard(now)
                dropped = self.owner._on_message(message, self.name)
                if dropped:
                    await self.owner._follow(self, dropped)
            if self.upkeep_due(now):
                await self.owner._maintain(self)
                if self.idle(now):
                    return self.owner._retire(self)
            connected = self.pubsub.connection is not None
            if message is None and connected and liveness.ping_due(now) and self.wanted:
                await self.pubsub.ping()
                liveness.ping_sent = now


class _ShardedPubSub(AsyncPubSub):
    """Sharded pub/sub for redis-py before 5.1, whose asyncio ``PubSub`` lacks it.

    The raw commands work there (their replies come back from ``get_message()``
    as "ssubscribe"/"smessage" messages); what is missing is subscribing the
    channels again when the connection comes back, done here as later
    redis-py versions do it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sharded: set[bytes] = set()

    # Only ever instantiated where the base class has no such methods.
    async def ssubscribe(self, channel: bytes) -> None:  # type: ignore[override]
        await self.execute_command("SSUBSCRIBE", channel)
        # Recorded after sending, as redis-py does: a reconnect while sending
        # must not subscribe it twice.
        self._sharded.add(channel)

    async def sunsubscribe(self, channel: bytes) -> None:  # type: ignore[override]
        self._sharded.discard(channel)
        await self.execute_command("SUNSUBSCRIBE", channel)

    async def on_connect(self, connection: Any) -> None:
        await super().on_connect(connection)
        for channel in sorted(self._sharded):
            await self.execute_command("SSUBSCRIBE", channel)


class _SlotwisePubSub(AsyncPubSub):
    """redis-py's asyncio ``PubSub`` (5.1 and later), but a connection made
    anew subscribes its sharded channels again one per SSUBSCRIBE: they live
    in different slots, and Redis refuses one command across slots
    (CROSSSLOT). ``notify_sharded._SlotwisePubSub``'s twin."""

    async def on_connect(self, connection: Any) -> None:
        sharded = getattr(self, "shard_channels", None)
        if not sharded:
            await super().on_connect(connection)
            return
        self.shard_channels = {}
        try:
            await super().on_connect(connection)
        finally:
            self.shard_channels = sharded
        for channel in list(sharded):
            await self.execute_command("SSUBSCRIBE", channel)


def _async_pubsub(client: redis.asyncio.Redis) -> Any:
    """A pubsub of ``client`` that subscribes one sharded channel per command."""
    pubsub = client.pubsub()
    if not hasattr(pubsub, "ssubscribe"):
        return _ShardedPubSub(client.connection_pool)
    if type(pubsub) is AsyncPubSub:
        pubsub.__class__ = _SlotwisePubSub
    return pubsub


def _async_node_client(node: Any) -> redis.asyncio.Redis:
    """A ``redis.asyncio.Redis`` for one cluster node, with the cluster's settings."""
    import redis.asyncio

    kwargs = {
        k: v
        for k, v in node.connection_kwargs.items()
        if k not in ("event_dispatcher", "response_callbacks", "connection_pool")
    }
    pool = redis.asyncio.ConnectionPool(connection_class=node.connection_class, **kwargs)
    return redis.asyncio.Redis(connection_pool=pool)


class AsyncShardedNotifier(ShardedBase["AsyncRedisCluster"]):
    """``AsyncNotifier`` for ``redis.asyncio.cluster.RedisCluster``."""

    def __init__(self, client: AsyncRedisClient, keyspace: KeySpace) -> None:
        # Made only for a client that ``is_cluster`` says is one (``get_async_notifier``).
        super().__init__(cast("AsyncRedisCluster", client), keyspace)
        self._listeners: dict[str, _AsyncNodeListener] = {}
        self._pending: set[asyncio.Task[None]] = set()
        self._loop = asyncio.get_running_loop()
        breaker.on_open(self._on_breaker_open)

    def _on_breaker_open(self, opened: breaker.Breaker) -> None:
        # As the thread notifier does; called from whichever thread saw the timeout.
        if any(known is opened for known in breaker.node_breakers(self._client)):
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self._loop.call_soon_threadsafe(self._wake_everyone)

    def _wake_everyone(self) -> None:
        for event, _tag in list(self._slots.values()):
            event.set()

    def register(self, token: str, tag: bytes = b"") -> AsyncWakeup:
        event = AsyncWakeup()
        unrouted = self._join(token, event, tag, asyncio.Event)
        if unrouted is not None:
            self._spawn(self._route(unrouted))
        return event

    def register_if_ready(self, token: str, tag: bytes = b"") -> AsyncWakeup | None:
        """Register ``token`` if its tag's channel is subscribed, else None."""
        return self.register(token, tag) if self.is_ready(tag) else None

    async def wait(self, event: AsyncWakeup, timeout: float) -> Handed | None:
        """Sleep until a listener sets ``event`` or ``timeout`` passes; the
        fence of a lease handed over, else None."""
        return await event.take(timeout)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def unregister(self, token: str) -> None:
        self._forget(token)

    async def wait_ready(self, timeout: float, tag: bytes = b"") -> bool:
        state = self._tags.get(tag)
        if state is None:
            return False
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(state.ready.wait(), timeout)
        return state.ready.is_set()

    async def _route(self, state: SubscribedTag) -> None:
        if state.node is not None:
            return
        try:
            node = self._node_of(state.channel)
        except Exception as exc:
            logger.info("no node for wake-up channel %r yet: %s", state.channel, exc)
            return
        state.node = node.name
        listener = self._listeners.get(node.name)
        if listener is None or listener.task is None or listener.task.done():
            listener = _AsyncNodeListener(self, node.name, _async_node_client(node))
            self._listeners[node.name] = listener
            listener.wanted.add(state.channel)
            listener.task = asyncio.get_running_loop().create_task(
                listener.run(), name=f"redislock-notify-{node.name}"
            )
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
            for state in self._unrouted():
                await self._route(state)

    async def _maintain(self, listener: _AsyncNodeListener) -> None:
        now = time.monotonic()
        if self._unrouted() and self._map_due():
            # Tags nobody serves: their node is gone, or dropped them.
            await refresh_slots_async(self._client)
        for tag, state in list(self._tags.items()):
            if state.users <= 0 and now - state.idle_since > notify_sharded.TAG_IDLE:
                del self._tags[tag]
                self._by_channel.pop(state.channel, None)
                owner = self._listeners.get(state.node or "")
                if owner is not None:
                    await owner.remove(state.channel)
                continue
            if state.node is None and state.users > 0:
                await self._route(state)
            elif state.node == listener.name:
                with contextlib.suppress(Exception):
                    if self._node_of(state.channel).name != listener.name:
                        state.ready.clear()
                        state.node = None
                        await listener.remove(state.channel)
                        await self._route(state)

    async def _listener_down(self, listener: _AsyncNodeListener) -> None:
        served = any(s.node == listener.name and s.users > 0 for s in self._tags.values())
        if served and self._map_due():
            # The node may be gone for good (a failover): ask where its slots went.
            await refresh_slots_async(self._client)
        self._listener_lost(listener.name)
        listener.wanted.clear()
        # The listener stays the node's: a tag routed to the node again joins
        # it, and it reconnects after its back-off (Reconnect), not at once.
        for state in self._unrouted():
            await self._route(state)

    def _retire(self, listener: _AsyncNodeListener) -> bool:
        if self._listeners.get(listener.name) is not listener:
            return True
        if listener.wanted:
            return False
        del self._listeners[listener.name]
        return True
