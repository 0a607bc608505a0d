"""A unique task's key through Celery's whole lifecycle, on a real prefork worker.

Expiry, revocation, time limits, a lost pool process, a message the worker
does not know, and duplicates inside a group, chord or chain: what happens
to the key in each case, as docs/tasks.rst says in its tables. The cases are
the rows of ``LIFECYCLE`` and ``CANVASES`` below, one test each, and the
pages' tables must name the same rows.

One ``celery worker -P prefork -c 1`` serves the module (tests/celery_harness.py).
A task that must wait in the broker is sent to a queue no worker consumes,
and the worker is told to consume it (``add_consumer``) when the test is
ready for it. The tasks hold their keys with a running lease of ``LONG`` and
a pending ttl of ``TTL``: a key gone within ``BOUND`` was let go on purpose,
not run out.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

celery = pytest.importorskip("celery")

import django  # noqa: E402
import redis  # noqa: E402
from celery import chain, chord, group  # noqa: E402
from celery.exceptions import (  # noqa: E402
    ChordError,
    SoftTimeLimitExceeded,
    TaskRevokedError,
    TimeLimitExceeded,
    WorkerLostError,
)
from django.apps import apps  # noqa: E402

if not apps.ready:  # in the worker: this module is its task module
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()

from django_redislock import get_lock  # noqa: E402
from django_redislock.contrib.celery_unique import UniqueTask  # noqa: E402
from django_redislock.tasks import claims  # noqa: E402
from django_redislock.tasks.options import HEADER, Claim, TaskNotUnique  # noqa: E402
from tests import celery_harness as harness  # noqa: E402
from tests.celery_harness import Worker, free_within, holder, locks, pop_json  # noqa: E402
from tests.servers import RedisServer  # noqa: E402
from tests.test_docs_claims import page  # noqa: E402

pytestmark = pytest.mark.program

QUEUE = "unique-lifecycle"
LONG = 60.0  # the running lease: renewed while a task runs
TTL = 300.0  # the pending ttl
BOUND = 20.0  # how long a test waits for a key to go: well below both
KEEP = 120.0  # unique_keep_for of ``receipt``

app = celery.Celery("unique_lifecycle", set_as_current=False)
app.conf.task_default_queue = QUEUE
if harness.in_worker():
    harness.configure(app, os.environ[harness.BROKER_ENV])

UNIQUE = {"base": UniqueTask, "bind": True, "unique_lease": LONG, "unique_ttl": TTL}


def _report(task: Any, name: str) -> int:
    """Tell the test this run started; returns how many runs of ``name`` did."""
    c = locks()
    report = {
        "id": task.request.id,
        "pid": os.getpid(),
        "token": holder(f"unique:job:{name}"),
        "retries": task.request.retries,
    }
    # Counted before the test hears of it: the test may kill this process at once.
    runs = int(c.incr(f"runs:{name}"))
    c.rpush(f"started:{name}", json.dumps(report))
    return runs


def _wait_for_go(name: str) -> None:
    locks().blpop([f"go:{name}"], timeout=2 * BOUND)


@app.task(unique_key="job:{name}", **UNIQUE)
def job(self: Any, name: str, block: bool = False) -> str:
    _report(self, name)
    if block:
        _wait_for_go(name)
    return name


@app.task(unique_key="job:{name}", max_retries=1, **UNIQUE)
def retry_later(self: Any, name: str) -> str:
    _report(self, name)
    raise self.retry(countdown=100)


# The first delivery waits (to be killed, or to time out); the next returns.
@app.task(unique_key="job:{name}", acks_late=True, reject_on_worker_lost=True, **UNIQUE)
def redelivered(self: Any, name: str) -> str:
    if _report(self, name) == 1:
        _wait_for_go(name)
    return name


@app.task(
    unique_key="job:{name}",
    acks_late=True,
    acks_on_timeout=False,  # Celery 5.7+
    acks_on_failure_or_timeout=False,  # before 5.7
    **UNIQUE,
)
def requeued_on_timeout(self: Any, name: str) -> str:
    if _report(self, name) == 1:
        _wait_for_go(name)
    return name


# A running lease shorter than the retry's delay: the key must wait for the
# retry, or it is gone when the retry runs. The lease must still outlast
# Celery's notice of the lost process (worker_lost_wait, then the retry's
# sending), which a loaded host stretches past 4 s.
@app.task(
    unique_key="job:{name}",
    retry_on_worker_lost=True,  # Celery 5.7+
    default_retry_delay=14,
    max_retries=1,
    **{**UNIQUE, "unique_lease": 9.0},
)
def retried_when_lost(self: Any, name: str) -> str:
    if _report(self, name) == 1:
        _wait_for_go(name)
    return name


@app.task(unique_key="receipt:{order}", unique_keep_for=KEEP, max_retries=1, **UNIQUE)
def receipt(self: Any, order: int, fail: bool = False, retry: bool = False) -> int:
    if fail:
        raise ValueError(order)
    if retry and not self.request.retries:
        raise self.retry(countdown=0)
    return order


@app.task
def collect(results: Any, where: str) -> Any:
    locks().rpush(f"collected:{where}", json.dumps(results))
    return results


@app.task
def ping() -> str:
    return "pong"


if not harness.in_worker():
    # Known here only: the worker receives a message of a task it does not know.
    @app.task(base=UniqueTask, unique_key="job:{name}", unique_ttl=TTL, name="elsewhere.stranger")
    def stranger(name: str) -> str:
        return name


# -- the worker ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def broker() -> Iterator[RedisServer]:
    yield from harness.start_broker(app)


@pytest.fixture(scope="module")
def worker(broker: RedisServer, redis_server: Any) -> Iterator[Worker]:
    w = Worker(
        "tests.test_unique_tasks_lifecycle:app",
        broker,
        redis_server.socket_path,
        queue=QUEUE,
        ping=ping,
        pool="prefork",
    )
    yield w
    w.stop()


class Case:
    """What a test of a row gets: the worker, the lock Redis, and what it does with them."""

    def __init__(self, worker: Worker, r: redis.Redis, name: str) -> None:
        self.worker = worker
        self.r = r
        self.name = name  # the job's name; its key is unique:job:<name>
        self.key = f"unique:job:{name}"
        self._released: list[str] = []

    def lease(self) -> bytes:
        return get_lock(self.key).keys.lease  # type: ignore[no-any-return]

    def pttl(self) -> int:
        return int(self.r.pttl(self.lease()))

    def parked(self) -> str:
        """A queue no worker consumes (yet)."""
        return f"parked-{uuid.uuid4().hex[:8]}"

    def consume(self, queue: str) -> None:
        """Have the worker consume ``queue`` from now on."""
        replies = app.control.add_consumer(
            queue, destination=[self.worker.name], reply=True, timeout=BOUND
        )
        assert replies, f"the worker did not answer; its log:\n{self.worker.tail()}"

    def revoke(self, result: Any, **options: Any) -> None:
        """``result.revoke(...)``, once the worker has it (its reply: asked of
        this worker alone, so that it comes without waiting for others)."""
        replies = app.control.revoke(
            result.id, destination=[self.worker.name], reply=True, timeout=BOUND, **options
        )
        assert replies, f"the worker did not answer; its log:\n{self.worker.tail()}"

    def started(self) -> dict[str, Any]:
        return pop_json(self.r, f"started:{self.name}", self.worker)  # type: ignore[no-any-return]

    def go(self) -> None:
        self.r.rpush(f"go:{self.name}", "1")

    def freed(self) -> None:
        """The key goes within BOUND: let go on purpose (its lease or ttl is longer)."""
        try:
            free_within(self.r, self.key, BOUND)
        except AssertionError as exc:
            lease = self.r.hgetall(self.lease())
            raise AssertionError(f"{exc} ({lease}); worker log:\n{self.worker.tail()}") from None

    def kill_pool_process(self, pid: int) -> None:
        # A pool process of the worker this module started (never another's).
        assert pid != self.worker.proc.pid and pid != os.getpid()
        os.kill(pid, signal.SIGKILL)


# -- the lifecycle: what happens to the key --------------------------------------------------
def _expires(case: Case, **options: Any) -> None:
    queue = case.parked()
    first = job.apply_async((case.name,), queue=queue, **options)
    # The claim lasts no longer than the message: its TTL ends at the expiry...
    assert 0 < case.pttl() <= 2000
    case.freed()
    # ...so a later delay() is a new task, and runs, rather than being handed
    # the expired one.
    again = job.delay(case.name)
    assert again.id != first.id
    assert again.get(timeout=BOUND) == case.name
    # The worker then reaches the expired message and discards it.
    case.consume(queue)
    with pytest.raises(TaskRevokedError):
        first.get(timeout=BOUND)


def expires_seconds(case: Case) -> None:
    _expires(case, expires=2)


def expires_datetime(case: Case) -> None:
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=2)
    _expires(case, expires=later)


def expires_before_the_countdown(case: Case) -> None:
    _expires(case, expires=2, countdown=100)


def expires_on_a_retry(case: Case) -> None:
    first = retry_later.apply_async((case.name,), expires=30)
    assert case.started()["retries"] == 0
    _until_state(first, "RETRY")
    # The key waits for the retry (countdown 100), but no longer than the expiry.
    assert 0 < case.pttl() <= 30_000


def revoked_while_queued(case: Case) -> None:
    queue = case.parked()
    first = job.apply_async((case.name,), queue=queue)
    case.revoke(first)
    case.consume(queue)  # the worker reaches the message and discards it
    case.freed()
    with pytest.raises(TaskRevokedError):
        first.get(timeout=BOUND)


def revoked_then_enqueued_again(case: Case) -> None:
    first = job.apply_async((case.name,), queue=case.parked())
    # The worker has the revoke (and records it in the result backend)
    # before the message reaches it: a delay() is a new task at once.
    case.revoke(first)
    _until_state(first, "REVOKED")
    again = job.delay(case.name)
    assert again.id != first.id
    assert again.get(timeout=BOUND) == case.name


def revoked_and_terminated(case: Case) -> None:
    first = job.delay(case.name, block=True)
    case.started()
    case.revoke(first, terminate=True, signal="SIGKILL")
    case.freed()
    assert job.delay(case.name).get(timeout=BOUND) == case.name


def soft_time_limit(case: Case) -> None:
    result = job.apply_async((case.name,), {"block": True}, soft_time_limit=1)
    with pytest.raises(SoftTimeLimitExceeded):
        result.get(timeout=BOUND)
    # The run ended by the exception, as any failure: the key went with it.
    assert not case.r.exists(case.lease())


def hard_time_limit(case: Case) -> None:
    result = job.apply_async((case.name,), {"block": True}, time_limit=1)
    with pytest.raises(TimeLimitExceeded):
        result.get(timeout=BOUND)
    case.freed()


def hard_time_limit_requeued(case: Case) -> None:
    requeued_on_timeout.apply_async((case.name,), time_limit=1)
    first = case.started()
    # The pool process is killed; the message goes back to the queue and its
    # next delivery runs under the same claim.
    second = case.started()
    assert second["id"] == first["id"] and second["token"] == first["token"] is not None
    case.freed()


def pool_process_lost(case: Case) -> None:
    result = job.delay(case.name, block=True)
    case.kill_pool_process(case.started()["pid"])
    with pytest.raises(WorkerLostError):
        result.get(timeout=BOUND)
    case.freed()


def pool_process_lost_redelivered(case: Case) -> None:
    redelivered.delay(case.name)
    first = case.started()
    case.kill_pool_process(first["pid"])
    second = case.started()
    assert second["id"] == first["id"] and second["token"] == first["token"] is not None
    case.freed()


def pool_process_lost_retried(case: Case) -> None:
    if not hasattr(celery.Task, "retry_on_worker_lost"):
        pytest.skip("retry_on_worker_lost is Celery 5.7+")
    result = retried_when_lost.delay(case.name)
    first = case.started()
    case.kill_pool_process(first["pid"])
    try:
        second = case.started()
    except AssertionError:
        raise AssertionError(case.worker.tail()) from None
    assert second["retries"] == 1
    assert second["id"] == first["id"] and second["token"] == first["token"] is not None
    assert result.get(timeout=BOUND) == case.name
    case.freed()


def unknown_to_the_worker(case: Case) -> None:
    stranger.apply_async((case.name,), queue=QUEUE)
    case.freed()


def _until_state(result: Any, state: str) -> None:
    """Wait (at most BOUND) until the result backend says ``state``."""
    deadline = time.monotonic() + BOUND
    while result.state != state:
        assert time.monotonic() < deadline, f"{result.id} is {result.state}, never {state}"
        time.sleep(0.05)


LIFECYCLE: dict[str, Callable[[Case], None]] = {
    "``expires=`` in seconds": expires_seconds,
    "``expires=`` as a datetime": expires_datetime,
    "``expires=`` before the ``countdown`` ends": expires_before_the_countdown,
    "``expires=`` of a task that retries": expires_on_a_retry,
    "``revoke()`` while queued": revoked_while_queued,
    "``revoke()`` while queued, then ``delay()``": revoked_then_enqueued_again,
    "``revoke(terminate=True)`` while running": revoked_and_terminated,
    "``soft_time_limit``": soft_time_limit,
    "``time_limit``": hard_time_limit,
    "``time_limit`` with ``acks_late``, not ``acks_on_timeout``": hard_time_limit_requeued,
    "pool process lost (``WorkerLostError``)": pool_process_lost,
    "pool process lost, ``acks_late`` and ``reject_on_worker_lost``": (
        pool_process_lost_redelivered
    ),
    "pool process lost, ``retry_on_worker_lost``": pool_process_lost_retried,
    "a worker that does not know the task (``task_unknown``)": unknown_to_the_worker,
}


@pytest.mark.parametrize("event", list(LIFECYCLE))
def test_the_key_through_the_lifecycle(event: str, worker: Worker, r_locks: redis.Redis) -> None:
    name = f"case-{list(LIFECYCLE).index(event)}"
    case = Case(worker, r_locks, name)
    try:
        LIFECYCLE[event](case)
    finally:
        case.go()  # whatever still waits for it


# -- duplicates inside a canvas: never a hang ---------------------------------------------
def in_a_group(case: Case) -> None:
    other = f"{case.name}-other"
    result = group(job.s(case.name, block=True), job.s(case.name), job.s(other)).apply_async()
    case.started()  # the first holds the key while the duplicate is sent
    case.go()
    first, duplicate, last = result.get(timeout=BOUND, propagate=False)
    assert (first, last) == (case.name, other)
    assert isinstance(duplicate, TaskNotUnique)
    assert duplicate.task_id == result.results[0].id
    assert duplicate.name == case.key


def in_a_chord(case: Case) -> None:
    header = [job.s(case.name, block=True), job.s(case.name), job.s(f"{case.name}-other")]
    result = chord(header, collect.s(case.name))()
    case.started()
    case.go()
    # Celery 5.7 gives the header's own exception; earlier, a ChordError naming it.
    with pytest.raises((ChordError, TaskNotUnique)) as info:
        result.get(timeout=BOUND)
    assert case.key in str(info.value)
    assert case.r.llen(f"collected:{case.name}") == 0  # the body never ran


def in_a_chain(case: Case) -> None:
    held = job.apply_async((case.name,), queue=case.parked())  # holds the key, never runs
    result = chain(ping.si(), job.si(case.name), collect.si([], case.name)).apply_async()
    with pytest.raises(TaskNotUnique) as info:
        result.get(timeout=BOUND)
    assert info.value.task_id == held.id
    assert case.r.llen(f"collected:{case.name}") == 0


def with_a_task_id_of_its_own(case: Case) -> None:
    held = job.apply_async((case.name,), queue=case.parked())
    mine = str(uuid.uuid4())
    # (Sent without its countdown: the refusal needs no waiting.)
    result = job.apply_async((case.name,), task_id=mine, countdown=100)
    # The id the caller chose is the one that answers, with the refusal.
    assert result.id == mine
    with pytest.raises(TaskNotUnique) as info:
        result.get(timeout=BOUND)
    assert info.value.task_id == held.id


def with_the_pending_tasks_own_id(case: Case) -> None:
    queue = case.parked()
    held = job.apply_async((case.name,), queue=queue)
    # The same task, sent again by its id: nothing more is sent (a refusal
    # under that id would fail the pending task's own result).
    assert job.apply_async((case.name,), task_id=held.id).id == held.id
    case.consume(queue)
    assert held.get(timeout=BOUND) == case.name


def without_a_task_id(case: Case) -> None:
    held = job.apply_async((case.name,), queue=case.parked())
    assert job.delay(case.name).id == held.id  # the pending task's result, as documented


CANVASES: dict[str, Callable[[Case], None]] = {
    "``group``": in_a_group,
    "``chord`` header": in_a_chord,
    "``chain``": in_a_chain,
    "``apply_async(task_id=...)``": with_a_task_id_of_its_own,
    "``apply_async(task_id=...)`` with the pending task's own id": with_the_pending_tasks_own_id,
    "``delay()``, ``apply_async()`` without a ``task_id``": without_a_task_id,
}


@pytest.mark.parametrize("shape", list(CANVASES))
def test_a_duplicate_in_a_canvas_completes(
    shape: str, worker: Worker, r_locks: redis.Redis
) -> None:
    case = Case(worker, r_locks, f"canvas-{list(CANVASES).index(shape)}")
    try:
        CANVASES[shape](case)
    finally:
        case.go()


# -- kept after a successful run ---------------------------------------------------------
def test_keep_for_keeps_the_key_after_a_success_only(worker: Worker, r_locks: redis.Redis) -> None:
    first = receipt.delay(1)
    assert first.get(timeout=BOUND) == 1
    lease = get_lock("unique:receipt:1").keys.lease
    # Kept for unique_keep_for after the success: a late delay() is refused
    # and handed the finished task, whose result is there.
    assert KEEP * 1000 - 10_000 < r_locks.pttl(lease) <= KEEP * 1000
    again = receipt.delay(1)
    assert again.id == first.id and again.get(timeout=BOUND) == 1
    # A failure lets the key go at once, as without the option.
    failed = receipt.delay(2, fail=True)
    with pytest.raises(ValueError):
        failed.get(timeout=BOUND)
    assert not r_locks.exists(get_lock("unique:receipt:2").keys.lease)
    # A retry keeps it until it runs, and the retry's success keeps it for KEEP.
    retried = receipt.delay(3, retry=True)
    assert retried.get(timeout=BOUND) == 3
    assert r_locks.pttl(get_lock("unique:receipt:3").keys.lease) > KEEP * 1000 - 10_000


# -- a run stopped by a signal it can handle -------------------------------------------------
@pytest.mark.parametrize("acks_late", [True, False])
def test_an_interrupted_run_keeps_the_key_for_its_next_delivery(
    acks_late: bool, r_locks: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SystemExit of a pool process told to stop (billiard raises it on
    SIGTERM) ends the run: with acks_late its message comes back, so the key
    is kept for the pending ttl; without, it is let go. In this process."""
    opts = job.unique_options
    assert opts is not None
    lock, claim = claims.claim(opts, "unique:job:stopped", task_id="stopped-1")
    assert lock is not None and isinstance(claim, Claim)
    task = job._get_current_object()  # the task itself, not the app's proxy
    monkeypatch.setattr(type(task), "acks_late", acks_late)

    def stopped(self: Any, name: str, block: bool = False) -> str:
        raise SystemExit(1)

    monkeypatch.setattr(type(task), "run", stopped)
    task.push_request(id="stopped-1", headers={HEADER: claim.payload()})
    try:
        with pytest.raises(SystemExit):
            task("stopped")
    finally:
        task.pop_request()
    lease = get_lock("unique:job:stopped").keys.lease
    if acks_late:
        assert holder("unique:job:stopped") == claim.token
        assert LONG * 1000 < r_locks.pttl(lease) <= TTL * 1000
    else:
        assert not r_locks.exists(lease)


def test_an_expires_set_on_the_task_ends_the_key_too(r_locks: redis.Redis) -> None:
    """docs/tasks.rst: ``expires`` "given to ``apply_async`` or set on the task"."""
    bare = celery.Celery("task_expires", set_as_current=False)
    bare.conf.update(broker_url="memory://", result_backend=None)

    @bare.task(base=UniqueTask, unique_key="expiring:{n}", unique_ttl=TTL, expires=2, shared=False)
    def expiring(n: int) -> int:
        return n

    expiring.delay(1)  # to a broker nothing consumes
    assert 0 < r_locks.pttl(get_lock("unique:expiring:1").keys.lease) <= 2000
    expiring.apply_async((2,), expires=60)  # given to apply_async: that one
    assert 2000 < r_locks.pttl(get_lock("unique:expiring:2").keys.lease) <= 60_000
    bare.close()


def test_without_a_result_backend_a_duplicate_is_refused_as_usual() -> None:
    """Without a result backend nothing tells a revoked task from a queued
    one: its key waits for a worker to meet the message."""
    bare = celery.Celery("no_backend", set_as_current=False)
    bare.conf.update(broker_url="memory://", result_backend=None)

    @bare.task(base=UniqueTask, unique_key="bare:{n}", shared=False, name="bare.job")
    def bare_job(n: int) -> int:
        return n

    first = bare_job.delay(1)  # to a broker nothing consumes
    assert bare_job.delay(1).id == first.id
    bare.close()


# -- the pages say the same -----------------------------------------------------------------
def _table_rows(text: str, title: str) -> list[str]:
    """The first cells of the list-table called ``title`` in docs/tasks.rst."""
    start = text.index(f".. list-table:: {title}")
    rows = []
    for line in text[start:].splitlines()[1:]:
        if line and not line.startswith(" "):
            break
        if line.startswith("   * - "):
            rows.append(line[len("   * - ") :].strip())
    return rows[1:]  # below the header


def test_the_pages_tables_name_every_case_tested_here() -> None:
    text = page("tasks")
    assert _table_rows(text, "What happens to the key") == list(LIFECYCLE)
    assert _table_rows(text, "A duplicate in a canvas") == list(CANVASES)
