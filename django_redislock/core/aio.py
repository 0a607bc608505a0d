"""The asyncio API under its former module name: ``AsyncLock`` and friends.

The driver lives in ``lock_async.py``, the wake-up reader in
``notify_async.py``; this module keeps ``django_redislock.core.aio`` imports
working.
"""

from __future__ import annotations

from .aio_calls import complete
from .lock_async import AsyncHandle, AsyncLock
from .notify_async import AsyncNotifier, get_async_notifier

__all__ = ["AsyncHandle", "AsyncLock", "AsyncNotifier", "complete", "get_async_notifier"]
