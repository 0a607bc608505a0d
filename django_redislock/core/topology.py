"""What kind of Redis deployment a client talks to: the one place that asks."""

from __future__ import annotations

from .clients import AnyRedisClient

__all__ = ["is_cluster", "is_sentinel"]

# Asked on every lock call: the answer depends on the client's class only,
# and an isinstance check against redis-py's Cluster classes costs more than
# a dictionary lookup.
_by_type: dict[type, bool] = {}


def is_cluster(client: AnyRedisClient) -> bool:
    """True for redis-py's sync or asyncio ``RedisCluster``.

    Asked by type, not by duck typing: a client of a single server that
    happens to grow a ``get_primaries`` attribute (a wrapper, a test double)
    must not be walked as a Cluster, and a Cluster client must never be sent
    a pipeline that spans nodes.
    """
    kind = type(client)
    known = _by_type.get(kind)
    if known is None:
        known = _by_type[kind] = _is_cluster_type(kind)
    return known


def _is_cluster_type(kind: type) -> bool:
    try:
        from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
        from redis.cluster import RedisCluster
    except ImportError:  # pragma: no cover - redis-py without cluster support
        return False
    return issubclass(kind, (RedisCluster, AsyncRedisCluster))


_sentinel_pools: dict[type, bool] = {}


def is_sentinel(client: AnyRedisClient) -> bool:
    """True for a client whose pool is redis-py's Sentinel pool, sync or asyncio.

    Its primary can be replaced at any moment by one of its replicas. Asked by
    the pool's type, as ``is_cluster`` asks by the client's.
    """
    kind = type(getattr(client, "connection_pool", None))
    known = _sentinel_pools.get(kind)
    if known is None:
        known = _sentinel_pools[kind] = _is_sentinel_pool(kind)
    return known


def _is_sentinel_pool(kind: type) -> bool:
    from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
    from redis.sentinel import SentinelConnectionPool

    return issubclass(kind, (SentinelConnectionPool, AsyncSentinelPool))
