"""Unique Django tasks (``unique_task``): refused duplicates, ownership, ``until``, TTL.

The installed backport (django_tasks 0.12) has the immediate and dummy
backends only, no worker: the immediate backend runs the task inside
``enqueue``, so a duplicate enqueued from another thread meets a running task;
the dummy backend queues and never runs, so it stands for a task that never
starts. A real worker, killed mid-run, is exercised with Celery in
``test_unique_tasks_celery.py``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.test import override_settings

from django_redislock import RedisUnavailable, get_lock
from django_redislock import connection as rl_connection
from django_redislock.core.ops.inspection import list_locks
from django_redislock.locking.factories import keyspace
from django_redislock.signals import task_duplicate
from django_redislock.tasks.options import KWARG, TaskNotUnique
from django_redislock.tasks.unique import unique_task
from tests.servers import free_port
from tests.test_docs_claims import _signal_arguments, page

try:  # Django 6.0+
    from django.tasks import task
except ImportError:
    try:
        from django_tasks import task  # type: ignore[no-redef]
    except ImportError:
        task = None

pytestmark = pytest.mark.skipif(task is None, reason="no django.tasks / django_tasks")

IMMEDIATE = "django_tasks.backends.immediate.ImmediateBackend"
DUMMY = "django_tasks.backends.dummy.DummyBackend"
if task is not None and task.__module__.startswith("django.tasks"):
    IMMEDIATE = "django.tasks.backends.immediate.ImmediateBackend"
    DUMMY = "django.tasks.backends.dummy.DummyBackend"
BACKENDS = {"default": {"BACKEND": IMMEDIATE}, "dummy": {"BACKEND": DUMMY}}

# A running task waits here until the test lets it finish.
running = threading.Event()
finish = threading.Event()
seen: list[Any] = []


def _locks() -> redis.Redis:
    return get_lock("x").client  # type: ignore[no-any-return]


def _lease(r: redis.Redis, name: str) -> dict[bytes, bytes]:
    return r.hgetall(get_lock(name).keys.lease)  # type: ignore[return-value]


if task is not None:

    @unique_task("import:{feed_id}", ttl=60, lease=5)
    @task(takes_context=True)
    def import_feed(context: Any, feed_id: int) -> str:
        seen.append(
            get_lock(f"unique:import:{feed_id}").client.hget(
                get_lock(f"unique:import:{feed_id}").keys.lease, "t"
            )
        )
        running.set()
        assert finish.wait(20), "the test never let the task finish"
        return str(context.task_result.id)

    @unique_task("report:{report_id}", on_duplicate="raise", ttl=1.0)
    @task
    def build_report(report_id: int) -> int:
        return report_id

    @unique_task("defaults:{n}")
    @task
    def with_defaults(n: int) -> int:
        return int(get_lock("x").client.pttl(get_lock(f"unique:defaults:{n}").keys.lease))

    @unique_task("page:{page_id}", ttl=60, lease=5)
    @task(takes_context=True)
    async def render_page(context: Any, page_id: int) -> list[Any]:
        """A coroutine task: its run adopts the key with an AsyncLock."""
        lease = get_lock(f"unique:page:{page_id}").keys.lease
        token, noted = _locks().hmget(lease, ["t", "j"])
        return [token and token.decode(), noted and noted.decode(), str(context.task_result.id)]

    @unique_task("mail:{user_id}", until="enqueue")
    @task
    def send_mail(user_id: int) -> bool:
        # Let go when the run started: the key is free while it runs.
        return get_lock(f"unique:mail:{user_id}", wait=0).acquire()

    @unique_task("sync:{account}", until="start")
    @task
    def sync_account(account: str, fail: bool = False) -> bool:
        held = bool(
            get_lock(f"unique:sync:{account}").client.exists(
                get_lock(f"unique:sync:{account}").keys.lease
            )
        )
        if fail:
            raise RuntimeError("sync failed")
        return held

    @unique_task("owned:{n}", ttl=60, lease=5)
    @task
    def held_by(n: int) -> str:
        """Who ``redislocks list`` says holds the key while the run is on."""
        (row,) = list_locks(_locks(), keyspace(), f"unique:owned:{n}", literal=True)
        return row.thread

    @unique_task("receipt:{order_id}", keep_for=60)
    @task
    def send_receipt(order_id: int, fail: bool = False) -> int:
        if fail:
            raise RuntimeError("the mail server is down")
        return order_id

    @unique_task("owned:{n}", ttl=60, lease=5)
    @task
    async def aheld_by(n: int) -> str:
        (row,) = list_locks(_locks(), keyspace(), f"unique:owned:{n}", literal=True)
        return row.thread


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    running.clear()
    finish.clear()
    seen.clear()
    with override_settings(TASKS=BACKENDS):
        yield
    finish.set()


@pytest.fixture
def duplicates() -> Iterator[list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        sent.append({"sender": sender, **kwargs})

    task_duplicate.connect(receiver)
    yield sent
    task_duplicate.disconnect(receiver)


def test_runs_and_frees_the_key(r: redis.Redis) -> None:
    finish.set()
    result = import_feed.enqueue(feed_id=7)
    assert result.status == "SUCCESSFUL", result.errors
    assert result.return_value == str(result.id)
    # The run held the enqueuer's token, and let it go at the end.
    assert seen[0] is not None
    assert not _lease(r, "unique:import:7")
    assert KWARG in result.kwargs  # the claim travelled in the task's kwargs
    assert import_feed.enqueue(feed_id=7).status == "SUCCESSFUL"


def test_concurrent_duplicates_of_a_running_task_are_refused(
    r: redis.Redis, duplicates: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    first: list[Any] = []
    runner = threading.Thread(target=lambda: first.append(import_feed.enqueue(feed_id=8)))
    runner.start()
    assert running.wait(20)
    lease = _lease(r, "unique:import:8")
    token, task_id = lease[b"t"], lease[b"j"].decode()

    barrier = threading.Barrier(6)
    outcomes: list[Any] = []

    def duplicate() -> None:
        barrier.wait(10)
        try:
            outcomes.append(import_feed.enqueue(feed_id=8))
        except TaskNotUnique as exc:
            outcomes.append(exc)

    caplog.set_level(logging.INFO, logger="django_redislock.unique")
    threads = [threading.Thread(target=duplicate) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    # The immediate backend keeps no results: "existing" cannot fetch the
    # running task, so each duplicate gets TaskNotUnique with its id.
    assert len(outcomes) == 6
    assert all(isinstance(o, TaskNotUnique) and o.task_id == task_id for o in outcomes)
    assert len(duplicates) == 6
    assert {d["task_id"] for d in duplicates} == {task_id}
    assert {d["name"] for d in duplicates} == {"unique:import:8"}
    assert all(d["task"] is import_feed for d in duplicates)
    refusals = [rec for rec in caplog.records if rec.name == "django_redislock.unique"]
    assert len(refusals) == 6 and "refused a duplicate" in refusals[0].getMessage()
    assert {rec.levelname for rec in refusals} == {"INFO"}
    assert _lease(r, "unique:import:8")[b"t"] == token  # untouched by the refusals

    finish.set()
    runner.join(20)
    assert first[0].status == "SUCCESSFUL" and str(first[0].id) == task_id
    assert not _lease(r, "unique:import:8")


def test_existing_gives_the_queued_result(duplicates: list[dict[str, Any]]) -> None:
    queued = import_feed.using(backend="dummy")
    first = queued.enqueue(feed_id=9)
    assert first.status == "READY"
    again = queued.enqueue(feed_id=9)
    assert again.id == first.id
    assert len(duplicates) == 1 and duplicates[0]["on_duplicate"] == "existing"
    # Another key is another task.
    assert queued.enqueue(feed_id=10).id != first.id


def test_concurrent_enqueues_make_one_task(r: redis.Redis) -> None:
    queued = import_feed.using(backend="dummy")
    barrier = threading.Barrier(8)
    made: list[str] = []
    refused: list[TaskNotUnique] = []

    def enqueue() -> None:
        barrier.wait(10)
        try:
            made.append(str(queued.enqueue(feed_id=11).id))
        except TaskNotUnique as exc:
            # Task backends are per thread: this thread's dummy backend does
            # not have the result another thread queued, so "existing" cannot
            # fetch it and says which task holds the key instead.
            refused.append(exc)

    threads = [threading.Thread(target=enqueue) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(made) == 1 and len(refused) == 7
    assert {exc.task_id for exc in refused} == set(made)
    assert _lease(r, "unique:import:11")[b"j"].decode() == made[0]


def test_raise_on_duplicate() -> None:
    queued = build_report.using(backend="dummy")
    first = queued.enqueue(3)
    with pytest.raises(TaskNotUnique) as info:
        queued.enqueue(report_id=3)
    assert info.value.task_id == str(first.id)
    assert info.value.name == "unique:report:3"


def test_a_task_that_never_starts_frees_the_key_within_its_ttl(r: redis.Redis) -> None:
    queued = build_report.using(backend="dummy")  # ttl=1.0: the dummy never runs it
    first = queued.enqueue(4)
    taken = time.monotonic()
    lease = get_lock("unique:report:4").keys.lease
    # The bound is the server's: the lease expires by its TTL, which is the
    # task's ttl. Waiting for it to go (within a generous bound) shows nothing
    # renews it; how long that took depends on the host's load, not on us.
    assert 0 < r.pttl(lease) <= 1000
    deadline = taken + 10
    while r.exists(lease) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not r.exists(lease), "the key of a task that never started was never freed"
    assert queued.enqueue(4).id != first.id


def test_the_worker_run_adopts_and_releases(r: redis.Redis) -> None:
    queued = build_report.using(backend="dummy")
    result = queued.enqueue(5)
    claim = result.kwargs[KWARG]
    assert _lease(r, "unique:report:5")[b"t"].decode() == claim["t"]
    # What a worker does with the queued result: run it with its stored arguments.
    assert build_report.func(*result.args, **result.kwargs) == 5
    assert not _lease(r, "unique:report:5")


def test_another_token_cannot_release_the_key(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    queued = build_report.using(backend="dummy")
    result = queued.enqueue(6)
    claim = result.kwargs[KWARG]
    forged = {**claim, "t": "0123456789abcdef"}
    # A task carrying another token runs, but neither adopts nor frees the key.
    assert build_report.func(report_id=6, **{KWARG: forged}) == 6
    assert _lease(r, "unique:report:6")[b"t"].decode() == claim["t"]
    (warning,) = [rec for rec in caplog.records if rec.name == "django_redislock.unique"]
    assert warning.levelname == "WARNING" and "running without it" in warning.getMessage()
    # Nor does a malformed claim.
    assert build_report.func(report_id=6, **{KWARG: {"t": 1}}) == 6
    assert _lease(r, "unique:report:6")[b"t"].decode() == claim["t"]


def test_a_coroutine_task_holds_the_key_while_it_runs(r: redis.Redis) -> None:
    """docs/tasks.rst: "``async def`` tasks work: their run adopts the key with an
    AsyncLock"."""
    assert (
        "``async def`` tasks work: their run adopts the key with an "
        ":class:`~django_redislock.AsyncLock`" in _tasks_page()
    )
    result = render_page.enqueue(page_id=1)
    assert result.status == "SUCCESSFUL", result.errors
    token, noted, task_id = result.return_value
    assert token is not None and token == result.kwargs[KWARG]["t"]
    assert noted == task_id == str(result.id)  # the run wrote its id
    assert not _lease(r, "unique:page:1")


async def test_a_coroutine_run_with_another_token_leaves_the_key(r: redis.Redis) -> None:
    queued = render_page.using(backend="dummy")
    result = await queued.aenqueue(page_id=2)
    claim = result.kwargs[KWARG]
    forged = {**claim, "t": "0123456789abcdef"}

    class Context:
        task_result = result

    await render_page.func(Context(), page_id=2, **{KWARG: forged})
    assert _lease(r, "unique:page:2")[b"t"].decode() == claim["t"]
    await render_page.func(Context(), *result.args, **result.kwargs)
    assert not _lease(r, "unique:page:2")


def test_until_enqueue_frees_the_key_as_the_run_starts(r: redis.Redis) -> None:
    result = send_mail.enqueue(1)
    assert result.status == "SUCCESSFUL", result.errors
    assert result.return_value is True  # the run could take the key itself


def test_until_start_holds_during_the_run_and_frees_after_a_failure(r: redis.Redis) -> None:
    ok = sync_account.enqueue("acme")
    assert ok.return_value is True
    failed = sync_account.enqueue("acme", fail=True)
    assert failed.status == "FAILED"
    assert not _lease(r, "unique:sync:acme")
    assert sync_account.enqueue("acme").status == "SUCCESSFUL"


def test_switched_off_it_enqueues_every_time() -> None:
    queued = build_report.using(backend="dummy")
    with override_settings(REDISLOCK={"ENABLED": False}):
        assert queued.enqueue(7).id != queued.enqueue(7).id


def test_called_directly_it_just_runs() -> None:
    assert build_report.call(8) == 8


async def test_aenqueue_refuses_too() -> None:
    queued = build_report.using(backend="dummy")
    first = await queued.aenqueue(9)
    with pytest.raises(TaskNotUnique) as info:
        await queued.aenqueue(9)
    assert info.value.task_id == str(first.id)


def test_keep_for_keeps_the_key_after_a_success(r: redis.Redis) -> None:
    """docs/tasks.rst: ``keep_for`` keeps the key after a run that succeeded;
    one that failed lets it go."""
    first = send_receipt.enqueue(1)
    assert first.status == "SUCCESSFUL"
    assert 59_000 < r.pttl(get_lock("unique:receipt:1").keys.lease) <= 60_000
    # Refused: the immediate backend keeps no results to hand back, so the
    # refusal names the task.
    with pytest.raises(TaskNotUnique) as info:
        send_receipt.enqueue(1)
    assert info.value.task_id == str(first.id)
    assert send_receipt.enqueue(2, fail=True).status == "FAILED"
    assert not _lease(r, "unique:receipt:2")


def test_celery_times_read_a_naive_datetime_as_utc() -> None:
    """docs/tasks.rst: a naive ``expires`` (or ``eta``) is UTC, as Celery reads it."""
    import datetime

    from django_redislock.tasks.claims import seconds_until

    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=100)
    naive = later.replace(tzinfo=None)
    assert 99 < seconds_until(naive, naive_as_utc=True) <= 100
    assert 99 < seconds_until(naive.isoformat(), naive_as_utc=True) <= 100
    assert 99 < seconds_until(later.isoformat()) <= 100
    assert seconds_until("not a time") == 0.0


# -- arguments, checked at import ------------------------------------------------------------
def _plain(feed_id: int) -> None:
    pass


def test_a_bad_template_fails_when_decorating() -> None:
    plain = task(_plain)
    with pytest.raises(ValueError, match=r"unique_task\(\): lock key 'import:\{nope\}' uses"):
        unique_task("import:{nope}")(plain)
    with pytest.raises(ValueError, match="not a valid str.format template"):
        unique_task("import:{feed_id")(plain)
    with pytest.raises(ValueError, match="until must be one of"):
        unique_task("import:{feed_id}", until="done")(plain)
    with pytest.raises(ValueError, match="on_duplicate must be one of"):
        unique_task("import:{feed_id}", on_duplicate="drop")(plain)
    with pytest.raises(ValueError, match="ttl must be a finite number"):
        unique_task("import:{feed_id}", ttl=0)(plain)
    with pytest.raises(TypeError, match=r"goes above @task"):
        unique_task("import:{feed_id}")(_plain)


def test_keep_for_is_checked_when_decorating() -> None:
    plain = task(_plain)
    with pytest.raises(ValueError, match="keep_for must be a finite number of seconds"):
        unique_task("import:{feed_id}", keep_for=0)(plain)
    with pytest.raises(TypeError, match="keep_for must be a number of seconds"):
        unique_task("import:{feed_id}", keep_for="1d")(plain)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="until='enqueue' the run does not hold it"):
        unique_task("import:{feed_id}", until="enqueue", keep_for=60)(plain)


# -- claims of docs/tasks.rst -----------------------------------------------------------------
def _tasks_page() -> str:
    """docs/tasks.rst as one line: a sentence may wrap anywhere."""
    return " ".join(page("tasks").split())


def test_redis_down_fails_closed(redis_factory: Any) -> None:
    """docs/tasks.rst: "Redis unreachable at enqueue raises ``RedisUnavailable``"."""
    assert "Redis unreachable at enqueue raises ``RedisUnavailable``" in _tasks_page()
    server = redis_factory(port=free_port(), unix=False).start()
    url = server.url
    server.stop()
    caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url}}
    queued = build_report.using(backend="dummy")
    with override_settings(
        CACHES=caches, REDISLOCK={"CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2}
    ):
        rl_connection.reset()
        try:
            with pytest.raises(RedisUnavailable):
                queued.enqueue(1)
            assert queued.get_backend().results == []  # nothing was queued
        finally:
            rl_connection.reset()


def test_task_duplicate_carries_the_documented_arguments(
    duplicates: list[dict[str, Any]],
) -> None:
    """docs/operating.rst, Signals: ``task_duplicate``'s keyword arguments."""
    queued = import_feed.using(backend="dummy")
    queued.enqueue(feed_id=12)
    queued.enqueue(feed_id=12)
    (sent,) = duplicates
    assert sent["sender"] is type(import_feed)
    assert set(sent) - {"signal", "sender"} == _signal_arguments()["task_duplicate"]


def test_run_after_lengthens_the_pending_ttl(r: redis.Redis) -> None:
    """docs/tasks.rst: "A ``run_after`` (Celery: ``countdown`` or ``eta``) is added to it"."""
    assert "A ``run_after`` (Celery: ``countdown`` or ``eta``) is added to it" in _tasks_page()
    import datetime

    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=100)
    build_report.using(backend="dummy", run_after=later).enqueue(13)
    assert 100_000 < r.pttl(get_lock("unique:report:13").keys.lease) <= 101_000


def test_the_lock_name_and_the_claim_as_documented(r: redis.Redis) -> None:
    """docs/tasks.rst: the lock is named ``unique:<key>``; the claim travels in the
    ``_redislock_unique`` keyword argument."""
    text = _tasks_page()
    assert "named ``unique:`` followed by the key" in text
    assert "``_redislock_unique``" in text
    result = build_report.using(backend="dummy").enqueue(14)
    assert set(result.kwargs) == {"_redislock_unique"}
    assert result.kwargs["_redislock_unique"]["n"] == "unique:report:14"


def test_default_ttl_and_lease(r: redis.Redis) -> None:
    """docs/tasks.rst: ``ttl`` defaults to ``UNIQUE_TTL`` (an hour), ``lease`` to ``TIMEOUT``."""
    result = with_defaults.using(backend="dummy").enqueue(1)
    assert 3_599_000 < r.pttl(get_lock("unique:defaults:1").keys.lease) <= 3_600_000
    # The run adopts it with the running lease, TIMEOUT (30 s by default).
    assert 29_000 < with_defaults.func(*result.args, **result.kwargs) <= 30_000


def test_a_failed_enqueue_lets_the_key_go(r: redis.Redis, monkeypatch: Any) -> None:
    """docs/tasks.rst: "If the queueing fails, the key is let go at once"."""
    assert "If the queueing fails, the key is let go at once" in _tasks_page()
    queued = build_report.using(backend="dummy")
    backend_class = type(queued.get_backend())

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("the queue is down")

    monkeypatch.setattr(backend_class, "enqueue", refuse)
    with pytest.raises(ConnectionError):
        queued.enqueue(15)
    assert not _lease(r, "unique:report:15")


def test_a_duplicate_waits_a_bounded_time_for_the_id() -> None:
    """docs/tasks.rst: a duplicate "waits for it, up to a second, and is then refused
    with ``task_id`` None"."""
    assert "waits for it, up to a second, and is then refused with ``task_id`` None" in (
        _tasks_page()
    )
    # Held as an enqueuer holds it before it writes the id.
    holder = get_lock("unique:report:16", timeout=30, wait=0)
    assert holder.acquire()
    try:
        with pytest.raises(TaskNotUnique) as info:
            build_report.using(backend="dummy").enqueue(16)
        assert info.value.task_id is None
    finally:
        holder.release()


def test_a_key_callable_returning_several_names_is_refused_at_enqueue() -> None:
    from django_redislock.locking.naming import Namer
    from django_redislock.tasks.options import UniqueOptions

    def job(a: int) -> None:
        pass

    unique = object.__new__(UniqueOptions)
    object.__setattr__(unique, "namer", Namer(lambda a: [f"x:{a}", "y"], job))
    with pytest.raises(TypeError, match="several names .*return one str"):
        unique.lock_name((1,), {})


def test_the_run_that_adopts_the_key_is_listed_as_its_holder(r: redis.Redis) -> None:
    """docs/operating.rst: a unique task's key names its enqueuer, then its run."""
    result = held_by.using(backend="dummy").enqueue(1)
    (row,) = list_locks(r, keyspace(), "unique:owned:1", literal=True)
    assert row.thread == threading.current_thread().name  # the enqueuer
    seen: list[str] = []
    worker = threading.Thread(
        target=lambda: seen.append(held_by.func(*result.args, **result.kwargs)), name="worker-7"
    )
    worker.start()
    worker.join(20)
    assert seen == ["worker-7"]
    assert not _lease(r, "unique:owned:1")


async def test_a_coroutine_run_that_adopts_the_key_is_listed_as_its_holder(
    r: redis.Redis,
) -> None:
    result = await aheld_by.using(backend="dummy").aenqueue(2)
    run = asyncio.create_task(aheld_by.func(*result.args, **result.kwargs), name="worker-task-3")
    assert await asyncio.wait_for(run, 20) == "worker-task-3"
    assert not _lease(r, "unique:owned:2")
