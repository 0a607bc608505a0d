"""The Redis-only lock engine. Nothing in this package imports Django."""

from .exceptions import (
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    RedisUnavailable,
    ReplicationTimeout,
)
from .keys import KeySpace
from .lock import Lock
from .lock_async import AsyncLock
from .multi import MultiLock
from .multi_async import AsyncMultiLock
from .rwlock import ReadWriteLock
from .rwlock_async import AsyncReadWriteLock

__all__ = [
    "AsyncLock",
    "AsyncMultiLock",
    "AsyncReadWriteLock",
    "KeySpace",
    "Lock",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
    "MultiLock",
    "ReadWriteLock",
    "RedisUnavailable",
    "ReplicationTimeout",
]
