"""pytest fixtures for projects that use django-redislock.

pytest loads this plugin by itself once django-redislock is installed (entry
point ``pytest11``); ``-p no:django_redislock.testing.plugin`` turns it off.
It only adds fixtures and two ini options, both off by default: a test that
asks for none of the fixtures is not touched, and nothing here reads Django
settings until a fixture runs.

Fixtures:

``redislock_prefix``
    A key prefix of the test's own (``isolated_prefix``); the value is the prefix.
``redislock_hold``
    ``redislock_hold(name, **kwargs)`` holds a lock until the test ends
    (``hold_lock``) and returns the core ``Lock``.
``redislock_hold_permits``
    ``redislock_hold_permits(name, limit, **kwargs)`` holds semaphore permits
    until the test ends (``hold_permits``) and returns their handles.
``redislock_disabled``
    Locks switched off for the test (``locks_disabled``).
``redislock_no_leftovers``
    The test runs under its own prefix, and fails at teardown if it left a
    lock, a permit or a waiter behind (``assert_no_locks_left``).
``redislock_unique_tasks``
    Unique tasks run in the test's process (``local_unique_tasks``); the keys
    they took are let go when the test ends, before any fixture's teardown
    (so before the leftovers check, whatever order the fixtures come in).

Ini options (``pytest.ini``, ``[tool.pytest.ini_options]``, ...):

``redislock_isolate = true``
    Every test gets ``redislock_prefix``.
``redislock_check_leftovers = true``
    Every test gets ``redislock_no_leftovers``.

Both apply only once Django settings are configured (by pytest-django), so
tests of a project's Django-free parts are left alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ..core import Lock, Semaphore


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "redislock_isolate",
        type="bool",
        default=False,
        help="django-redislock: give every test a key prefix of its own.",
    )
    parser.addini(
        "redislock_check_leftovers",
        type="bool",
        default=False,
        help="django-redislock: fail a test that leaves a lock, permit or waiter behind.",
    )


@pytest.fixture
def redislock_prefix() -> Iterator[str]:
    """A ``REDISLOCK['PREFIX']`` of the test's own, unique across tests, runs
    and ``pytest-xdist`` workers; the fixture's value is the prefix."""
    from . import isolated_prefix

    with isolated_prefix() as prefix:
        yield prefix


@pytest.fixture
def redislock_hold() -> Iterator[Callable[..., Lock]]:
    """``redislock_hold(name, *, timeout=60, wait=0, alias=None)``: hold the
    lock ``name`` from elsewhere until the test ends (see ``hold_lock``);
    returns the core ``Lock``."""
    from . import hold_lock

    with ExitStack() as stack:

        def hold(name: str, **kwargs: Any) -> Lock:
            return stack.enter_context(hold_lock(name, **kwargs))

        yield hold


@pytest.fixture
def redislock_hold_permits() -> Iterator[Callable[..., list[Semaphore]]]:
    """``redislock_hold_permits(name, limit, *, count=None, timeout=60, wait=0,
    alias=None)``: hold permits of a semaphore until the test ends (see
    ``hold_permits``); returns the ``Semaphore`` handles."""
    from . import hold_permits

    with ExitStack() as stack:

        def hold(name: str, limit: int, **kwargs: Any) -> list[Semaphore]:
            return stack.enter_context(hold_permits(name, limit, **kwargs))

        yield hold


@pytest.fixture
def redislock_disabled() -> Iterator[None]:
    """Locks switched off for the test, as with ``REDISLOCK['ENABLED'] = False``."""
    from . import locks_disabled

    with locks_disabled():
        yield


@pytest.fixture
def redislock_no_leftovers(redislock_prefix: str) -> Iterator[str]:
    """Run the test under its own prefix (the value) and fail at teardown if
    it left a lock, a semaphore permit or a waiter behind."""
    from . import assert_no_locks_left

    yield redislock_prefix
    assert_no_locks_left()


@pytest.fixture(autouse=True)
def _redislock_ini_options(request: pytest.FixtureRequest) -> None:
    """Apply the ini options; does nothing unless one of them is set."""
    isolate = request.config.getini("redislock_isolate")
    check = request.config.getini("redislock_check_leftovers")
    if not (isolate or check):
        return
    from django.conf import settings

    if not settings.configured:
        return
    request.getfixturevalue("redislock_no_leftovers" if check else "redislock_prefix")


@pytest.fixture
def redislock_unique_tasks() -> Iterator[None]:
    """Unique tasks run in the test's process (``local_unique_tasks``): a
    Celery ``UniqueTask`` at once rather than through a broker; the keys they
    took are let go when the test ends."""
    from . import local_unique_tasks

    with local_unique_tasks():
        yield


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Let go of the unique keys of a test that used ``redislock_unique_tasks``
    before any fixture is torn down: the leftovers check, torn down before or
    after that fixture, must not find them."""
    if "redislock_unique_tasks" in getattr(item, "fixturenames", ()):
        from .unique import let_go_of_unique_keys

        let_go_of_unique_keys()
