"""Redis-backed locks, semaphores and throttling for Django."""

from __future__ import annotations

from typing import Any

from .core.exceptions import (
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    RedisUnavailable,
    ReplicationTimeout,
)
from .core.lock import Lock
from .core.lock_async import AsyncLock
from .core.multi import MultiLock
from .core.multi_async import AsyncMultiLock

__version__ = "0.1.0"

# Names whose modules import Django: loaded on first use, so that importing
# the package (or its Django-free core) never needs configured settings.
_LAZY = {
    "redis_locked": "decorators",
    "redis_lock": "decorators",
    "current_lock": "decorators",
    "current_fence": "decorators",
    "get_lock": "locks",
    "get_async_lock": "locks",
    "get_multi_lock": "locks",
    "get_async_multi_lock": "locks",
    "Semaphore": "core.semaphore",
    "AsyncSemaphore": "core.semaphore_async",
    "concurrency_limited": "middleware",
    "idempotent": "idempotency",
    "unique_task": "unique",
    "TaskNotUnique": "unique",
}

__all__ = [
    "AsyncLock",
    "AsyncMultiLock",
    "Lock",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
    "MultiLock",
    "RedisUnavailable",
    "ReplicationTimeout",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_redislock' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
