"""Unique tasks in a project's tests (``local_unique_tasks``), and enqueued from a locked view.

No broker and no worker here: under the test kit a Celery unique task runs in
the test's thread, and a Django one goes to the backend the settings name.
The documentation's example (docs/examples/testing/test_unique_tasks.py) runs
in a pytest of its own, with the leftovers check on.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

celery = pytest.importorskip("celery")

from django.db import connections, transaction  # noqa: E402
from django.http import HttpRequest, HttpResponse  # noqa: E402
from django.test import RequestFactory, override_settings  # noqa: E402

from django_redislock import current_fence, get_lock, redis_locked  # noqa: E402
from django_redislock.contrib.celery_unique import UniqueTask  # noqa: E402
from django_redislock.tasks.options import TaskNotUnique  # noqa: E402
from django_redislock.tasks.unique import unique_task  # noqa: E402
from django_redislock.testing import (  # noqa: E402
    assert_no_locks_left,
    isolated_prefix,
    leftovers,
    local_unique_tasks,
)
from tests.test_docs_claims import page  # noqa: E402
from tests.test_testing_kit import (  # noqa: E402, F401 - a fixture
    EXAMPLES,
    child_env,
    entry_point_path,
    run_pytest,
)

try:  # Django 6.0+
    from django.tasks import task
except ImportError:
    from django_tasks import task  # type: ignore[no-redef]

DUMMY = f"{task.__module__.rsplit('.', 1)[0]}.backends.dummy.DummyBackend"
IMMEDIATE = f"{task.__module__.rsplit('.', 1)[0]}.backends.immediate.ImmediateBackend"

# No broker: "memory://" keeps what is sent in this process, where nothing consumes it.
app = celery.Celery("local_tests", set_as_current=False)
app.conf.update(broker_url="memory://", result_backend=None)
ran: list[Any] = []


@app.task(base=UniqueTask, unique_key="import:{feed_id}", shared=False)
def import_feed(feed_id: int, again: bool = False) -> int:
    if again:
        # A duplicate sent while this one runs is refused, as in production.
        ran.append(import_feed.delay(feed_id).id)
    return feed_id


def _order_lock_held(order_id: int, fence: int | None) -> list[Any]:
    """Whether the view's lock was still held when the task ran (at once, when enqueued)."""
    lock = get_lock(f"order:{order_id}")
    seen = [bool(lock.client.exists(lock.keys.lease)), fence]
    ran.append(seen)
    return seen


@app.task(base=UniqueTask, unique_key="receipt:{order_id}", unique_keep_for=3600, shared=False)
def send_receipt(order_id: int, fence: int | None = None) -> list[Any]:
    return _order_lock_held(order_id, fence)


@unique_task("report:{report_id}")
@task
def build_report(report_id: int, fence: int | None = None) -> list[Any]:
    return _order_lock_held(report_id, fence)


@pytest.fixture(autouse=True)
def _isolated() -> Iterator[str]:
    ran.clear()
    with isolated_prefix() as prefix:
        yield prefix


# -- the kit ---------------------------------------------------------------------------
def test_without_the_kit_a_sent_task_keeps_its_key() -> None:
    """What the kit is for: a delay() in a test holds its key for the task's ttl."""
    import_feed.delay(1)  # to a broker nothing consumes
    (line,) = leftovers()
    assert line.startswith("lock 'unique:import:1': held by")


def test_a_celery_task_runs_here_and_leaves_nothing() -> None:
    with local_unique_tasks():
        result = import_feed.delay(1, again=True)
        assert result.get() == 1
        # The duplicate sent while it ran got the running task.
        assert ran == [result.id]
        assert_no_locks_left()


def test_a_key_kept_after_a_success_is_let_go_when_the_block_ends() -> None:
    with local_unique_tasks():
        first = send_receipt.delay(3)
        assert send_receipt.delay(3).id == first.id  # kept: refused
        (line,) = leftovers()
        assert line.startswith("lock 'unique:receipt:3'")
    assert_no_locks_left()


def test_a_django_task_that_never_runs_is_let_go_when_the_block_ends() -> None:
    with override_settings(TASKS={"default": {"BACKEND": DUMMY}}), local_unique_tasks():
        queued = build_report.enqueue(4)
        assert build_report.enqueue(4).id == queued.id
        assert leftovers()
    assert_no_locks_left()


def test_only_the_keys_taken_in_the_block_are_let_go() -> None:
    outside = get_lock("unique:import:5", timeout=60, wait=0)
    assert outside.acquire()
    with local_unique_tasks():
        assert import_feed.delay(6).get() == 6
        # A key held by someone else is refused here too, and left alone.
        with pytest.raises(TaskNotUnique):
            import_feed.delay(5)
    assert outside.owned()
    outside.release()


async def test_the_kit_decorates_a_coroutine_test_too() -> None:
    @local_unique_tasks()
    async def body() -> None:
        assert send_receipt.delay(8).get() == [False, None]

    await body()
    assert_no_locks_left()


def test_the_fixture_and_the_documented_example_leave_nothing_behind(
    entry_point_path: Path,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    """docs/testing.rst: the example passes with ``redislock_check_leftovers``
    on, whatever the order of the fixtures; without the fixture the same
    ``delay()`` is reported as left behind."""
    (tmp_path / "test_orders.py").write_text(
        "import pytest\n"
        "from tests.testapp.tasks import app, send_receipt\n"
        "app.conf.broker_url = 'memory://'\n"
        "def test_fixtures_in_another_order(redislock_unique_tasks, redislock_no_leftovers):\n"
        "    assert send_receipt.delay(order_id=8).get() == 'receipt 8 sent'\n"
        "def test_without_the_fixture():\n"
        "    send_receipt.delay(order_id=9)\n"
    )
    run = run_pytest(
        "-q",
        "-c",
        str(EXAMPLES / "pytest.ini"),
        "--ds",
        "tests.settings",
        "-p",
        "no:asyncio",
        str(EXAMPLES / "test_unique_tasks.py"),
        str(tmp_path / "test_orders.py"),
        env=child_env(entry_point_path),
    )
    assert "3 passed, 1 error" in run.stdout, run.stdout + run.stderr
    assert "::test_without_the_fixture - AssertionError" in run.stdout
    assert "lock 'unique:receipt:9': held by" in run.stdout


# -- enqueued from a locked view ----------------------------------------------------------
@redis_locked("order:{order_id}", wait=0)
def pay(request: HttpRequest, order_id: int) -> HttpResponse:
    send_receipt.delay_on_commit(order_id, fence=current_fence())
    return HttpResponse("paid")


@redis_locked("order:{report_id}", wait=0)
def report(request: HttpRequest, report_id: int) -> HttpResponse:
    transaction.on_commit(functools.partial(build_report.enqueue, report_id, fence=current_fence()))
    return HttpResponse("queued")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("atomic_requests", [True, False])
def test_an_on_commit_hook_of_a_locked_view_runs_under_the_lock(
    atomic_requests: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/tasks.rst: a hook the view registers runs at its commit, before
    the release (at once outside a transaction): the task is queued while the
    lock is held, with its fence."""
    monkeypatch.setitem(connections.settings["default"], "ATOMIC_REQUESTS", atomic_requests)
    request = RequestFactory().post("/")
    with local_unique_tasks():
        assert pay(request, order_id=1).status_code == 200
    with override_settings(TASKS={"default": {"BACKEND": IMMEDIATE}}):
        assert report(request, report_id=2).status_code == 200
    (celery_held, celery_fence), (django_held, django_fence) = ran
    assert celery_held and django_held
    assert isinstance(celery_fence, int) and isinstance(django_fence, int)
    assert_no_locks_left()


def test_the_page_names_the_methods_it_offers() -> None:
    text = " ".join(page("tasks").split())
    assert "``delay_on_commit()``" in text and "``apply_async_on_commit()``" in text
