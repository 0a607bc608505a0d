"""What a Cluster's sharded notifier does differently under asyncio than in threads.

``wakeups_sharded_async.py`` names only these; its generated sync twin
(``wakeups_sharded.py``) gets the same names from ``_wakeup_prims.py``, which
mean the same for threads. Here a node's listener is a task of the running
loop, the notifier's mutex guards nothing (one loop, no thread in between),
and a listener has a client of its own for its node, closed when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from redis.asyncio.client import PubSub as AsyncPubSub
from redis.asyncio.cluster import RedisCluster as Cluster

from ..engine.wakeup_message import Handed
from . import breaker
from .wakeups_base import AsyncWakeup, ShardedBase, SubscribedTag

if TYPE_CHECKING:
    import redis.asyncio

__all__ = [
    "Cluster",
    "Event",
    "Home",
    "Mutex",
    "Runner",
    "Waiters",
    "at_home",
    "close_node_client",
    "close_pubsub",
    "connected",
    "home",
    "node_client",
    "node_pubsub",
    "opened_here",
    "running",
    "sleep",
    "start",
]


class Event(asyncio.Event):
    """What a tag's subscription sets once confirmed."""

    async def within(self, timeout: float) -> bool:
        """Whether set, waiting up to ``timeout`` seconds for it."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.wait(), timeout)
        return self.is_set()


# A node's listener, running.
Runner = asyncio.Task[None]
# Where a call from another thread (a breaker that opened) is to run.
Home = asyncio.AbstractEventLoop


class Mutex:
    """Nothing to exclude: the notifier's state changes only on its loop."""

    def __enter__(self) -> Mutex:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def home() -> Home:
    return asyncio.get_running_loop()


def at_home(loop: Home, call: Callable[[], None]) -> None:
    """Run ``call`` on ``loop``, from whichever thread is here."""
    with contextlib.suppress(RuntimeError):  # the loop is closed
        loop.call_soon_threadsafe(call)


def start(run: Callable[[], Coroutine[Any, Any, None]], name: str) -> Runner:
    return asyncio.get_running_loop().create_task(run(), name=name)


def running(runner: Runner | None) -> bool:
    return runner is not None and not runner.done()


sleep = asyncio.sleep


def opened_here(client: Any, opened: breaker.Breaker) -> bool:
    """Whether ``opened`` is the breaker of a node of Cluster ``client``."""
    return any(known is opened for known in breaker.node_breakers(client))


class Waiters(ShardedBase["Cluster"]):
    """The waiters' side of the asyncio Cluster notifier, and its reading of a
    message: each a step of ``ShardedBase``'s, with no guard and no call in
    between (the loop is the guard), as cheap as a waiter's turn can be. The
    thread twin takes the notifier's mutex around the same steps; the rest of
    the notifier is generated (``wakeups_sharded_async.py``)."""

    def __init__(self, client: Any, keyspace: Any) -> None:
        super().__init__(client, keyspace)
        self._mutex = Mutex()
        # The routing tasks registrations start, kept until done.
        self._pending: set[asyncio.Task[None]] = set()

    async def _route(self, state: SubscribedTag) -> None:
        raise NotImplementedError  # the notifier's

    async def _follow(self, listener: Any, dropped: list[bytes]) -> None:
        raise NotImplementedError  # the notifier's

    def register(self, token: str, tag: bytes = b"") -> AsyncWakeup:
        event = AsyncWakeup()
        unrouted = self._join(token, event, tag, Event)
        if unrouted is not None:
            task = asyncio.get_running_loop().create_task(self._route(unrouted))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
        return event

    def register_if_ready(self, token: str, tag: bytes = b"") -> AsyncWakeup | None:
        """Register ``token`` if its tag's channel is subscribed, else None."""
        return self.register(token, tag) if self.is_ready(tag) else None

    def unregister(self, token: str) -> None:
        self._forget(token)

    async def wait(self, event: AsyncWakeup, timeout: float) -> Handed | None:
        """Sleep until a listener sets ``event`` or ``timeout`` passes; the
        fence of a lease handed over, else None."""
        return await event.take(timeout)

    async def _handle(self, message: dict[str, Any], listener: Any) -> None:
        """A message of ``listener``'s node."""
        dropped = self._on_message(message, listener.name)
        if dropped:
            await self._follow(listener, dropped)


# -- a node's connection -----------------------------------------------------


def node_client(cluster: Cluster, node: Any) -> redis.asyncio.Redis:
    """A ``redis.asyncio.Redis`` for one cluster node, with the cluster's settings."""
    import redis.asyncio

    kwargs = {
        k: v
        for k, v in node.connection_kwargs.items()
        if k not in ("event_dispatcher", "response_callbacks", "connection_pool")
    }
    pool = redis.asyncio.ConnectionPool(connection_class=node.connection_class, **kwargs)
    return redis.asyncio.Redis(connection_pool=pool)


async def close_node_client(client: redis.asyncio.Redis) -> None:
    """The listener ends: its own client (``node_client``) goes with it."""
    with contextlib.suppress(Exception):
        await client.aclose()


async def close_pubsub(pubsub: Any) -> None:
    # Already broken, perhaps: there is nothing left to release.
    with contextlib.suppress(Exception):
        await pubsub.aclose()


def connected(pubsub: Any) -> bool:
    """Whether ``pubsub`` has a connection to read: the asyncio one has none
    until its first subscription, and reading it then fails."""
    return pubsub.connection is not None


class _ShardedPubSub(AsyncPubSub):
    """Sharded pub/sub for redis-py before 5.1, whose asyncio ``PubSub`` lacks it."""

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
    (CROSSSLOT). ``_wakeup_prims._SlotwisePubSub``'s twin."""

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


def node_pubsub(client: redis.asyncio.Redis) -> Any:
    """A pubsub of ``client`` that subscribes one sharded channel per command."""
    pubsub = client.pubsub()
    if not hasattr(pubsub, "ssubscribe"):
        return _ShardedPubSub(client.connection_pool)
    if type(pubsub) is AsyncPubSub:
        pubsub.__class__ = _SlotwisePubSub
    return pubsub
