"""A lock taken inside a ``TestCase`` is released when the block that would commit ends.

A locked call made inside a transaction someone else opened keeps its lock
until that transaction ends (``django_redislock/locking/deferred.py``). A
``TestCase`` (pytest-django's ``django_db`` without ``transaction=True``)
wraps each test in atomic blocks of its own, flagged ``_from_testcase``, that
are rolled back at the end and never commit. The library does not count those;
the first block the test itself opens is the one production would run as the
transaction, so the lock is released when that block ends, committed or rolled
back. The tests here run under pytest-django's ``django_db``; the same
scenarios run under ``manage.py test`` and under pytest in a new project in
tests/test_testcase_runners.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings
from django.db import connections, transaction

from django_redislock import get_lock, redis_locked
from django_redislock.testing import hold_lock, leftovers
from tests.testapp.models import Product


def _alias(alias: str) -> Any:
    return pytest.param(
        alias,
        marks=pytest.mark.skipif(alias not in settings.DATABASES, reason=f"no {alias!r}"),
    )


ALIASES = ["default", _alias("postgres"), _alias("mysql")]
DATABASES = [alias for alias in ("default", "postgres", "mysql") if alias in settings.DATABASES]

# A TestCase's transaction on every database: pytest-django's django_db.
pytestmark = pytest.mark.django_db(databases=DATABASES)


class Boom(Exception):
    pass


@redis_locked("sell:{n}", wait=0)
def sell(n: int, using: str = "default") -> None:
    Product.objects.using(using).create(name=f"sold-{n}", stock=1)


def held(name: str) -> bool:
    """Whether another holder would find ``name`` busy."""
    lock = get_lock(name, wait=0)
    if lock.acquire():
        lock.release()
        return False
    return True


def _in_testcase(using: str) -> None:
    blocks = connections[using].atomic_blocks
    assert blocks and all(block._from_testcase for block in blocks)


@pytest.mark.parametrize("using", ALIASES)
def test_the_tests_block_commits_and_the_lock_is_released(
    redislock_prefix: str, using: str
) -> None:
    _in_testcase(using)
    with transaction.atomic(using=using):
        sell(1, using)
        assert held("sell:1")  # the block would commit only now: still held
    assert not held("sell:1")
    assert leftovers() == []
    with hold_lock("sell:1"):
        pass


@pytest.mark.parametrize("using", ALIASES)
def test_the_tests_block_rolls_back_and_the_lock_is_released(
    redislock_prefix: str, using: str
) -> None:
    with pytest.raises(Boom), transaction.atomic(using=using):
        sell(1, using)
        raise Boom
    assert not held("sell:1")
    assert not Product.objects.using(using).filter(name="sold-1").exists()


def test_the_outermost_of_the_tests_blocks_is_the_transaction(redislock_prefix: str) -> None:
    with transaction.atomic():
        with transaction.atomic():
            sell(1)
        assert held("sell:1")  # a savepoint in production as well
        sell(1)  # the same lock, taken over
        Product.objects.count()  # a statement after the inner block changes nothing
        assert held("sell:1")
    assert not held("sell:1")
    with transaction.atomic():  # a new block, a new lock
        sell(1)
        assert held("sell:1")
    assert not held("sell:1")


def test_a_decorated_block_ends_each_time(redislock_prefix: str) -> None:
    # One Atomic object entered again and again at the same depth.
    @transaction.atomic
    def order(n: int) -> None:
        sell(n)

    for _ in range(3):
        order(1)
        assert not held("sell:1")


def test_a_block_without_a_savepoint_is_settled_by_the_kit(redislock_prefix: str) -> None:
    # atomic(savepoint=False) sends nothing to the database when it ends: the
    # next statement on the connection, the next call for the lock, or the
    # kit (hold_lock, leftovers) finds the block gone and releases.
    with transaction.atomic(savepoint=False):
        sell(1)
    assert leftovers() == []
    assert not held("sell:1")
    with transaction.atomic(savepoint=False):
        sell(2)
    with hold_lock("sell:2"):
        pass
    with transaction.atomic(savepoint=False):
        sell(3)
    Product.objects.count()
    assert not held("sell:3")
    with transaction.atomic(savepoint=False):
        sell(4)
    sell(4)  # the next call for the lock: released before, taken anew, released
    assert not held("sell:4")


def test_a_hold_inside_the_open_block_says_whose_lock_it_is(redislock_prefix: str) -> None:
    with transaction.atomic():
        sell(1)
        with pytest.raises(AssertionError) as failed:
            hold_lock("sell:1").__enter__()
        [line] = leftovers()
    message = str(failed.value)
    assert "taken by this thread in a transaction that is still open" in message
    assert "released when the outermost transaction.atomic() block of the test ends" in message
    assert "an earlier test" not in message
    assert line.startswith("lock 'sell:1': held by tests.test_testcase_transactions.sell on")
    assert line.endswith("waiting for this thread's transaction.atomic() block to end")
    assert leftovers() == []


def test_on_commit_callbacks_captured_are_the_tests_own(
    redislock_prefix: str, django_capture_on_commit_callbacks: Callable[..., Any]
) -> None:
    transaction.on_commit(lambda: None)  # registered before: not captured
    seen: list[str] = []
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with transaction.atomic():
            sell(1)
            transaction.on_commit(lambda: seen.append("mine"))
        assert not held("sell:1")
    assert len(callbacks) == 1 and seen == ["mine"]


@pytest.mark.django_db(transaction=True)
def test_outside_a_testcase_the_real_transaction_counts(redislock_prefix: str) -> None:
    # TransactionTestCase: no block of the test's is flagged. Production's rule.
    with transaction.atomic():
        with transaction.atomic():
            sell(1)
        Product.objects.count()
        assert held("sell:1")
    assert not held("sell:1")
