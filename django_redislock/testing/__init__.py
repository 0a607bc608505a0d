"""Tools for testing a project that uses django-redislock.

What a test of locked code needs, each as a context manager for any
test runner, as a ``unittest`` mixin (``RedisLockTestMixin``) and as pytest
fixtures (``django_redislock.testing.plugin``, loaded by pytest on its own
once the package is installed):

* **A lock that is busy for the code under test** (``hold_lock``,
  ``hold_permits``). A lock taken with ``redis_lock`` in the test is
  *re-entered* by code that runs in the same thread, as a nested call would
  be, so a view called through the test client runs instead of answering
  409. ``hold_lock`` takes the lock through a handle of its own that the
  re-entrance bookkeeping never sees, and caps the wait of every call for
  that name (``wait=0`` by default), so the busy answer comes at once.
* **Keys of its own for each test** (``isolated_prefix``): a unique
  ``REDISLOCK['PREFIX']`` per test, so tests never see each other's locks or
  the developer's, including under ``pytest-xdist``.
* **A check that nothing was left behind** (``assert_no_locks_left``): no
  held lock, no semaphore permit and no waiter's queue entry under the
  current prefix.
* **Locks switched off** (``locks_disabled``), as with
  ``REDISLOCK['ENABLED'] = False``.
* **Unique tasks run here** (``local_unique_tasks``): a Celery unique task
  runs at once instead of going to a broker, and the keys unique tasks took
  are let go when the block ends.

Importing this module reads no settings and imports nothing from Django:
the work is done when one of its tools is used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from .holding import hold_lock, hold_permits
from .leftovers import assert_no_locks_left, leftovers
from .settings import isolated_prefix, locks_disabled, redislock_settings, unique_prefix
from .unique import local_unique_tasks

__all__ = [
    "RedisLockTestMixin",
    "assert_no_locks_left",
    "hold_lock",
    "hold_permits",
    "isolated_prefix",
    "leftovers",
    "local_unique_tasks",
    "locks_disabled",
    "redislock_settings",
    "unique_prefix",
]


class RedisLockTestMixin:
    """Isolation and a leftover check for ``unittest`` and Django test cases.

    Put it before the test case class
    (``class OrderTests(RedisLockTestMixin, TestCase)``). Each test then runs
    under its own ``isolated_prefix`` (``self.redislock_prefix``) and, after
    ``tearDown`` and the test's cleanups, ``assert_no_locks_left`` runs.
    Set ``redislock_isolated`` or ``redislock_check_leftovers`` to False on
    the class to turn either off. A ``setUp`` of your own must call
    ``super().setUp()``.
    """

    redislock_isolated: ClassVar[bool] = True
    redislock_check_leftovers: ClassVar[bool] = True
    redislock_prefix: str = ""

    # Provided by unittest.TestCase.
    addCleanup: Callable[..., None]

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        if self.redislock_isolated:
            block = isolated_prefix()
            self.redislock_prefix = block.__enter__()
            self.addCleanup(block.__exit__, None, None, None)
        if self.redislock_check_leftovers:
            # Cleanups run last in, first out: this one, before the prefix ends.
            self.addCleanup(assert_no_locks_left)
