"""A batch on a Redis Cluster: sent to the node that owns the key's slot.

A batch is sent again only where Redis says that it did not run:

* MOVED and ASK are followed (at most ``_MAX_REDIRECTS`` times);
* TRYAGAIN (a command on several keys of a slot that is being migrated) and
  CLUSTERDOWN (some slot has no primary: a failover under way) are sent
  again after a short pause, until one socket timeout of the node has passed
  since the call began: what a silent node would have cost the caller. Past
  that the error reaches the caller, whose wait may allow more
  (``failures.said_retry``);
* a connection that failed before anything was written (nothing listens
  there any more: the node died) has the slot map read again at once, and
  the batch goes to the slot's new owner if the map names another.

A node that failed to answer may be gone for good (a failover): the slot map
is read again before the next call. Nothing that may have run is sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from redis.exceptions import AskError, MovedError, RedisClusterException, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..failures import said_retry
from . import giveback_async
from .breaker import Breaker, breaker_of, node_breaker
from .calls_base import CallFailed, Command
from .calls_prims_async import make_ready_async
from .pool_calls import call_on_pool
from .pool_calls_async import exchange_async, guarded_async

if TYPE_CHECKING:
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

__all__ = ["cluster_call", "cluster_call_async", "refresh_slots", "refresh_slots_async"]

logger = logging.getLogger("django_redislock.transport")

# A redirection is followed this many times at most: a slot moving while we
# follow it is rare, a loop between two confused nodes must not hang a call.
_MAX_REDIRECTS = 5
# Clients whose slot map is read again before their next call.
_refresh: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
# TRYAGAIN and CLUSTERDOWN are retried after a pause that doubles from the
# first to the last, within one socket timeout of the node, or within
# _PATIENCE for a node that has none.
_PAUSES = (0.01, 0.2)
_PATIENCE = 2.0


def _node_may_be_gone(failed: CallFailed) -> bool:
    from redis.exceptions import MaxConnectionsError

    # A pool at its cap says nothing of the node: it must not cost the
    # next call a refresh of the slot map (which replaces node clients).
    return isinstance(failed.cause, (RedisConnectionError, RedisTimeoutError)) and not (
        isinstance(failed.cause, MaxConnectionsError)
    )


def _unwritten(failed: CallFailed) -> bool:
    """Whether the node could not be reached at all: nothing was written."""
    return (
        not failed.may_have_run
        and failed.pending is None
        and _node_may_be_gone(failed)
        and not isinstance(failed.cause, RedisTimeoutError)
    )


def _redirect_target(client: RedisCluster | AsyncRedisCluster, error: AskError) -> Any:
    """The node a MOVED/ASK names, with the client's slot map told of a MOVED."""
    # Its methods differ across redis-py versions: asked for by name below.
    manager: Any = client.nodes_manager
    if isinstance(error, MovedError):
        for method in ("move_slot", "update_moved_exception"):
            if hasattr(manager, method):
                outcome = getattr(manager, method)(error)
                break
        else:
            manager._moved_exception = error
            outcome = None
        if inspect.isawaitable(outcome):
            return outcome  # the asyncio manager: the caller awaits it first
        if getattr(manager, "_moved_exception", None) is error:
            # redis-py 5.0 only notes the move and applies it at the next
            # get_node_from_slot (get_node_from_key does not look): apply it.
            manager.get_node_from_slot(error.slot_id)
    return None


def _node_at(client: RedisCluster | AsyncRedisCluster, error: AskError) -> Any:
    node = client.get_node(host=error.host, port=error.port)
    if node is None and isinstance(error, MovedError):
        node = client.nodes_manager.get_node_from_slot(error.slot_id)
    if node is None:
        raise CallFailed(error, may_have_run=False)
    return node


@contextlib.contextmanager
def _looked_up_again_if_gone(client: RedisCluster | AsyncRedisCluster) -> Iterator[None]:
    """A failure that says the node may be gone for good (a failover), or a
    failed reading of the slot map, has the map read again before the next call."""
    try:
        yield
    except CallFailed as failed:
        if _node_may_be_gone(failed):
            _refresh[client] = True
        raise
    except (RedisError, RedisClusterException) as exc:
        # RedisClusterException (no startup node answers, a slot nobody
        # serves) is not a RedisError: it must not reach the caller raw.
        _refresh[client] = True
        raise CallFailed(exc, may_have_run=False) from exc


def _next_hop(
    client: RedisCluster | AsyncRedisCluster, error: AskError
) -> tuple[Any, tuple[Command, ...]]:
    # Redirected: the command did not run there; a WAIT after it had nothing
    # to wait for. The whole batch goes where Redis says, after ASKING for ASK.
    return _node_at(client, error), () if isinstance(error, MovedError) else (("ASKING",),)


class _Retries:
    """When a batch refused with TRYAGAIN or CLUSTERDOWN is sent again."""

    def __init__(self, node: Any) -> None:
        timeout = _kwargs_of(node).get("socket_timeout")
        self.until = time.monotonic() + (float(timeout) if timeout else _PATIENCE)
        self.pause = _PAUSES[0]

    def next_pause(self) -> float | None:
        """Seconds to pause before sending again, or None: give up."""
        pause = self.pause
        if time.monotonic() + pause > self.until:
            return None
        self.pause = min(self.pause * 2, _PAUSES[1])
        return pause


def _kwargs_of(node: Any) -> dict[str, Any]:
    connection = getattr(node, "redis_connection", None)
    pool = getattr(connection, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or getattr(node, "connection_kwargs", None)
    return kwargs if isinstance(kwargs, dict) else {}


def refresh_slots(client: RedisCluster) -> bool:
    """Read the slot map again now; whether it could be read."""
    try:
        client.nodes_manager.initialize()
    except (RedisError, RedisClusterException) as exc:
        logger.debug("could not read the Cluster's slot map: %s", exc)
        return False
    return True


async def refresh_slots_async(client: AsyncRedisCluster) -> bool:
    """``refresh_slots`` for an asyncio Cluster client."""
    try:
        await client.nodes_manager.initialize()
    except (RedisError, RedisClusterException) as exc:
        logger.debug("could not read the Cluster's slot map: %s", exc)
        return False
    return True


def cluster_call(client: RedisCluster, commands: Sequence[Command], key: bytes) -> list[Any]:
    with _looked_up_again_if_gone(client):
        if _refresh.get(client, False) and not _refused(_breaker_of_node(client, key)):
            _refresh.pop(client, None)
            client.nodes_manager.initialize()
        node = client.get_node_from_key(key)
    prefix: tuple[Command, ...] = ()
    retries = _Retries(node)
    hops = 0
    while True:
        redis_node = node.redis_connection or client.get_redis_connection(node)
        try:
            with _looked_up_again_if_gone(client):
                replies = call_on_pool(redis_node.connection_pool, (*prefix, *commands))
        except CallFailed as failed:
            moved = _moved_since(client, node, key) if _unwritten(failed) else None
            if moved is None:
                raise
            node, prefix, hops = moved, (), _hop(hops, failed)
            continue
        replies = replies[len(prefix) :]
        if said_retry(replies[0]):
            pause = retries.next_pause()
            if pause is None:
                return replies
            time.sleep(pause)
            continue
        if not isinstance(replies[0], AskError):
            return replies
        _redirect_target(client, replies[0])
        node, prefix = _next_hop(client, replies[0])
        hops = _hop(hops, None)


def _breaker_of_node(client: RedisCluster, key: bytes) -> Breaker | None:
    """The breaker of the node the current slot map names for ``key``, if it has a pool yet."""
    try:
        node = client.get_node_from_key(key)
    except (RedisError, RedisClusterException):
        return None
    pool = getattr(getattr(node, "redis_connection", None), "connection_pool", None)
    return breaker_of(pool) if pool is not None else None


def _refused(breaker: Breaker | None) -> bool:
    """Whether a call to that node would be refused now: then the slot map is
    not read again in its caller's path either (the read may well ask the
    frozen node first, and wait its timeout). The refresh stays due, for the
    first call its breaker lets through."""
    return breaker is not None and breaker.refusing()


def _moved_since(client: RedisCluster, node: Any, key: bytes) -> Any:
    """The slot's owner after reading the map again, if another than ``node``."""
    with contextlib.suppress(RedisError, RedisClusterException):
        if refresh_slots(client):
            _refresh.pop(client, None)
            owner = client.get_node_from_key(key)
            if owner.name != node.name:
                return owner
    return None


def _owner_refused(client: AsyncRedisCluster, key: bytes) -> bool:
    """Whether the node the slot map names for ``key`` has its breaker open."""
    try:
        owner = client.get_node_from_key(key)  # type: ignore[arg-type]
    except (RedisError, RedisClusterException, LookupError):
        return False  # no slot map to read: the call reads it
    return owner is not None and _refused(node_breaker(client, owner))


def _hop(hops: int, failed: CallFailed | None) -> int:
    """One more hop to another node; past ``_MAX_REDIRECTS`` the call fails."""
    if hops + 1 >= _MAX_REDIRECTS:
        cause = failed.cause if failed is not None else RedisError("too many Cluster redirections")
        raise CallFailed(cause, may_have_run=False)
    return hops + 1


async def cluster_call_async(
    client: AsyncRedisCluster, commands: Sequence[Command], key: bytes
) -> list[Any]:
    with _looked_up_again_if_gone(client):
        if _refresh.get(client, False) and not _owner_refused(client, key):
            _refresh.pop(client, None)
            await client.nodes_manager.initialize()
        # redis-py closes the client after its own timeout (5.0: and reads the
        # slot map again at the next call): not while the owner's breaker is open.
        if getattr(client, "_initialize", False) and not _owner_refused(client, key):
            await client.initialize()
        # Annotated ``str`` by redis-py, which takes bytes keys as every command does.
        node = client.get_node_from_key(key)  # type: ignore[arg-type]
    prefix: tuple[Command, ...] = ()
    retries = _Retries(node)
    hops = 0
    while True:
        try:
            with _looked_up_again_if_gone(client):
                replies = (await _call_on_node_async(client, node, (*prefix, *commands)))[
                    len(prefix) :
                ]
        except CallFailed as failed:
            moved = await _moved_since_async(client, node, key) if _unwritten(failed) else None
            if moved is None:
                raise
            node, prefix, hops = moved, (), _hop(hops, failed)
            continue
        if said_retry(replies[0]):
            pause = retries.next_pause()
            if pause is None:
                return replies
            await asyncio.sleep(pause)
            continue
        if not isinstance(replies[0], AskError):
            return replies
        moved_slot = _redirect_target(client, replies[0])
        if moved_slot is not None:
            await moved_slot
        node, prefix = _next_hop(client, replies[0])
        hops = _hop(hops, None)


async def _moved_since_async(client: AsyncRedisCluster, node: Any, key: bytes) -> Any:
    """``_moved_since`` for an asyncio Cluster client."""
    with contextlib.suppress(RedisError, RedisClusterException):
        if await refresh_slots_async(client):
            _refresh.pop(client, None)
            owner = client.get_node_from_key(key)  # type: ignore[arg-type]
            if owner is not None and owner.name != node.name:
                return owner
    return None


def _node_release(node: Any, conn: Any) -> Any:
    if hasattr(node, "release"):
        node.release(conn)
    else:  # redis-py 5.0
        node._free.append(conn)


async def _call_on_node_async(
    client: AsyncRedisCluster, node: Any, commands: Sequence[Command]
) -> list[Any]:
    """``call_on_pool_async`` for an asyncio Cluster node, which has no pool of
    its own: the node's breaker is kept per client and node name."""
    return await guarded_async(node_breaker(client, node), lambda: _on_node_async(node, commands))


async def _on_node_async(node: Any, commands: Sequence[Command]) -> list[Any]:
    from redis.exceptions import MaxConnectionsError

    try:
        conn = node.acquire_connection()
    except MaxConnectionsError as exc:
        raise CallFailed(exc, may_have_run=False) from exc
    try:
        try:
            await make_ready_async(node, conn)
        except RedisError as exc:
            raise CallFailed(exc, may_have_run=False) from exc
        return await exchange_async(conn, commands)
    except CallFailed as failed:
        if failed.pending is not None:
            failed.pending.release = lambda: _node_release(node, conn)
            giveback_async.drain_async(failed.pending)
            conn = None
        raise
    finally:
        if conn is not None:
            _node_release(node, conn)
