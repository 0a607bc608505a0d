"""Which redis-py clients a type checker accepts where the library wants a client.

Checked by the lint run (mypy, ``warn_unused_ignores``): each ``type: ignore``
below must still be needed, so a sync client where an asyncio one is wanted
(and the other way round) stays an error.
"""

from __future__ import annotations

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel

from django_redislock.core import AsyncLock, Lock
from django_redislock.core.clients import AsyncRedisClient, RedisClient


def sync_client(client: RedisClient) -> None: ...


def async_client(client: AsyncRedisClient) -> None: ...


def accepted() -> None:
    sync_client(redis.Redis())
    sync_client(redis.cluster.RedisCluster())
    sync_client(redis.sentinel.Sentinel([]).master_for("service"))
    async_client(redis.asyncio.Redis())
    async_client(redis.asyncio.cluster.RedisCluster())
    async_client(redis.asyncio.sentinel.Sentinel([]).master_for("service"))
    Lock(redis.Redis(), "name")
    AsyncLock(redis.asyncio.Redis(), "name")


def refused() -> None:
    sync_client(redis.asyncio.Redis())  # type: ignore[arg-type]
    async_client(redis.Redis())  # type: ignore[arg-type]
    Lock(redis.asyncio.Redis(), "name")  # type: ignore[arg-type]
    AsyncLock(redis.Redis(), "name")  # type: ignore[arg-type]
