"""A lost lease can be triaged: why it was lost, how long it was held, whose it was.

The log record of a loss had no hold time, TTL, owner, label or cause, and an
expiry looked like an operator's force-release or a Redis restart. Each cause
is made here for real on a private Redis (a lease run out, ``redislocks
clear`` and the admin page, a restart without persistence, a flush, a lease
deleted by hand, a state older than the lease), on both drivers, and the
record, the ``lock_lost`` signal, the hold histogram and the OpenTelemetry
span are read back.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
from io import StringIO
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.test import Client, override_settings
from prometheus_client import REGISTRY

from django_redislock import LockLost, get_lock
from django_redislock.core.drivers.semaphore import Semaphore
from django_redislock.core.engine.keys import KeySpace
from django_redislock.core.engine.loss import FORCED_KEEP_MS
from django_redislock.core.ops.force import clear
from django_redislock.core.ops.inspection import find
from django_redislock.signals import lock_lost
from tests.drive import Drive
from tests.servers import free_port
from tests.test_metrics import otel  # noqa: F401  (a fixture)

KS = KeySpace("redislock")
HOST = socket.gethostname()


pytestmark = pytest.mark.usefixtures("fresh_clients")


def lost_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "django_redislock.lost"]


async def lose(drive: Drive, lock: Any) -> None:
    """Release ``lock`` and expect it lost."""
    with pytest.raises(LockLost):
        await drive(lock.release())


# -- the three causes, on both drivers ------------------------------------------------------
async def test_a_lease_that_ran_out_is_expired(
    drive: Drive, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    lock = drive.Lock(drive.client, "exp:1", ttl=0.2, wait=0, keyspace=KS, label="nightly")
    lock.metric_name = "exp:{id}"
    assert await drive(lock.acquire())
    await drive.until(lambda: not r.exists(lock.keys.lease), timeout=10)
    with caplog.at_level(logging.WARNING, logger="django_redislock.lost"):
        await lose(drive, lock)
    loss = lock.loss
    assert loss is not None and loss.cause == "expired"
    assert loss.ttl_seconds == 0.2
    assert loss.held_seconds >= 0.2
    assert loss.forced_by is None
    (record,) = lost_records(caplog)
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith("lost 'exp:1' (fence ") and record.getMessage().endswith(
        "): the lease was gone at release: the lease ran out before it was renewed or released"
    )
    # Structured: a log processor or Sentry reads the fields, not the words.
    who = None if drive.is_async else "MainThread"
    fields = {k: getattr(record, k) for k in ("lock_name", "template", "kind", "cause", "label")}
    assert fields == {
        "lock_name": "exp:1",
        "template": "exp:{id}",
        "kind": "lock",
        "cause": "expired",
        "label": "nightly",
    }
    assert record.ttl_seconds == 0.2  # type: ignore[attr-defined]
    assert record.held_seconds == pytest.approx(loss.held_seconds, abs=1e-5)  # type: ignore[attr-defined]
    assert record.fence == lock.fence  # type: ignore[attr-defined]
    assert record.forced_by is None  # type: ignore[attr-defined]
    owner = record.owner  # type: ignore[attr-defined]
    assert owner.startswith(f"{HOST}:{os.getpid()}/")
    if who is not None:
        assert owner.endswith("/MainThread")


async def test_a_force_release_is_force_released_and_names_who(
    drive: Drive, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    lock = drive.Lock(drive.client, "forced:1", ttl=300, wait=0, keyspace=KS)
    assert await drive(lock.acquire())
    with caplog.at_level(logging.WARNING, logger="django_redislock"):
        done = clear(r, KS, names=["forced:1"])
        assert [row.name for row in done.released] == ["forced:1"]
        await lose(drive, lock)
    assert lock.loss is not None and lock.loss.cause == "force_released"
    assert lock.loss.forced_by == "an operator"
    (record,) = lost_records(caplog)
    assert "force-released by an operator" in record.getMessage()
    assert record.forced_by == "an operator"  # type: ignore[attr-defined]
    # The operator's side logged it too, with the same fields.
    (audit,) = [r for r in caplog.records if r.name == "django_redislock.inspect"]
    assert audit.lock_name == "forced:1"  # type: ignore[attr-defined]
    assert audit.cause == "force_released"  # type: ignore[attr-defined]
    assert audit.owner == record.owner  # type: ignore[attr-defined]


async def test_a_restart_without_persistence_is_redis_lost(
    drive: Drive, redis_factory: Any
) -> None:
    server = redis_factory(port=free_port(), unix=False).start()
    async with drive.connect(server.url, socket_timeout=5) as client:
        lock = drive.Lock(client, "restart:1", ttl=300, wait=0, keyspace=KS)
        assert await drive(lock.acquire())
        server.stop()
        server.start()  # the same port, empty: nothing was persisted
        await lose(drive, lock)
    assert lock.loss is not None and lock.loss.cause == "redis_lost"
    assert "no longer has the name's state" in lock.loss.reason


async def test_a_flush_is_redis_lost(drive: Drive, r: redis.Redis) -> None:
    lock = drive.Lock(drive.client, "flushed:1", ttl=300, wait=0, keyspace=KS)
    assert await drive(lock.acquire())
    r.flushall()
    await lose(drive, lock)
    assert lock.loss is not None and lock.loss.cause == "redis_lost"


async def test_a_lease_deleted_by_hand_is_redis_lost(drive: Drive, r: redis.Redis) -> None:
    lock = drive.Lock(drive.client, "deleted:1", ttl=300, wait=0, keyspace=KS)
    assert await drive(lock.acquire())
    r.delete(lock.keys.lease)  # the state stays: only the lease vanished
    await lose(drive, lock)
    assert lock.loss is not None and lock.loss.cause == "redis_lost"
    assert "vanished before it could have run out" in lock.loss.reason


async def test_a_state_older_than_the_lease_is_redis_lost(drive: Drive, r: redis.Redis) -> None:
    """Redis back from an old snapshot (or a lagging replica): the state it
    has remembers a fence older than the lease's."""
    lock = drive.Lock(drive.client, "older:1", ttl=300, wait=0, keyspace=KS)
    assert await drive(lock.acquire())
    assert lock.fence is not None
    r.delete(lock.keys.lease)
    r.hset(lock.keys.state, "f", str(lock.fence - 1000))
    await lose(drive, lock)
    assert lock.loss is not None and lock.loss.cause == "redis_lost"
    assert "older state" in lock.loss.reason


async def test_renewal_finds_a_force_release(drive: Drive, r: redis.Redis) -> None:
    found = drive.event()
    lock = drive.Lock(
        drive.client,
        "renewed:1",
        ttl=0.6,
        wait=0,
        keyspace=KS,
        renew=True,
        on_lost=lambda handle: found.set(),
    )
    assert await drive(lock.acquire())
    clear(r, KS, names=["renewed:1"])
    await found.wait()
    assert lock.loss is not None and lock.loss.cause == "force_released"
    assert "gone at renewal" in lock.loss.reason


async def test_an_extend_finds_out_too(drive: Drive, r: redis.Redis) -> None:
    lock = drive.Lock(drive.client, "extended:1", ttl=300, wait=0, keyspace=KS)
    assert await drive(lock.acquire())
    clear(r, KS, names=["extended:1"])
    with pytest.raises(LockLost):
        await drive(lock.extend(60))
    assert lock.loss is not None and lock.loss.cause == "force_released"
    assert "gone at extend" in lock.loss.reason


async def test_a_force_released_permit(drive: Drive, r: redis.Redis) -> None:
    sem = drive.Semaphore(drive.client, "permits:1", 2, ttl=300, wait=0, keyspace=KS)
    assert await drive(sem.acquire())
    clear(r, KS, names=["permits:1"])
    await lose(drive, sem)
    assert sem.loss is not None and sem.loss.cause == "force_released"


# -- the mark a force-release leaves ------------------------------------------------------------
def test_the_mark_is_kept_beyond_the_lease_and_only_for_what_was_released(
    r: redis.Redis,
) -> None:
    held = get_lock("marked:1", timeout=300, wait=0)
    assert held.acquire()
    (row,), _ = find(r, KS, ["marked:1"])
    held.release()  # gone before the operator's release: nothing to mark
    from django_redislock.core.ops.force import release

    assert release(r, KS, [row], by="ops").released == []
    assert not r.exists(KS.forced("marked:1"))
    held = get_lock("marked:1", timeout=300, wait=0)
    assert held.acquire()
    (row,), _ = find(r, KS, ["marked:1"])
    assert release(r, KS, [row], by="ops").released
    mark = json.loads(r.hget(KS.forced("marked:1"), held.token or "") or b"{}")
    assert mark["by"] == "ops" and isinstance(mark["at"], float)
    # An hour beyond what the lease had left.
    assert FORCED_KEEP_MS < r.pttl(KS.forced("marked:1")) <= FORCED_KEEP_MS + 300_000
    # Not a key the listing shows, nor one a clear --all touches.
    assert find(r, KS, ["marked:1"]) == ([], ["marked:1"])


# -- the Django side: command, admin, signal, metrics, span ---------------------------------------
def test_the_command_names_the_operator_on_both_sides(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    lock = get_lock("cmd:1", timeout=300, wait=0, label="import", metric_name="cmd")
    assert lock.acquire()
    with caplog.at_level(logging.WARNING, logger="django_redislock"):
        call_command("redislocks", "clear", "cmd:1", "--no-input", stdout=StringIO())
        with pytest.raises(LockLost):
            lock.release()
    by = lock.loss.forced_by if lock.loss is not None else ""
    assert re.fullmatch(
        rf"manage\.py redislocks clear by .+@{re.escape(HOST)} \(pid {os.getpid()}\)", by or ""
    )
    (audit,) = [r for r in caplog.records if r.name == "django_redislock.inspect"]
    assert audit.forced_by == by  # type: ignore[attr-defined]
    assert audit.template == "cmd" and audit.label == "import"  # type: ignore[attr-defined]
    (holder,) = lost_records(caplog)
    assert holder.forced_by == by and f"force-released by {by}" in holder.getMessage()  # type: ignore[attr-defined]


@pytest.mark.django_db
def test_the_admin_names_the_user_on_both_sides(
    r: redis.Redis, django_user_model: Any, caplog: pytest.LogCaptureFixture
) -> None:
    account = django_user_model.objects.create_user("alice", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(account)
    lock = get_lock("adm:1", timeout=300, wait=0)
    assert lock.acquire()
    page = client.get("/admin/django_redislock/locks/").content.decode()
    value = re.search(r'name="selected" value="([^"]+)"', page)
    assert value
    with caplog.at_level(logging.WARNING, logger="django_redislock"):
        client.post(
            "/admin/django_redislock/locks/", {"selected": value.group(1), "confirm": "yes"}
        )
        with pytest.raises(LockLost):
            lock.release()
    who = f"admin user 'alice' (id {account.pk})"
    assert lock.loss is not None and lock.loss.forced_by == who
    admin = [r for r in caplog.records if r.name == "django_redislock.admin"]
    assert [r.forced_by for r in admin] == [who]  # type: ignore[attr-defined]
    assert admin[0].lock_name == "adm:1"  # type: ignore[attr-defined]


def test_the_signal_carries_the_same(r: redis.Redis) -> None:
    heard: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        heard.append(kwargs)

    lock_lost.connect(receiver)
    try:
        lock = get_lock("sig:1", timeout=300, wait=0, label="lbl", metric_name="sig")
        assert lock.acquire()
        clear(r, KS, names=["sig:1"])
        with pytest.raises(LockLost):
            lock.release()
    finally:
        lock_lost.disconnect(receiver)
    (kwargs,) = heard
    assert kwargs["cause"] == "force_released"
    assert kwargs["forced_by"] == "an operator"
    assert kwargs["ttl"] == 300
    assert kwargs["held"] >= 0
    assert kwargs["label"] == "lbl" and kwargs["template"] == "sig"
    assert kwargs["owner"] == f"{HOST}:{os.getpid()}/MainThread"
    assert kwargs["name"] == "sig:1" and kwargs["fence"] == lock.fence
    assert "force-released by an operator" in kwargs["reason"]


def sample(metric: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(metric, labels) or 0.0


def test_lost_holds_are_timed_with_their_outcome(r: redis.Redis) -> None:
    with override_settings(REDISLOCK={"METRICS": ["prometheus"]}):
        labels = {"name": "timed", "kind": "lock"}
        lost = sample("redislock_hold_seconds_count", **labels, outcome="lost")
        released = sample("redislock_hold_seconds_count", **labels, outcome="released")
        forced = sample("redislock_losses_total", **labels, cause="force_released")
        lock = get_lock("timed:1", timeout=300, wait=0, metric_name="timed")
        assert lock.acquire()
        clear(r, KS, names=["timed:1"])
        with pytest.raises(LockLost):
            lock.release()
        assert sample("redislock_hold_seconds_count", **labels, outcome="lost") == lost + 1
        assert sample("redislock_hold_seconds_count", **labels, outcome="released") == released
        assert sample("redislock_losses_total", **labels, cause="force_released") == forced + 1


def test_the_hold_span_keeps_held_and_carries_the_cause(otel: Any, r: redis.Redis) -> None:  # noqa: F811
    lock = get_lock("span:1", timeout=300, wait=0, metric_name="span", label="lbl")
    assert lock.acquire()
    clear(r, KS, names=["span:1"])
    with pytest.raises(LockLost):
        lock.release()
    (hold,) = [s for s in otel.get_finished_spans() if s.name == "hold span"]
    attributes = dict(hold.attributes or {})
    assert attributes["redislock.cause"] == "force_released"
    assert attributes["redislock.forced_by"] == "an operator"
    assert attributes["redislock.held_seconds"] >= 0
    assert attributes["redislock.ttl_seconds"] == 300
    assert attributes["redislock.label"] == "lbl"
    assert attributes["redislock.owner"] == f"{HOST}:{os.getpid()}/MainThread"
    assert "redislock.lock_name" not in attributes  # off by default


def test_spans_carry_the_lock_name_when_asked(otel: Any) -> None:  # noqa: F811
    with override_settings(REDISLOCK={"METRICS": ["opentelemetry"], "OTEL_LOCK_NAMES": True}):
        lock = get_lock("named:7", timeout=30, wait=0, metric_name="named")
        assert lock.acquire()
        lock.release()
    spans = {s.name: s for s in otel.get_finished_spans()}
    for name in ("acquire named", "hold named"):
        assert (spans[name].attributes or {})["redislock.lock_name"] == "named:7"


def test_every_record_about_a_lock_carries_its_fields(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Acquire, busy and release (DEBUG) and the rest: lock_name, template, kind."""
    with caplog.at_level(logging.DEBUG, logger="django_redislock"):
        lock = get_lock("fields:1", timeout=30, wait=0, metric_name="fields")
        assert lock.acquire()
        other = get_lock("fields:1", timeout=30, wait=0, metric_name="fields")
        assert not other.acquire()
        lock.release()
        sem = Semaphore(r, "fields-sem", 1, ttl=30, wait=0, keyspace=KS)
        assert sem.acquire()
        sem.release()
    about = [
        rec
        for rec in caplog.records
        if rec.name.startswith("django_redislock.") and "fields" in rec.getMessage()
    ]
    assert {rec.getMessage().split()[0] for rec in about} >= {"acquired", "busy", "released"}
    for rec in about:
        assert rec.lock_name in ("fields:1", "fields-sem")  # type: ignore[attr-defined]
        assert rec.kind in ("lock", "semaphore")  # type: ignore[attr-defined]
        assert hasattr(rec, "template") and hasattr(rec, "owner")
    assert {rec.kind for rec in about} == {"lock", "semaphore"}  # type: ignore[attr-defined]


def test_a_loss_found_while_another_thread_holds_the_handle_names_the_holder(
    r: redis.Redis,
) -> None:
    """The owner is the thread that took the lease, not the one that found the loss."""
    taken = threading.Event()
    lock = get_lock("who:1", timeout=300, wait=0)

    def take() -> None:
        assert lock.acquire()
        taken.set()

    worker = threading.Thread(target=take, name="export-worker")
    worker.start()
    worker.join(10)
    assert taken.is_set()
    assert lock.log_fields()["owner"] == f"{HOST}:{os.getpid()}/export-worker"


# -- Sentry: lost leases as events, when told ------------------------------------------------------
_SENTRY_CHILD = r"""
import json, logging, sys
import django
django.setup()
import sentry_sdk
from sentry_sdk.integrations.logging import LoggingIntegration
from django_redislock import LockLost, get_lock
from django_redislock.core.engine.keys import KeySpace
from django_redislock.core.ops.force import clear
from django_redislock.connection import get_client

events = []

def keep(event, hint):
    events.append(event)
    return None  # kept here, never sent

integrations = [] if sys.argv[1] == "default" else [
    LoggingIntegration(level=logging.INFO, event_level=logging.WARNING)
]
sentry_sdk.init(dsn="https://key@sentry.invalid/1", before_send=keep, integrations=integrations)
lock = get_lock("sentry:1", timeout=300, wait=0)
assert lock.acquire()
clear(get_client(), KeySpace("redislock"), names=["sentry:1"])
try:
    lock.release()
except LockLost:
    pass
print(json.dumps([
    {"logger": e.get("logger"), "level": e.get("level"), "extra": e.get("extra", {})}
    for e in events
]))
"""


@pytest.mark.parametrize("event_level", ["default", "warning"])
def test_sentry_makes_events_of_lost_leases_when_told(event_level: str) -> None:
    """docs/operating.rst, Sentry: lost leases are WARNING records, breadcrumbs
    by default; ``event_level=logging.WARNING`` makes each an event, with the
    record's structured fields."""
    pytest.importorskip("sentry_sdk")
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run(
        [sys.executable, "-c", _SENTRY_CHILD, event_level],
        cwd=Path(__file__).resolve().parent.parent,
        env=dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    events = json.loads(done.stdout.strip().splitlines()[-1])
    lost = [e for e in events if e["logger"] == "django_redislock.lost"]
    if event_level == "default":
        assert lost == []
        return
    (event,) = lost
    assert event["level"] == "warning"
    assert event["extra"]["cause"] == "force_released"
    assert event["extra"]["lock_name"] == "sentry:1"
