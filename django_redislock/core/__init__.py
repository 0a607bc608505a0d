"""The Redis-only lock engine. Nothing in this package imports Django."""

from .drivers.lock import Lock
from .drivers.lock_async import AsyncLock
from .drivers.multi import MultiLock
from .drivers.multi_async import AsyncMultiLock
from .drivers.rwlock import ReadWriteLock
from .drivers.rwlock_async import AsyncReadWriteLock
from .engine.keys import KeySpace
from .exceptions import (
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    RedisUnavailable,
    ReplicationTimeout,
)
from .process import this_process
from .validate import (
    MAX_BYTES,
    MAX_COUNT,
    MAX_SECONDS,
    check_count,
    check_limit,
    check_replicas,
    check_seconds,
    count_problem,
    is_seconds,
    seconds_problem,
    seconds_range,
)

__all__ = [
    "MAX_BYTES",
    "MAX_COUNT",
    "MAX_SECONDS",
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
    "check_count",
    "check_limit",
    "check_replicas",
    "check_seconds",
    "count_problem",
    "is_seconds",
    "seconds_problem",
    "seconds_range",
    "this_process",
]
