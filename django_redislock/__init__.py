"""Redis-backed locks, semaphores and throttling for Django."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

# The core's own public names, through its seam (django_redislock.core).
from .core import (
    AsyncLock,
    AsyncMultiLock,
    Lock,
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    MultiLock,
    RedisUnavailable,
    ReplicationTimeout,
)

__version__ = "0.2.0"

# Library code never prints. Without a handler of its own, a WARNING from a
# logger the project did not configure (Django configures "django", not the
# root) would go to logging.lastResort, which writes it to stderr: under the
# answer of "manage.py redislocks clear", for one. A project's LOGGING still
# gets every record.
logging.getLogger(__name__).addHandler(logging.NullHandler())

# Names whose modules import Django: loaded on first use, so that importing
# the package (or its Django-free core) never needs configured settings.
_LAZY = {
    "redis_locked": "locking.decorators",
    "redis_lock": "locking.blocks",
    "current_lock": "locking.context",
    "current_fence": "locking.context",
    "fenced_get": "locking.fencing",
    "fenced_update": "locking.fencing",
    "StaleFence": "locking.fencing",
    "get_lock": "locking.factories",
    "get_async_lock": "locking.factories",
    "get_multi_lock": "locking.factories",
    "get_async_multi_lock": "locking.factories",
    "get_semaphore": "locking.factories",
    "get_async_semaphore": "locking.factories",
    "get_rw_lock": "locking.factories",
    "get_async_rw_lock": "locking.factories",
    "Semaphore": "core",
    "AsyncSemaphore": "core",
    "ReadWriteLock": "core",
    "AsyncReadWriteLock": "core",
    "concurrency_limited": "throttling.middleware",
    "idempotent": "idempotency",
    "unique_task": "tasks.unique",
    "TaskNotUnique": "tasks.options",
}

# The same names for type checkers, which never run __getattr__ below: without
# these imports every lazy name would be Any to them. tests/test_typing.py
# checks that this block and _LAZY name the same objects.
if TYPE_CHECKING:
    from .core import AsyncReadWriteLock, AsyncSemaphore, ReadWriteLock, Semaphore
    from .idempotency import idempotent
    from .locking.blocks import redis_lock
    from .locking.context import current_fence, current_lock
    from .locking.decorators import redis_locked
    from .locking.factories import (
        get_async_lock,
        get_async_multi_lock,
        get_async_rw_lock,
        get_async_semaphore,
        get_lock,
        get_multi_lock,
        get_rw_lock,
        get_semaphore,
    )
    from .locking.fencing import StaleFence, fenced_get, fenced_update
    from .tasks.options import TaskNotUnique
    from .tasks.unique import unique_task
    from .throttling.middleware import concurrency_limited

# Spelled out, not built from _LAZY: type checkers and linters read only a
# literal list (a strict mypy re-exports nothing else).
__all__ = [
    "AsyncLock",
    "AsyncMultiLock",
    "AsyncReadWriteLock",
    "AsyncSemaphore",
    "concurrency_limited",
    "current_fence",
    "current_lock",
    "fenced_get",
    "fenced_update",
    "get_async_lock",
    "get_async_multi_lock",
    "get_async_rw_lock",
    "get_async_semaphore",
    "get_lock",
    "get_multi_lock",
    "get_rw_lock",
    "get_semaphore",
    "idempotent",
    "Lock",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
    "MultiLock",
    "ReadWriteLock",
    "redis_lock",
    "redis_locked",
    "RedisUnavailable",
    "ReplicationTimeout",
    "Semaphore",
    "StaleFence",
    "TaskNotUnique",
    "unique_task",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_redislock' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
