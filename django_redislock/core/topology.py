"""What kind of Redis deployment a client talks to: the one place that asks."""

from __future__ import annotations

from .clients import AnyRedisClient

__all__ = ["is_cluster"]

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
