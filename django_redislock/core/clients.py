"""What the library asks of a Redis client: the methods it calls, and nothing more.

``RedisClient`` is satisfied by ``redis.Redis`` (a Sentinel's ``master_for``
too) and ``redis.cluster.RedisCluster``; ``AsyncRedisClient`` by
``redis.asyncio.Redis`` and ``redis.asyncio.cluster.RedisCluster``. A type
checker tells a sync client passed where an asyncio one is wanted, and the
other way round: redis-py 8 types each command's reply per kind of client.

Everything else the library uses of a client depends on what it is (a
single server's connection pool, a Cluster's nodes): that is asked at run
time (``topology.is_cluster``), never assumed of every client.

Scripts are sent on a connection of the client's own pool (``io/calls_async.py``);
``evalsha`` and ``script_load`` are the fallbacks and the pipelined reads.
Positional-only parameters: redis-py's names for them are not part of the seam.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from redis.typing import EncodableT, FieldT, KeyT, PatternT

__all__ = ["AnyRedisClient", "AsyncRedisClient", "RedisClient"]


class RedisClient(Protocol):
    """A sync client: ``redis.Redis`` or ``redis.cluster.RedisCluster``."""

    def evalsha(self, sha: str, numkeys: int, /, *keys_and_args: KeyT | EncodableT) -> Any: ...

    def script_load(self, script: str, /) -> Any: ...

    def pipeline(self, transaction: Any = ..., shard_hint: Any = ...) -> Any: ...

    def pubsub(self) -> Any: ...

    def scan(
        self, cursor: int = ..., match: PatternT | None = ..., count: int | None = ...
    ) -> Any: ...

    def hget(self, name: KeyT, key: FieldT, /) -> bytes | str | None: ...

    def hmget(self, name: KeyT, keys: list[Any], /) -> Any: ...

    def zscore(self, name: KeyT, value: EncodableT, /) -> float | None: ...

    def llen(self, name: KeyT, /) -> int: ...

    def config_get(self, pattern: PatternT = ..., /) -> Any: ...

    def close(self) -> None: ...


class AsyncRedisClient(Protocol):
    """An asyncio client: ``redis.asyncio.Redis`` or its ``RedisCluster``."""

    def evalsha(
        self, sha: str, numkeys: int, /, *keys_and_args: KeyT | EncodableT
    ) -> Awaitable[Any]: ...

    def script_load(self, script: str, /) -> Awaitable[Any]: ...

    def pubsub(self) -> Any: ...

    def hget(self, name: KeyT, key: FieldT, /) -> Awaitable[bytes | str | None]: ...

    def zscore(self, name: KeyT, value: EncodableT, /) -> Awaitable[float | None]: ...

    def config_get(self, pattern: PatternT = ..., /) -> Awaitable[Any]: ...

    async def aclose(self) -> None: ...


# Where either kind will do: what is only passed on, or asked of its kind.
AnyRedisClient = RedisClient | AsyncRedisClient
