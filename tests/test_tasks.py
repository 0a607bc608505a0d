"""``redis_locked`` on background tasks: Django's ``@task`` and Celery (eager mode)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_redislock import LockNotAcquired, current_lock, get_lock, redis_locked

try:  # Django 6.0+
    from django.tasks import task as django_task
except ImportError:  # Django 5.2 with the django-tasks backport, if installed
    try:
        from django_tasks import task as django_task
    except ImportError:
        django_task = None

try:
    from celery import Celery
except ImportError:
    Celery = None


@pytest.fixture
def held() -> Iterator[Any]:
    locks = []

    def hold(name: str) -> Any:
        lock = get_lock(name, timeout=30, wait=0)
        assert lock.acquire()
        locks.append(lock)
        return lock

    yield hold
    for lock in locks:
        if lock.token is not None:
            lock.release()


def _fence_and_name() -> list[Any]:
    lock = current_lock()
    assert lock is not None
    return [lock.name, lock.fence]


# -- Django tasks ----------------------------------------------------------------------------
if django_task is not None:

    @django_task
    @redis_locked("feed:{feed_id}", wait=0)
    def import_feed(feed_id: int) -> list[Any]:
        return _fence_and_name()

    @redis_locked("feed:{feed_id}", wait=0)
    @django_task
    def import_feed_outer(feed_id: int) -> list[Any]:
        return _fence_and_name()

    @django_task
    @redis_locked("feed:{feed_id}", wait=0, on_busy="skip")
    def import_feed_or_skip(feed_id: int) -> list[Any]:
        return _fence_and_name()

    @django_task(takes_context=True)
    @redis_locked("feed:{feed_id}", wait=0)
    def import_feed_with_context(context: Any, feed_id: int) -> list[Any]:
        return [*_fence_and_name(), context.attempt]


needs_tasks = pytest.mark.skipif(django_task is None, reason="no django.tasks / django_tasks")


@needs_tasks
@pytest.mark.parametrize("name", ["import_feed", "import_feed_outer"])
def test_django_task_runs_under_the_lock(name: str) -> None:
    task = globals()[name]
    result = task.enqueue(7)
    assert result.status == "SUCCESSFUL", result.errors
    lock_name, fence = result.return_value
    assert lock_name == "feed:7"
    assert isinstance(fence, int)
    assert get_lock("feed:7", wait=0).acquire()


@needs_tasks
def test_django_task_busy_fails_or_skips(held: Any) -> None:
    held("feed:8")
    failed = import_feed.enqueue(8)
    assert failed.status == "FAILED"
    assert failed.errors[0].exception_class is LockNotAcquired
    skipped = import_feed_or_skip.enqueue(8)
    assert skipped.status == "SUCCESSFUL"
    assert skipped.return_value is None


@needs_tasks
def test_django_task_with_context() -> None:
    result = import_feed_with_context.enqueue(feed_id=9)
    assert result.status == "SUCCESSFUL", result.errors
    assert result.return_value[0] == "feed:9"
    assert result.return_value[2] == 1


@needs_tasks
def test_django_task_called_directly() -> None:
    assert import_feed.call(10)[0] == "feed:10"


# -- Celery ------------------------------------------------------------------------------------
needs_celery = pytest.mark.skipif(Celery is None, reason="celery not installed")


@pytest.fixture
def celery_app() -> Iterator[Any]:
    app = Celery("tests", set_as_current=False)
    app.conf.update(
        task_always_eager=True,
        task_eager_propagates=True,
        broker_url="memory://",
        result_backend=None,
    )
    yield app
    app.close()
    # Eager tasks applied from several threads at once leave Celery's global
    # "joining would block" flag set (each apply restores the value it saw,
    # and they interleave): a later test's result.get() would then refuse to
    # run, "within a task".
    from celery._state import _set_task_join_will_block

    _set_task_join_will_block(False)


@needs_celery
def test_celery_task_runs_under_the_lock(celery_app: Any) -> None:
    @celery_app.task(shared=False)
    @redis_locked("report:{report_id}", wait=0)
    def build(report_id: int) -> list[Any]:
        return _fence_and_name()

    lock_name, fence = build.delay(3).get()
    assert lock_name == "report:3" and isinstance(fence, int)
    assert build.apply(args=(3,)).get()[0] == "report:3"


@needs_celery
def test_celery_busy_raises_skips_or_retries(celery_app: Any, held: Any) -> None:
    runs = []

    @celery_app.task(shared=False)
    @redis_locked("report:{report_id}", wait=0)
    def build(report_id: int) -> str:
        runs.append(report_id)
        return "built"

    @celery_app.task(shared=False)
    @redis_locked("report:{report_id}", wait=0, on_busy="skip")
    def build_or_skip(report_id: int) -> str:
        runs.append(report_id)
        return "built"

    # Celery's own retry machinery works on LockNotAcquired.
    @celery_app.task(
        autoretry_for=(LockNotAcquired,), max_retries=2, default_retry_delay=0, shared=False
    )
    @redis_locked("report:{report_id}", wait=0)
    def build_with_retries(report_id: int) -> str:
        runs.append(report_id)
        return "built"

    held("report:4")
    with pytest.raises(LockNotAcquired):
        build.delay(4).get()
    assert build_or_skip.delay(4).get() is None
    # Eager mode surfaces the scheduled retry instead of sleeping through it.
    from celery.exceptions import Retry

    with pytest.raises(Retry) as info:
        build_with_retries.delay(4).get()
    assert isinstance(info.value.exc, LockNotAcquired)
    assert runs == []
    assert build.delay(5).get() == "built"


@needs_celery
def test_celery_tasks_in_threads_never_overlap(celery_app: Any) -> None:
    active: list[int] = []
    overlaps: list[int] = []
    mutex = threading.Lock()

    @celery_app.task(shared=False)
    @redis_locked("nightly", wait=20)
    def nightly(n: int) -> None:
        with mutex:
            active.append(n)
            if len(active) > 1:
                overlaps.append(n)
        time.sleep(0.005)  # stay inside long enough for an overlap to show
        with mutex:
            active.remove(n)

    statuses: list[str] = []

    def run(n: int) -> None:
        statuses.append(nightly.delay(n).status)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert statuses == ["SUCCESS"] * 6
    assert overlaps == []


@needs_celery
def test_decorator_above_celery_task_is_refused(celery_app: Any) -> None:
    @celery_app.task(shared=False)
    def plain(n: int) -> int:
        return n

    with pytest.raises(TypeError, match="below @app.task"):
        redis_locked("x")(plain)
