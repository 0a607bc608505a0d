"""The thread meaning of ``_wakeup_prims_async.py``'s names, for ``wakeups_sharded.py``.

``wakeups_sharded.py`` is generated from ``wakeups_sharded_async.py``; what
threads do differently from tasks is here. A node's listener is a daemon
thread, the notifier's state is guarded by a mutex (waiters and listeners
are threads of their own), a registration routes its tag at once (under that
mutex) rather than in a task, and a listener reads through the Cluster
client's own connection settings for its node, which it does not close.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.client import PubSub
from redis.cluster import RedisCluster as Cluster

from ..engine.wakeup_message import Handed
from . import breaker
from .wakeups_base import ShardedBase, SubscribedTag, Wakeup

if TYPE_CHECKING:
    import redis

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
    "slotwise",
    "start",
]


class Event(threading.Event):
    """What a tag's subscription sets once confirmed."""

    # Whether set, waiting up to ``timeout`` seconds for it: no call in between.
    within = threading.Event.wait


Runner = threading.Thread
# Threads need no home: a call from any of them runs where it is made.
Home = object
# Re-entrant: a waiter that holds it may route its tag, which takes it again.
Mutex = threading.RLock


def home() -> Home:
    return None


def at_home(_home: Home, call: Callable[[], None]) -> None:
    call()


def start(run: Callable[[], None], name: str) -> Runner:
    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def running(runner: Runner | None) -> bool:
    return runner is not None and runner.is_alive()


sleep = time.sleep


def opened_here(client: Any, opened: breaker.Breaker) -> bool:
    """Whether ``opened`` is the breaker of a node of Cluster ``client``."""
    pools = (getattr(node.redis_connection, "connection_pool", None) for node in client.get_nodes())
    return any(pool is not None and breaker.breaker_of(pool) is opened for pool in pools)


class Waiters(ShardedBase["Cluster"]):
    """The waiters' side of the thread Cluster notifier, and its reading of a
    message: ``_wakeup_prims_async.Waiters``'s steps, each under the
    notifier's mutex, since waiters and listeners are threads of their own;
    a registration routes its tag at once, in the waiter's thread."""

    def __init__(self, client: Any, keyspace: Any) -> None:
        super().__init__(client, keyspace)
        self._mutex = Mutex()

    def _route(self, state: SubscribedTag) -> None:
        raise NotImplementedError  # the notifier's

    def _follow(self, listener: Any, dropped: list[bytes]) -> None:
        raise NotImplementedError  # the notifier's

    def register(self, token: str, tag: bytes = b"") -> Wakeup:
        event = Wakeup()
        with self._mutex:
            unrouted = self._join(token, event, tag, Event)
            if unrouted is not None:
                self._route(unrouted)
        return event

    def register_if_ready(self, token: str, tag: bytes = b"") -> Wakeup | None:
        """Register ``token`` if its tag's channel is subscribed, else None:
        one step under the mutex, so the tag cannot be dropped in between."""
        with self._mutex:
            return self.register(token, tag) if self.is_ready(tag) else None

    def unregister(self, token: str) -> None:
        with self._mutex:
            self._forget(token)

    def wait(self, event: Wakeup, timeout: float) -> Handed | None:
        """Sleep until a listener sets ``event`` or ``timeout`` passes; the
        fence of a lease handed over, else None."""
        event.wait(timeout)
        with self._mutex:
            return event.take_turn()

    def _handle(self, message: dict[str, Any], listener: Any) -> None:
        """A message of ``listener``'s node."""
        with self._mutex:
            dropped = self._on_message(message, listener.name)
        if dropped:
            self._follow(listener, dropped)


# -- a node's connection -----------------------------------------------------


def node_client(cluster: Cluster, node: Any) -> redis.Redis:
    """The Cluster client's own client for ``node``."""
    return cluster.get_redis_connection(node)


def close_node_client(client: redis.Redis) -> None:
    """Nothing: the node's client is the Cluster client's, still in use."""
    return None


def close_pubsub(pubsub: Any) -> None:
    # Already broken, perhaps: there is nothing left to release.
    with contextlib.suppress(Exception):
        pubsub.close()


def connected(pubsub: Any) -> bool:
    """Always: the sync ``PubSub`` reads nothing, and waits, before its first
    subscription."""
    return True


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


def node_pubsub(client: redis.Redis) -> Any:
    """A pubsub of ``client`` that subscribes one sharded channel per command."""
    return slotwise(client.pubsub())
