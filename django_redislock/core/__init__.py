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

__all__ = [
    "AsyncLock",
    "KeySpace",
    "Lock",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
    "RedisUnavailable",
    "ReplicationTimeout",
]
