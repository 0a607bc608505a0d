"""What kind of Redis deployment a client talks to: the one place that asks."""

from __future__ import annotations

from typing import Any

__all__ = ["is_cluster"]


def is_cluster(client: Any) -> bool:
    """True for redis-py's sync or asyncio ``RedisCluster``.

    Asked by type, not by duck typing: a client of a single server that
    happens to grow a ``get_primaries`` attribute (a wrapper, a test double)
    must not be walked as a Cluster, and a Cluster client must never be sent
    a pipeline that spans nodes.
    """
    try:
        from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
        from redis.cluster import RedisCluster
    except ImportError:  # pragma: no cover - redis-py without cluster support
        return False
    return isinstance(client, (RedisCluster, AsyncRedisCluster))
