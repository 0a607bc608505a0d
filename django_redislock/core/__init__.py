"""The Redis-only lock engine, and its seam: every name the Django layer uses.

Nothing in this package imports Django. The Django layer imports the core
through this module only (``tests/test_layout.py``); the names below that are
not the modules' own say what they are from outside (``force_release``, not
``release``).
"""

from __future__ import annotations

from .clients import AsyncRedisClient, RedisClient
from .drivers.base import LockBase, Observer, after_block, fields_of
from .drivers.lock import Lock
from .drivers.lock_async import AsyncLock
from .drivers.multi import MultiBase, MultiLock, lock_names
from .drivers.multi_async import AsyncMultiLock
from .drivers.records import forget_record, read_record, write_record
from .drivers.records_async import forget_record_async, read_record_async, write_record_async
from .drivers.records_base import Record
from .drivers.rwlock import Mode, ReadWriteLock, check_mode
from .drivers.rwlock_async import AsyncReadWriteLock
from .drivers.semaphore import Semaphore, SemaphoreBase, release_permit
from .drivers.semaphore_async import AsyncSemaphore
from .drivers.unique import note_task, read_task
from .drivers.unique_async import note_task_async
from .drivers.unique_base import TaskLease
from .engine.keys import IdempotencyKeys, KeySpace, decode_name, encode_name, validate_prefix
from .engine.loss import CAUSES
from .exceptions import (
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    RedisUnavailable,
    ReplicationTimeout,
)
from .failures import UNREACHABLE
from .io.background import RENEWAL_HINT, green_runtime, renewal_warning
from .io.background import watchdog as renewal_watchdog
from .io.breaker import (
    DEFAULT_WINDOW as DEFAULT_BREAKER_WINDOW,
)
from .io.breaker import (
    MAX_WINDOW as MAX_BREAKER_WINDOW,
)
from .io.breaker import (
    set_window as set_breaker_window,
)
from .ops.force import Shown, still_held
from .ops.force import release as force_release
from .ops.force import select as select_shown
from .ops.inspection import (
    KINDS,
    WAITERS_SHOWN,
    Holder,
    TemplateSummary,
    Waiter,
    list_locks,
    scan_keys,
    summarize,
)
from .ops.inspection import (
    find as find_locks,
)
from .ops.rows import HeldLock, iso_time
from .process import this_process
from .topology import is_cluster
from .validate import (
    MAX_BYTES,
    MAX_COUNT,
    MAX_SECONDS,
    check_limit,
    check_replicas,
    check_seconds,
    count_problem,
    is_seconds,
    seconds_problem,
    seconds_range,
)

__all__ = [
    "Record",
    "forget_record",
    "forget_record_async",
    "read_record",
    "read_record_async",
    "write_record",
    "write_record_async",
    "HeldLock",
    "AsyncLock",
    "AsyncMultiLock",
    "AsyncReadWriteLock",
    "AsyncRedisClient",
    "AsyncSemaphore",
    "CAUSES",
    "DEFAULT_BREAKER_WINDOW",
    "Holder",
    "IdempotencyKeys",
    "KINDS",
    "KeySpace",
    "Lock",
    "LockBase",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
    "MAX_BREAKER_WINDOW",
    "MAX_BYTES",
    "MAX_COUNT",
    "MAX_SECONDS",
    "Mode",
    "MultiBase",
    "MultiLock",
    "Observer",
    "RENEWAL_HINT",
    "ReadWriteLock",
    "RedisClient",
    "RedisUnavailable",
    "ReplicationTimeout",
    "Semaphore",
    "SemaphoreBase",
    "Shown",
    "TaskLease",
    "TemplateSummary",
    "UNREACHABLE",
    "WAITERS_SHOWN",
    "Waiter",
    "after_block",
    "check_limit",
    "check_mode",
    "check_replicas",
    "check_seconds",
    "count_problem",
    "decode_name",
    "encode_name",
    "fields_of",
    "find_locks",
    "force_release",
    "green_runtime",
    "is_cluster",
    "is_seconds",
    "iso_time",
    "list_locks",
    "lock_names",
    "note_task",
    "note_task_async",
    "read_task",
    "release_permit",
    "renewal_warning",
    "renewal_watchdog",
    "scan_keys",
    "seconds_problem",
    "seconds_range",
    "select_shown",
    "set_breaker_window",
    "still_held",
    "summarize",
    "validate_prefix",
    "this_process",
]
