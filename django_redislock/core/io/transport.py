"""How the library's scripts reach Redis: one connection, bounded, never re-sent blindly.

``execute_command`` would apply the client's retry policy, and redis-py 8's
default one (ten retries, timeouts included, with back-off) turns a frozen
Redis into a call that lasts many socket timeouts and sends the same script
again after a timeout, when the first one may still run. So a batch of
commands (a script, or a script and the ``WAIT`` that must follow it on the
same connection) is written here on a connection taken from the client's pool,
with the library's own policy:

* the batch is sent again once only when the connection failed before any of
  it was written (connecting, or a pooled connection found dead);
* after a timeout nothing is sent again, and the connection is not closed:
  the batch is still in Redis's buffer and may run when Redis resumes. The
  connection goes to ``giveback``, which reads the late replies and frees the
  connection; a give-back asked for that call goes on after them, so it runs
  after the late script, not before it.

Each step has a module of its own: ``checkout`` takes and connects a
connection of the pool, ``batch`` writes the batch on it and reads the
replies, ``cluster_calls`` routes it on a Cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from ..clients import AsyncRedisClient, RedisClient
from ..topology import is_cluster
from .calls_base import CallFailed, Command, Pending
from .cluster_calls import cluster_call, cluster_call_async
from .pool_calls import call_on_pool
from .pool_calls_async import call_on_pool_async

if TYPE_CHECKING:
    import redis
    import redis.asyncio
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

__all__ = ["CallFailed", "Command", "Pending", "call", "call_async"]


def call(client: RedisClient, commands: Sequence[Command], key: bytes) -> list[Any]:
    """Send ``commands`` as one batch on one connection; a reply each, errors as values.

    On a Cluster the batch goes to the node owning ``key``'s slot. Raises
    ``CallFailed``; it never sends a written batch again.
    """
    if is_cluster(client):
        return cluster_call(cast("RedisCluster", client), commands, key)
    # Not a Cluster: a single server's client, with its pool.
    return call_on_pool(cast("redis.Redis", client).connection_pool, commands)


async def call_async(
    client: AsyncRedisClient, commands: Sequence[Command], key: bytes
) -> list[Any]:
    """``call`` for a ``redis.asyncio`` client."""
    if is_cluster(client):
        return await cluster_call_async(cast("AsyncRedisCluster", client), commands, key)
    return await call_on_pool_async(cast("redis.asyncio.Redis", client).connection_pool, commands)
