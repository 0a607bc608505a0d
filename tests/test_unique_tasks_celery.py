"""Unique Celery tasks (``UniqueTask``) with a real worker.

The worker is a ``celery worker -P solo`` subprocess of this module
(tests/celery_harness.py starts it, its broker, and stops both); it imports
this module to find the tasks (the module sets Django up there). Tasks tell
the test where they are through lists in the lock Redis.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest

celery = pytest.importorskip("celery")

import django  # noqa: E402
import redis  # noqa: E402
from celery.signals import task_postrun  # noqa: E402
from django.apps import apps  # noqa: E402
from django.core.management import call_command  # noqa: E402

if not apps.ready:  # in the worker: this module is its task module
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()

from django_redislock import get_lock  # noqa: E402
from django_redislock.contrib.celery_unique import UniqueTask  # noqa: E402
from django_redislock.core.ops.inspection import list_locks  # noqa: E402
from django_redislock.locking.factories import keyspace  # noqa: E402
from django_redislock.signals import task_duplicate  # noqa: E402
from django_redislock.tasks.options import HEADER, TaskNotUnique  # noqa: E402
from tests import celery_harness as harness  # noqa: E402
from tests.celery_harness import Worker, free_within, holder, locks  # noqa: E402
from tests.servers import RedisServer  # noqa: E402

pytestmark = pytest.mark.program

QUEUE = "unique-tests"
LEASE = 1.0  # the running lease of the tasks below: renewed while they run

app = celery.Celery("unique_tests", set_as_current=False)
app.conf.task_default_queue = QUEUE
if harness.in_worker():
    harness.configure(app, os.environ[harness.BROKER_ENV])


@app.task(
    base=UniqueTask,
    bind=True,
    unique_key="import:{feed_id}",
    unique_lease=LEASE,
    unique_ttl=30,
    max_retries=5,
)
def import_feed(self: Any, feed_id: int, retries: int = 0, block: bool = False) -> int:
    c = locks()
    c.rpush(
        f"started:{feed_id}",
        json.dumps(
            {
                "attempt": self.request.retries,
                "id": self.request.id,
                "token": holder(f"unique:import:{feed_id}"),
            }
        ),
    )
    if block:
        c.blpop([f"go:{feed_id}"], timeout=30)
    if self.request.retries < retries:
        raise self.retry(countdown=0)
    return feed_id


@app.task(
    base=UniqueTask, unique_key="report:{report_id}", unique_ttl=1.0, unique_on_duplicate="raise"
)
def build_report(report_id: int) -> int:
    return report_id


@app.task(
    base=UniqueTask, bind=True, unique_key="sync:{account}", unique_until="start", max_retries=2
)
def sync_account(self: Any, account: str) -> int:
    c = locks()
    c.rpush(f"synced:{account}", json.dumps(holder(f"unique:sync:{account}")))
    if self.request.retries < 1:
        raise self.retry(countdown=0)
    return int(self.request.retries)


@app.task(base=UniqueTask, unique_key="mail:{user_id}", unique_until="enqueue")
def send_mail(user_id: int) -> str | None:
    return holder(f"unique:mail:{user_id}")


@app.task
def ping() -> str:
    return "pong"


# -- every way Celery schedules a retry ------------------------------------------------------
# Each task below asks for one retry, in its own way, COUNTDOWN seconds ahead;
# the retry waits for the test's "go" before it finishes. A signal in the
# worker tells the test when each attempt has ended (its key handed on or let
# go), so the test looks at the key between the first attempt and the retry.
COUNTDOWN = 1


class Flaky(Exception):
    """What the autoretry tasks fail with on their first attempt."""


def _attempt(task: Any, job: str) -> bool:
    """Report this attempt; True on the first one (ask for a retry), else wait for go."""
    c = locks()
    name = f"unique:retry:{job}"
    c.rpush(f"attempts:{job}", json.dumps({"attempt": task.request.retries, "token": holder(name)}))
    if task.request.retries == 0 and not task.request.kwargs.get("again"):
        return True
    c.blpop([f"go:{job}"], timeout=30)
    return False


RETRYING = {"unique_key": "retry:{job}", "unique_lease": LEASE, "unique_ttl": 30}


@app.task(base=UniqueTask, bind=True, max_retries=3, **RETRYING)
def retry_raised(self: Any, job: str) -> str:
    if _attempt(self, job):
        raise self.retry(countdown=COUNTDOWN)
    return job


@app.task(base=UniqueTask, bind=True, max_retries=3, **RETRYING)
def retry_not_thrown(self: Any, job: str) -> str:
    if _attempt(self, job):
        self.retry(countdown=COUNTDOWN, throw=False)
        return "asked for a retry"
    return job


@app.task(
    base=UniqueTask,
    bind=True,
    autoretry_for=(Flaky,),
    retry_kwargs={"countdown": COUNTDOWN, "max_retries": 3},
    **RETRYING,
)
def retry_automatic(self: Any, job: str) -> str:
    if _attempt(self, job):
        raise Flaky(job)
    return job


@app.task(
    base=UniqueTask,
    bind=True,
    autoretry_for=(Flaky,),
    retry_backoff=COUNTDOWN,
    retry_jitter=False,
    max_retries=3,
    **RETRYING,
)
def retry_backing_off(self: Any, job: str) -> str:
    if _attempt(self, job):
        raise Flaky(job)
    return job


@app.task(base=UniqueTask, bind=True, **RETRYING)
def resent_by_itself(self: Any, job: str, again: bool = False) -> str:
    if _attempt(self, job):
        self.apply_async((job,), {"again": True}, task_id=self.request.id, countdown=COUNTDOWN)
        return "sent itself again"
    return job


RETRY_TASKS = {
    "raise self.retry()": retry_raised,
    "self.retry(throw=False)": retry_not_thrown,
    "autoretry_for": retry_automatic,
    "retry_backoff": retry_backing_off,
    "self.apply_async(task_id=own id)": resent_by_itself,
}


# What a first attempt that asked for its retry and returned gave back.
FIRST_RETURNS = {
    "self.retry(throw=False)": "asked for a retry",
    "self.apply_async(task_id=own id)": "sent itself again",
}


@task_postrun.connect
def _attempt_ended(sender: Any = None, args: Any = None, **kwargs: Any) -> None:
    if sender is not None and sender.name in {t.name for t in RETRY_TASKS.values()}:
        locks().rpush(f"ended:{args[0]}", "1")


@app.task(base=UniqueTask, bind=True, unique_key="owner:{job}", unique_lease=LEASE)
def report_owner(self: Any, job: str) -> None:
    c = locks()
    c.rpush(f"running:{job}", str(os.getpid()))
    c.blpop([f"go:{job}"], timeout=30)


# -- the broker and the worker ---------------------------------------------------------------
@pytest.fixture(scope="module")
def broker() -> Iterator[RedisServer]:
    yield from harness.start_broker(app)


def _worker(broker: RedisServer, redis_socket: str, queue: str = QUEUE) -> Worker:
    return Worker(
        "tests.test_unique_tasks_celery:app", broker, redis_socket, queue=queue, ping=ping
    )


@pytest.fixture(scope="module")
def worker(broker: RedisServer, redis_server: Any) -> Iterator[Worker]:
    w = _worker(broker, redis_server.socket_path)
    yield w
    w.stop()


@pytest.fixture
def duplicates() -> Iterator[list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        sent.append(kwargs)

    task_duplicate.connect(receiver)
    yield sent
    task_duplicate.disconnect(receiver)


def _started(r: redis.Redis, feed_id: int, worker: Worker) -> dict[str, Any]:
    return harness.pop_json(r, f"started:{feed_id}", worker)  # type: ignore[no-any-return]


# -- tests ---------------------------------------------------------------------------------
def test_duplicates_of_a_running_task_get_its_result(
    worker: Worker, r_locks: redis.Redis, duplicates: list[dict[str, Any]]
) -> None:
    first = import_feed.delay(1, block=True)
    seen = _started(r_locks, 1, worker)
    assert seen["id"] == first.id and seen["token"] is not None

    barrier = threading.Barrier(5)
    ids: list[str] = []

    def duplicate() -> None:
        barrier.wait(10)
        ids.append(import_feed.delay(1, block=True).id)

    threads = [threading.Thread(target=duplicate) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert ids == [first.id] * 5
    assert [d["task_id"] for d in duplicates] == [first.id] * 5

    r_locks.rpush("go:1", "1")
    assert first.get(timeout=20) == 1
    # The run that finished let the key go: the next enqueue is a new task.
    assert not r_locks.exists(get_lock("unique:import:1").keys.lease)
    again = import_feed.delay(1)
    assert again.id != first.id and again.get(timeout=20) == 1


def test_retries_keep_ownership(worker: Worker, r_locks: redis.Redis) -> None:
    result = import_feed.delay(2, retries=2)
    assert result.get(timeout=30) == 2
    runs = [_started(r_locks, 2, worker) for _ in range(3)]
    assert [run["attempt"] for run in runs] == [0, 1, 2]
    # Every attempt ran under the enqueuer's token, and the last let it go.
    assert {run["token"] for run in runs} == {runs[0]["token"]}
    assert runs[0]["token"] is not None
    assert not r_locks.exists(get_lock("unique:import:2").keys.lease)


def test_until_enqueue_frees_the_key_as_the_run_starts(worker: Worker) -> None:
    """docs/tasks.rst, ``"enqueue"``: "when a worker starts the run"."""
    assert send_mail.delay(1).get(timeout=20) is None  # free while it ran
    assert holder("unique:mail:1") is None


def test_until_start_a_retry_runs_without_the_key(worker: Worker, r_locks: redis.Redis) -> None:
    """docs/tasks.rst, ``"start"``: "a retry it asks for runs without the key"."""
    assert sync_account.delay("acme").get(timeout=30) == 1
    held = [json.loads(r_locks.lpop("synced:acme") or b"0") for _ in range(2)]
    assert held[0] is not None and held[1] is None
    assert holder("unique:sync:acme") is None


def test_another_task_cannot_release_the_key(worker: Worker, r_locks: redis.Redis) -> None:
    # Queued where no worker listens: it holds the key and never runs.
    parked = import_feed.apply_async((3,), queue="nowhere")
    name = "unique:import:3"
    token = holder(name)
    assert token is not None
    assert r_locks.hget(get_lock(name).keys.lease, "j") == parked.id.encode()
    assert HEADER == "redislock_unique"  # docs/tasks.rst names it
    # A task with the same key but another token runs without the key...
    forged = {"n": name, "t": "0123456789abcdef", "f": 1, "u": "finish", "l": LEASE, "p": 30}
    other = import_feed.apply_async((3,), headers={HEADER: forged})
    assert other.get(timeout=20) == 3
    # ...and cannot release it.
    assert holder(name) == token


def test_a_task_that_never_starts_frees_the_key_within_its_ttl(
    broker: RedisServer, r_locks: redis.Redis
) -> None:
    first = build_report.apply_async((4,), queue="nowhere")  # unique_ttl=1.0
    with pytest.raises(TaskNotUnique) as info:
        build_report.apply_async((4,), queue="nowhere")
    assert info.value.task_id == first.id
    waited = free_within(r_locks, "unique:report:4", 10)
    assert waited < 1.0 + 0.5  # the ttl, and a margin for a loaded host
    assert build_report.apply_async((4,), queue="nowhere").id != first.id


def test_a_countdown_lengthens_the_pending_ttl(broker: RedisServer, r_locks: redis.Redis) -> None:
    """docs/tasks.rst: "A ``run_after`` (Celery: ``countdown`` or ``eta``) is added to it"."""
    build_report.apply_async((7,), countdown=100, queue="nowhere")  # unique_ttl=1.0
    assert 100_000 < r_locks.pttl(get_lock("unique:report:7").keys.lease) <= 101_000


def test_a_killed_worker_frees_the_key_within_the_lease(
    broker: RedisServer, redis_server: Any, r_locks: redis.Redis
) -> None:
    # A worker of its own, on a queue of its own: the module's worker must not take the task.
    doomed = _worker(broker, redis_server.socket_path, queue="doomed")
    try:
        import_feed.apply_async((5,), {"block": True}, queue="doomed")
        _started(r_locks, 5, doomed)
        name = "unique:import:5"
        token = holder(name)
        # Renewed while it runs: still held after more than one lease.
        time.sleep(LEASE * 1.5)
        assert holder(name) == token
        doomed.kill()
        waited = free_within(r_locks, name, 10)
        assert waited < LEASE + 0.5
    finally:
        doomed.stop()


def test_bad_options_fail_when_the_task_is_made() -> None:
    other = celery.Celery("bad_options", set_as_current=False)
    with pytest.raises(ValueError, match=r"UniqueTask bad_template: lock key 'import:\{nope\}'"):

        @other.task(base=UniqueTask, unique_key="import:{nope}", shared=False, name="bad.1")
        def bad_template(feed_id: int) -> None:
            pass

        other.finalize(auto=True)
    with pytest.raises(ValueError, match="until must be one of"):

        @other.task(
            base=UniqueTask, unique_key="x:{a}", unique_until="done", shared=False, name="bad.2"
        )
        def until_done(a: int) -> None:
            pass

        other.finalize(auto=True)
    other.close()


def test_a_refusal_is_logged(broker: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="django_redislock.unique")
    first = build_report.apply_async((6,), queue="nowhere")
    with pytest.raises(TaskNotUnique):
        build_report.delay(6)
    (record,) = [rec for rec in caplog.records if rec.name == "django_redislock.unique"]
    assert first.id in record.getMessage()


def test_eager_mode_runs_under_the_key(r_locks: redis.Redis) -> None:
    """docs/tasks.rst: "``task_always_eager`` works: the task runs under the key"."""
    eager = celery.Celery("eager", set_as_current=False)
    eager.conf.update(
        task_always_eager=True,
        task_eager_propagates=True,
        broker_url="memory://",
        result_backend=None,
    )
    seen: list[str | None] = []

    @eager.task(base=UniqueTask, unique_key="eager:{n}", shared=False, name="eager.run")
    def run(n: int) -> int:
        seen.append(holder(f"unique:eager:{n}"))
        return n

    assert run.delay(1).get() == 1
    assert seen[0] is not None
    assert holder("unique:eager:1") is None
    eager.close()


_pop = harness.pop


@pytest.mark.parametrize("how", list(RETRY_TASKS))
def test_every_kind_of_retry_keeps_the_key_until_it_has_run(
    how: str, worker: Worker, r_locks: redis.Redis, duplicates: list[dict[str, Any]]
) -> None:
    """docs/tasks.rst, ``"finish"``: a retry, however it is asked for, keeps the key."""
    job_task = RETRY_TASKS[how]
    job = f"{job_task.name.rsplit('.', 1)[-1]}"
    name = f"unique:retry:{job}"
    try:
        first = job_task.delay(job)
        seen = json.loads(_pop(r_locks, f"attempts:{job}", worker))
        assert seen == {"attempt": 0, "token": seen["token"]} and seen["token"]
        _pop(r_locks, f"ended:{job}", worker)
        # The first attempt is over and its retry is queued: the key is still
        # the claim's, and a duplicate is given the task that will retry.
        assert holder(name) == seen["token"]
        assert job_task.delay(job).id == first.id
        assert [d["task_id"] for d in duplicates] == [first.id]
        retried = json.loads(_pop(r_locks, f"attempts:{job}", worker))
        assert retried["token"] == seen["token"]
    finally:
        r_locks.rpush(f"go:{job}", "1")
    _pop(r_locks, f"ended:{job}", worker)
    # (A first attempt that returned stored its value, and Celery keeps a
    # success: which value shows depends on how the retry was asked for.)
    assert job_task.AsyncResult(first.id).get(timeout=30) in {job, FIRST_RETURNS.get(how)}
    # The retry ended without asking for another: the key is free.
    assert holder(name) is None
    assert r_locks.llen(f"attempts:{job}") == 0


def test_the_worker_that_runs_a_task_is_listed_as_itsholder(
    worker: Worker, r_locks: redis.Redis
) -> None:
    """docs/operating.rst: a unique task's key names its enqueuer, then its worker."""
    name = "unique:owner:1"

    def listed_pid() -> int:
        out = StringIO()
        call_command("redislocks", "list", "--pattern", name, "--format", "json", stdout=out)
        (row,) = json.loads(out.getvalue())["locks"]
        return int(row["pid"])

    parked = report_owner.apply_async(("2",), queue="nowhere")
    # Queued, not started: the process that queued it holds the key.
    (row,) = list_locks(r_locks, keyspace(), "unique:owner:2", literal=True)
    assert parked.id and row.pid == os.getpid()
    try:
        report_owner.delay("1")
        running_pid = int(_pop(r_locks, "running:1", worker))
        assert running_pid == worker.proc.pid != os.getpid()
        assert listed_pid() == running_pid
    finally:
        r_locks.rpush("go:1", "1")
