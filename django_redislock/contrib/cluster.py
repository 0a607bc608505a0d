"""A ``REDISLOCK['CLIENT']`` factory for Redis Cluster.

django-redis has no Cluster client, so a Cluster is configured directly::

    from django_redislock.contrib.cluster import cluster_client_factory

    REDISLOCK = {
        "CLIENT": cluster_client_factory(
            [("10.0.0.1", 7000), ("10.0.0.2", 7000), ("10.0.0.3", 7000)]
        ),
        # or one node: cluster_client_factory("redis://10.0.0.1:7000")
    }

The factory returns ``redis.cluster.RedisCluster`` for sync code and
``redis.asyncio.cluster.RedisCluster`` for async code (one per event loop),
with the socket timeouts of ``REDISLOCK`` unless ``opts`` names its own.
Every key of one lock shares a hash tag, so each script runs on one node;
waiters are woken through sharded pub/sub on the lock's own slot (plain
PUBLISH on that node where it has no sharded pub/sub: Redis before 7.0).

A client reads the Cluster's slot map from its startup nodes when it is
made: with a single URL, that one node being down means no client, and no
lock, until it is back. Give several nodes (of different shards). A client
that cannot be made raises ``RedisUnavailable`` (reason ``unreachable``),
as any call that cannot reach Redis does, and the next call tries again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import RedisClusterException, RedisError

from ..core import UNREACHABLE, RedisUnavailable

__all__ = ["cluster_client_factory"]

Nodes = str | Sequence[tuple[str, int]]


def _check_nodes(url_or_nodes: object) -> None:
    if isinstance(url_or_nodes, str):
        if not url_or_nodes.startswith(("redis://", "rediss://")):
            raise ValueError(
                f"cluster URL must start with redis:// or rediss://; got {url_or_nodes!r}"
            )
        return
    ok = (
        isinstance(url_or_nodes, (list, tuple))
        and url_or_nodes
        and all(
            isinstance(n, (list, tuple)) and len(n) == 2 and isinstance(n[1], int)
            for n in url_or_nodes
        )
    )
    if not ok:
        raise ValueError(
            "cluster_client_factory() takes a redis:// URL or a list of (host, port) "
            f"startup nodes; got {url_or_nodes!r}"
        )


def cluster_client_factory(url_or_nodes: Nodes, **opts: Any) -> Callable[..., Any]:
    """A ``make(asyncio: bool)`` callable building Cluster clients from one description.

    ``opts`` go to ``RedisCluster`` unchanged (``password``, ``ssl``, ...).
    Bad arguments fail here, when settings are loaded, not at the first lock.
    """
    _check_nodes(url_or_nodes)

    def make(asyncio: bool = False) -> Any:
        from django_redislock.conf import conf

        kwargs = {
            "socket_timeout": conf.SOCKET_TIMEOUT,
            "socket_connect_timeout": conf.CONNECT_TIMEOUT,
            **opts,
        }
        if asyncio:
            from redis.asyncio.cluster import ClusterNode as AsyncNode
            from redis.asyncio.cluster import RedisCluster as AsyncCluster

            if isinstance(url_or_nodes, str):
                return AsyncCluster.from_url(url_or_nodes, **kwargs)
            nodes = [AsyncNode(host, port) for host, port in url_or_nodes]
            return AsyncCluster(startup_nodes=nodes, **kwargs)
        from redis.cluster import ClusterNode, RedisCluster

        # The sync client reads the slot map as it is made (the asyncio one at
        # its first call, where a failure is RedisUnavailable already).
        try:
            if isinstance(url_or_nodes, str):
                return RedisCluster.from_url(url_or_nodes, **kwargs)
            startup = [ClusterNode(h, p) for h, p in url_or_nodes]
            return RedisCluster(startup_nodes=startup, **kwargs)
        except (RedisClusterException, RedisError) as exc:
            raise _unreachable(url_or_nodes, exc) from exc

    make.__qualname__ = make.__name__ = "cluster_client"
    return make


def _unreachable(url_or_nodes: Nodes, exc: BaseException) -> RedisUnavailable:
    single = isinstance(url_or_nodes, str) or len(url_or_nodes) == 1
    advice = (
        " With one startup node, that node being down is enough: give "
        "cluster_client_factory a list of (host, port) startup nodes of different shards."
        if single
        else ""
    )
    error = RedisUnavailable(f"no startup node of the Redis Cluster answered: {exc}{advice}")
    error.reason = UNREACHABLE
    return error
