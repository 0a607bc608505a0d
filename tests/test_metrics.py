"""Metrics of lock contention (``REDISLOCK["METRICS"]``): Prometheus and OpenTelemetry.

Real Redis, the Django test clients on the test app's locked views and
throttled URLs; the Prometheus numbers are read from prometheus_client's
registry, the OpenTelemetry ones from the SDK's in-memory exporter and reader.
Counters only grow, so every test compares before and after.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import AsyncClient, Client, RequestFactory, override_settings
from opentelemetry import metrics as otel_metrics
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import REGISTRY

from django_redislock import LockLost, connection, redis_lock, redis_locked, signals
from django_redislock.checks import check_settings
from django_redislock.core.ops.inspection import find
from django_redislock.locking.factories import get_lock, get_semaphore, keyspace
from django_redislock.middleware import concurrency_limited
from django_redislock.ops import metrics as rl_metrics
from tests.helpers import flowing, run_python
from tests.servers import free_port
from tests.test_decorators import close_async_clients

ROOT = Path(__file__).resolve().parents[1]
MW = "django_redislock.middleware.ConcurrencyLimitMiddleware"
PROM = {"METRICS": ["prometheus"]}
OTEL = {"METRICS": ["opentelemetry"]}


# -- reading the numbers ----------------------------------------------------------------
def sample(metric: str, **labels: str) -> float:
    """A sample of the default registry (0 when the series does not exist yet)."""
    return REGISTRY.get_sample_value(metric, labels) or 0.0


def outcome(name: str, kind: str, what: str) -> float:
    return sample("redislock_outcomes_total", name=name, kind=kind, outcome=what)


def waits(name: str, kind: str, what: str) -> float:
    return sample("redislock_wait_seconds_count", name=name, kind=kind, outcome=what)


def holds(name: str, kind: str, what: str = "released") -> float:
    return sample("redislock_hold_seconds_count", name=name, kind=kind, outcome=what)


def snapshot() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every redislock sample of the default registry."""
    found = {}
    for family in REGISTRY.collect():
        for s in family.samples:
            # Not the creation times prometheus_client adds: they are no counts.
            if s.name.startswith("redislock_") and not s.name.endswith("_created"):
                found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def names_in(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> set[str]:
    return {dict(labels)["name"] for _, labels in samples if "name" in dict(labels)}


def delta(before: dict[Any, float], after: dict[Any, float]) -> dict[Any, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


# -- fixtures ---------------------------------------------------------------------------
@pytest.fixture
def prometheus() -> Iterator[None]:
    with override_settings(REDISLOCK=PROM):
        assert rl_metrics.installed() == ["prometheus"]
        yield
    assert rl_metrics.installed() == []


@pytest.fixture(params=["client", "async_client"])
def get(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """GET through the WSGI test client or, run to completion, the ASGI one."""
    if request.param == "client":
        client = Client(raise_request_exception=False)
        return lambda url, **extra: client.get(url, **extra)

    async def aget(url: str, **extra: Any) -> Any:
        try:
            return await AsyncClient(raise_request_exception=False).get(url, **extra)
        finally:
            await close_async_clients()

    return lambda url, **extra: async_to_sync(aget)(url, **extra)


@pytest.fixture
def held() -> Iterator[Callable[..., Any]]:
    """Hold named locks from the test (counted as "other": no metric name)."""
    taken: list[Any] = []

    def hold(name: str) -> Any:
        lock = get_lock(name, timeout=30, wait=0)
        assert lock.acquire()
        taken.append(lock)
        return lock

    yield hold
    for lock in taken:
        if lock.token is not None:
            lock.release()


@pytest.fixture
def dead_redis(redis_factory: Any) -> Iterator[dict[str, Any]]:
    """CACHES pointed at a private Redis that has been stopped."""
    server = redis_factory(port=free_port(), unix=False).start()
    url = server.url
    server.stop()
    with override_settings(
        CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url}}
    ):
        connection.reset()
        try:
            yield {"CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2}
        finally:
            connection.reset()


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return bool(predicate())


# -- off by default: nothing imported, nothing connected ------------------------------------
# redis-py 8 imports OpenTelemetry by itself when the SDK is installed: count
# what is imported after it.
_CHILD = r"""
import json, sys
import redis
baseline = set(sys.modules)
import tests.settings as s
s.REDISLOCK = json.loads(sys.argv[1])
import django
django.setup()
from django.test import Client, override_settings
from django.test.utils import setup_test_environment
setup_test_environment()
from django_redislock import signals
with override_settings(ROOT_URLCONF="tests.urls_locked", REDISLOCK=s.REDISLOCK):
    status = Client().get("/item/child/").status_code
print(json.dumps({
    "status": status,
    "modules": sorted(
        m for m in set(sys.modules) - baseline
        if m.split(".")[0] in ("prometheus_client", "opentelemetry")
        or m.startswith("django_redislock.contrib")
    ),
    "receivers": {
        name: len(getattr(signals, name).receivers)
        for name in ("lock_acquired", "lock_busy", "lock_released", "lock_lost",
                     "redis_unavailable", "request_throttled")
    },
    "sinks": [type(sink).__module__ for sink in signals._sinks],
}))
"""


def run_child(redislock: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings")
    out = run_python("-c", _CHILD, json.dumps(redislock), env=env, timeout=60)
    return json.loads(out.strip().splitlines()[-1])


def test_disabled_metrics_import_nothing_and_connect_no_receiver() -> None:
    off = run_child({})
    assert off["status"] == 200
    assert off["modules"] == []
    assert set(off["receivers"].values()) == {0}
    assert off["sinks"] == []
    # The same child with metrics on: the check above can fail.
    on = run_child({"METRICS": ["prometheus", "opentelemetry"]})
    assert on["status"] == 200
    assert "prometheus_client" in on["modules"]
    assert "django_redislock.contrib.prometheus" in on["modules"]
    assert "django_redislock.contrib.opentelemetry" in on["modules"]
    assert sorted(on["sinks"]) == [
        "django_redislock.contrib.opentelemetry",
        "django_redislock.contrib.prometheus",
    ]
    # Backends hear the events directly: Django's signals stay as they were.
    assert set(on["receivers"].values()) == {0}


def test_override_settings_turns_backends_on_and_off() -> None:
    assert rl_metrics.installed() == []
    with override_settings(REDISLOCK={"METRICS": ["prometheus", "opentelemetry"]}):
        assert rl_metrics.installed() == ["opentelemetry", "prometheus"]
        assert len(signals._sinks) == 2
        with override_settings(REDISLOCK=OTEL):
            assert rl_metrics.installed() == ["opentelemetry"]
    assert rl_metrics.installed() == []
    assert signals._sinks == ()


def test_a_failing_sink_never_breaks_the_lock(
    prometheus: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from django_redislock.contrib import prometheus as rl_prometheus

    def boom(*args: Any) -> None:
        raise RuntimeError("metric failed")

    monkeypatch.setattr(rl_prometheus.sink, "acquired", boom)
    with (
        caplog.at_level(logging.ERROR, logger="django_redislock.signals"),
        redis_lock("sturdy", metric_name="sturdy") as lock,
    ):
        assert lock is not None and lock.held
    assert "metrics sink" in caplog.text
    assert "metric failed" in caplog.text


# -- system checks ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("prometheus", "must be a list"),
        ([1], "must be a list"),
        (["statsd"], "unknown backend 'statsd'"),
        (["prometheus", "Prometheus"], "unknown backend 'Prometheus'"),
    ],
)
def test_bad_metrics_setting_is_e040(value: Any, needle: str) -> None:
    with override_settings(REDISLOCK={"METRICS": value}):
        messages = [m for m in check_settings() if m.id.startswith("django_redislock.E04")]
        assert [m.id for m in messages] == ["django_redislock.E040"]
        assert needle in messages[0].msg
        assert "'prometheus', 'opentelemetry'" in messages[0].hint
        with pytest.raises(SystemCheckError, match="E040"):
            call_command("check", "django_redislock")


@pytest.mark.parametrize(
    ("backend", "package", "distribution", "blocked"),
    [
        ("prometheus", "prometheus_client", "prometheus-client", ["prometheus_client"]),
        (
            "opentelemetry",
            "opentelemetry",
            "opentelemetry-api",
            ["opentelemetry", "opentelemetry.trace"],
        ),
    ],
)
def test_missing_package_is_e041_and_never_breaks_the_site(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    backend: str,
    package: str,
    distribution: str,
    blocked: list[str],
) -> None:
    # What a package that is not installed does: find_spec() finds nothing,
    # an import raises ImportError.
    for name in blocked:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, f"django_redislock.contrib.{backend}", raising=False)
    with (
        caplog.at_level(logging.ERROR, logger="django_redislock.metrics"),
        override_settings(REDISLOCK={"METRICS": [backend]}),
    ):
        messages = [m for m in check_settings() if m.id == "django_redislock.E041"]
        assert rl_metrics.installed() == []
        lock = get_lock("still-works", wait=0)
        assert lock.acquire()
        lock.release()
    assert len(messages) == 1
    assert f"{package} is not installed" in messages[0].msg
    # The hint names what to install wherever django-redislock came from (it is
    # on no index, so `pip install "django-redislock[extra]"` would find nothing).
    assert f"python -m pip install {distribution} (the {backend!r} extra" in messages[0].hint
    assert "django-redislock[" not in messages[0].hint
    assert f"python -m pip install {distribution}" in caplog.text


def test_clean_metrics_settings_pass_the_checks() -> None:
    for value in ([], ["prometheus"], ["opentelemetry"], ("prometheus", "opentelemetry")):
        with override_settings(REDISLOCK={"METRICS": value}):
            assert check_settings() == []


# -- Prometheus: locked views ---------------------------------------------------------------
T = "item:{name}"


@pytest.mark.urls("tests.urls_locked")
@pytest.mark.parametrize("view", ["item", "aitem"])
def test_locked_view_counts_acquire_wait_and_hold_under_its_template(
    prometheus: None, get: Callable[..., Any], held: Any, view: str
) -> None:
    before = snapshot()
    assert get(f"/{view}/apple/").status_code == 200
    assert get(f"/{view}/pear/").status_code == 200
    held("item:apple")
    assert get(f"/{view}/apple/").status_code == 409
    changed = delta(before, snapshot())
    expected = {
        ("redislock_outcomes_total", (("kind", "lock"), ("name", T), ("outcome", "acquired"))): 2,
        ("redislock_outcomes_total", (("kind", "lock"), ("name", T), ("outcome", "busy"))): 1,
        (
            "redislock_wait_seconds_count",
            (("kind", "lock"), ("name", T), ("outcome", "acquired")),
        ): 2,
        ("redislock_wait_seconds_count", (("kind", "lock"), ("name", T), ("outcome", "busy"))): 1,
        (
            "redislock_hold_seconds_count",
            (("kind", "lock"), ("name", T), ("outcome", "released")),
        ): 2,
    }
    for key, value in expected.items():
        assert changed.get(key) == value, (key, changed)
    # The test's own lock has no metric name.
    other = ("kind", "lock"), ("name", "other"), ("outcome", "acquired")
    assert changed[("redislock_outcomes_total", other)] == 1
    # The filled-in names never become labels.
    assert not {"item:apple", "item:pear"} & names_in(snapshot())


@pytest.mark.urls("tests.urls_locked")
@pytest.mark.parametrize("view", ["item", "aitem"])
def test_redis_down_counts_unavailable_and_fail_open(
    get: Callable[..., Any], dead_redis: dict[str, Any], view: str
) -> None:
    with override_settings(REDISLOCK={**PROM, **dead_redis}):
        closed = outcome(T, "lock", "unavailable")
        opened = outcome(T, "lock", "fail_open")
        assert get(f"/{view}/apple/").status_code == 503
        assert get(f"/{view}-fail-open/apple/").status_code == 200
        assert outcome(T, "lock", "unavailable") == closed + 1
        assert outcome(T, "lock", "fail_open") == opened + 1


def test_lost_lease_is_counted(prometheus: None, r: redis.Redis) -> None:
    before = outcome("nightly", "lock", "lost")
    hold_count = holds("nightly", "lock")
    lock = get_lock("nightly:2026-11-23", metric_name="nightly", timeout=30, wait=0)
    assert lock.acquire()
    r.delete(lock.keys.lease)  # taken away (an operator's force-release)
    with pytest.raises(LockLost):
        lock.release()
    assert outcome("nightly", "lock", "lost") == before + 1
    assert holds("nightly", "lock") == hold_count  # never released


def test_locks_made_in_code_count_as_other_unless_named(prometheus: None) -> None:
    other = outcome("other", "lock", "acquired")
    named = outcome("report", "lock", "acquired")
    with redis_lock("report:7"):
        pass
    with redis_lock("report:8", metric_name="report"):
        pass
    lock = get_lock("report:9", metric_name="report")
    with lock:
        pass

    @redis_locked("invoice:{number}")
    def bill(number: int) -> int:
        return number

    def by_callable(number: int) -> str:
        return f"x:{number}"

    @redis_locked(by_callable)
    def ship(number: int) -> int:
        return number

    before = snapshot()
    bill(1)
    ship(1)
    after = delta(before, snapshot())
    assert outcome("other", "lock", "acquired") >= other + 1
    assert outcome("report", "lock", "acquired") == named + 2
    labels = names_in(after)
    # A template names itself; a callable key, the function it locks.
    assert labels == {
        "invoice:{number}",
        f"{__name__}.test_locks_made_in_code_count_as_other_unless_named.<locals>.ship",
    }


def test_metric_name_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="metric_name must be a non-empty str"):
        redis_lock("x", metric_name="")
    with pytest.raises(TypeError, match="metric_name must be a non-empty str"):
        redis_lock("x", metric_name=3)  # type: ignore[arg-type]


def test_cardinality_stays_bounded_across_many_names(
    prometheus: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    @redis_locked("order:{number}", wait=0)
    def process(number: int) -> None:
        pass

    for number in range(300):
        process(number)
    assert names_in(snapshot()) & {f"order:{n}" for n in range(300)} == set()
    # A metric name built from per-call data is cut off at the process's bound.
    monkeypatch.setattr(rl_metrics, "names", rl_metrics._Names(limit=5))
    other = outcome("other", "lock", "acquired")
    with caplog.at_level(logging.WARNING, logger="django_redislock.metrics"):
        for number in range(50):
            with redis_lock(f"user:{number}", metric_name=f"user:{number}"):
                pass
    users = {name for name in names_in(snapshot()) if name.startswith("user:")}
    assert users == {f"user:{n}" for n in range(5)}
    assert outcome("other", "lock", "acquired") == other + 45
    assert caplog.text.count("distinct lock metric names") == 1
    assert "'user:5'" in caplog.text


# -- Prometheus: throttled URLs ----------------------------------------------------------------
@pytest.fixture
def throttled(settings: Any) -> Iterator[Any]:
    mw = list(settings.MIDDLEWARE)
    mw.insert(mw.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1, MW)
    settings.MIDDLEWARE = mw
    settings.ROOT_URLCONF = "tests.urls_throttle"
    settings.REDISLOCK = {
        **PROM,
        "THROTTLE": [
            {"name": "reports", "path": r"^/reports/", "limit": 2, "wait": 0},
            {"name": "per-ip", "url_name": "ok", "limit": 1, "per": "ip", "wait": 0},
        ],
    }
    connection.reset()
    yield settings
    connection.reset()


def test_throttled_requests_count_under_the_rule_name(
    throttled: Any, get: Callable[..., Any]
) -> None:
    before = snapshot()
    assert get("/reports/slow/").status_code == 200
    assert get("/ok/").status_code == 200
    # Both permits of "reports" taken from elsewhere: the next request is refused.
    outside = [get_semaphore("throttle:reports", 2, wait=0) for _ in range(2)]
    assert all(sem.acquire() for sem in outside)
    try:
        assert get("/reports/slow/").status_code == 503
    finally:
        for sem in outside:
            sem.release()
    changed = delta(before, snapshot())
    sem = ("kind", "semaphore")
    assert changed[("redislock_outcomes_total", (sem, ("name", "reports"), ("outcome", "busy")))]
    released = ("outcome", "released")
    assert changed[("redislock_hold_seconds_count", (sem, ("name", "reports"), released))] == 1
    assert changed[("redislock_outcomes_total", (sem, ("name", "per-ip"), ("outcome", "acquired")))]
    acquired = ("redislock_outcomes_total", (sem, ("name", "reports"), ("outcome", "acquired")))
    assert changed[acquired] == 1
    # The client's address never becomes a label.
    counts = {k: v for k, v in changed.items() if not k[0].startswith("redislock_permits")}
    assert names_in(counts) <= {"reports", "per-ip", "other"}


def test_throttle_redis_down_counts_fail_open(
    throttled: Any, get: Callable[..., Any], dead_redis: dict[str, Any]
) -> None:
    throttled.REDISLOCK = {**throttled.REDISLOCK, **dead_redis}
    before = outcome("per-ip", "semaphore", "fail_open")
    assert get("/ok/").status_code == 200  # THROTTLE_FAIL_OPEN is True by default
    assert outcome("per-ip", "semaphore", "fail_open") == before + 1


def scrape() -> str:
    from django_redislock.contrib.prometheus import metrics_view

    response = metrics_view(RequestFactory().get("/metrics"))
    assert response["Content-Type"].startswith("text/plain")
    return response.content.decode()


@concurrency_limited("metrics-deco", 3)
def limited_view(request: Any) -> Any:  # a rule known by decoration, not by settings
    raise AssertionError("not called")


def test_gauges_read_permits_and_queue_from_redis_at_scrape_time(throttled: Any) -> None:
    text = scrape()
    assert 'redislock_permits_in_use{name="reports"} 0.0' in text
    assert 'redislock_permits_limit{name="reports"} 2.0' in text
    assert 'redislock_queue_length{name="reports"} 0.0' in text
    assert 'redislock_permits_limit{name="metrics-deco"} 3.0' in text
    assert re.search(r'^redislock_(permits|queue)_\w+\{name="per-ip"\}', text, re.M) is None
    holders = [get_semaphore("throttle:reports", 2, wait=0) for _ in range(2)]
    assert all(sem.acquire() for sem in holders)
    # A third request waits in the queue.
    waiter = get_semaphore("throttle:reports", 2, wait=10)
    got: list[bool] = []

    def wait_for_permit() -> None:
        got.append(waiter.acquire())
        if got[-1]:
            waiter.release()

    thread = threading.Thread(target=wait_for_permit)
    thread.start()
    try:
        assert wait_until(
            lambda: (
                find(connection.get_client(), keyspace(), ["throttle:reports"])[0][0].waiters == 1
            )
        )
        text = scrape()
        assert 'redislock_permits_in_use{name="reports"} 2.0' in text
        assert 'redislock_queue_length{name="reports"} 1.0' in text
    finally:
        holders[0].release()
        thread.join(10)
        holders[1].release()
    assert got == [True]
    assert 'redislock_permits_in_use{name="reports"} 0.0' in scrape()


def test_gauges_leave_a_scrape_when_redis_is_down(
    throttled: Any, dead_redis: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    throttled.REDISLOCK = {**throttled.REDISLOCK, **dead_redis}
    with caplog.at_level(logging.WARNING, logger="django_redislock.metrics"):
        text = scrape()
    assert "redislock_permits_in_use{" not in text
    assert "could not read the throttling semaphores" in caplog.text


_MULTIPROCESS_CHILD = r"""
import sys
import tests.settings as s
s.REDISLOCK = {"METRICS": ["prometheus"]}
import django
django.setup()
from django_redislock import redis_locked
if sys.argv[1] == "lock":
    @redis_locked("job:{n}")
    def job(n):
        return n
    for n in range(3):
        job(n)
else:
    from prometheus_client import generate_latest
    from django_redislock.contrib.prometheus import registry
    print(generate_latest(registry()).decode())
"""


def test_multiprocess_mode_sums_every_process(tmp_path: Path) -> None:
    """docs/metrics.rst: with PROMETHEUS_MULTIPROC_DIR, one scrape sums every process."""
    env = dict(
        os.environ, DJANGO_SETTINGS_MODULE="tests.settings", PROMETHEUS_MULTIPROC_DIR=str(tmp_path)
    )

    def child(mode: str) -> str:
        return run_python("-c", _MULTIPROCESS_CHILD, mode, env=env, timeout=60)

    child("lock")
    child("lock")
    text = child("scrape")
    assert 'redislock_outcomes_total{kind="lock",name="job:{n}",outcome="acquired"} 6.0' in text, (
        text
    )
    assert 'redislock_hold_seconds_count{kind="lock",name="job:{n}",outcome="released"} 6.0' in text


# -- OpenTelemetry ------------------------------------------------------------------------------
_exporter = InMemorySpanExporter()
_reader = InMemoryMetricReader()
_providers_set = False


@pytest.fixture
def otel() -> Iterator[InMemorySpanExporter]:
    global _providers_set
    if not _providers_set:
        # Global, once per process: the library's proxies bind to these.
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)
        otel_metrics.set_meter_provider(MeterProvider(metric_readers=[_reader]))
        _providers_set = True
    _exporter.clear()
    with override_settings(REDISLOCK=OTEL):
        yield _exporter
    _exporter.clear()


def spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return list(exporter.get_finished_spans())


def otel_points(metric: str) -> dict[tuple[tuple[str, Any], ...], Any]:
    """The data points of one OTel metric, by attributes (cumulative)."""
    found: dict[tuple[tuple[str, Any], ...], Any] = {}
    data = _reader.get_metrics_data()
    if data is None:
        return found
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for m in scope.metrics:
                if m.name == metric:
                    for point in m.data.data_points:
                        found[tuple(sorted(point.attributes.items()))] = point
    return found


def counted(metric: str, **attributes: str) -> float:
    key = tuple(sorted((f"redislock.{k}", v) for k, v in attributes.items()))
    point = otel_points(metric).get(key)
    if point is None:
        return 0
    return point.count if hasattr(point, "count") else point.value


@pytest.mark.urls("tests.urls_locked")
@pytest.mark.parametrize("view", ["item", "aitem"])
def test_otel_spans_around_acquire_and_hold(
    otel: InMemorySpanExporter, get: Callable[..., Any], held: Any, view: str
) -> None:
    acquired = counted("redislock.outcomes", name=T, kind="lock", outcome="acquired")
    busy = counted("redislock.outcomes", name=T, kind="lock", outcome="busy")
    waited = counted("redislock.wait.duration", name=T, kind="lock", outcome="acquired")
    held_count = counted("redislock.hold.duration", name=T, kind="lock", outcome="released")
    response = get(f"/{view}/apple/")
    assert response.status_code == 200
    fence = response.json()["fence"]
    got = {s.name: s for s in spans(otel)}
    assert set(got) == {f"acquire {T}", f"hold {T}"}
    acquire, hold = got[f"acquire {T}"], got[f"hold {T}"]
    assert acquire.kind == trace.SpanKind.INTERNAL
    assert acquire.attributes is not None and hold.attributes is not None
    assert acquire.attributes["redislock.name"] == T
    assert acquire.attributes["redislock.kind"] == "lock"
    assert acquire.attributes["redislock.outcome"] == "acquired"
    assert acquire.attributes["redislock.fence"] == fence
    assert acquire.attributes["redislock.waited_seconds"] >= 0
    assert hold.attributes["redislock.fence"] == fence
    assert hold.attributes["redislock.held_seconds"] >= 0
    assert acquire.instrumentation_scope is not None
    assert acquire.instrumentation_scope.name == "django_redislock"
    assert acquire.start_time is not None and acquire.end_time is not None
    assert hold.start_time is not None and hold.end_time is not None
    assert acquire.start_time <= acquire.end_time <= hold.end_time
    assert hold.status.status_code is StatusCode.UNSET
    otel.clear()
    held("item:apple")
    assert get(f"/{view}/apple/").status_code == 409
    busy_spans = [s for s in spans(otel) if s.name == f"acquire {T}"]
    assert len(busy_spans) == 1
    assert busy_spans[0].attributes is not None
    assert busy_spans[0].attributes["redislock.outcome"] == "busy"
    assert "redislock.fence" not in busy_spans[0].attributes
    assert busy_spans[0].status.status_code is StatusCode.UNSET
    assert counted("redislock.outcomes", name=T, kind="lock", outcome="acquired") == acquired + 1
    assert counted("redislock.outcomes", name=T, kind="lock", outcome="busy") == busy + 1
    assert counted("redislock.wait.duration", name=T, kind="lock", outcome="acquired") == (
        waited + 1
    )
    assert counted("redislock.hold.duration", name=T, kind="lock", outcome="released") == (
        held_count + 1
    )


def test_otel_acquire_span_is_a_child_of_the_current_span(otel: InMemorySpanExporter) -> None:
    @redis_locked("parented")
    def work() -> None:
        pass

    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("request") as parent:
        work()
    got = {s.name: s for s in spans(otel)}
    parent_id = parent.get_span_context().span_id
    for name in ("acquire parented", "hold parented"):
        assert got[name].parent is not None
        assert got[name].parent.span_id == parent_id


def test_otel_lost_lease_ends_the_hold_span_in_error(
    otel: InMemorySpanExporter, r: redis.Redis
) -> None:
    lock = get_lock("export:1", metric_name="export", wait=0)
    before = counted("redislock.outcomes", name="export", kind="lock", outcome="lost")
    assert lock.acquire()
    r.delete(lock.keys.lease)
    with pytest.raises(LockLost):
        lock.release()
    (hold,) = [s for s in spans(otel) if s.name == "hold export"]
    assert hold.status.status_code is StatusCode.ERROR
    assert [e.name for e in hold.events] == ["redislock.lost"]
    assert counted("redislock.outcomes", name="export", kind="lock", outcome="lost") == before + 1


@pytest.mark.urls("tests.urls_locked")
def test_otel_redis_down_is_an_error_span(
    otel: InMemorySpanExporter, dead_redis: dict[str, Any]
) -> None:
    with override_settings(REDISLOCK={**OTEL, **dead_redis}):
        assert Client().get("/item/apple/").status_code == 503
    (span,) = spans(otel)
    assert span.name == f"acquire {T}"
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert span.attributes["redislock.outcome"] == "unavailable"
    assert span.attributes["error.type"] == "RedisUnavailable"


def test_otel_gauges_read_throttle_semaphores(otel: InMemorySpanExporter, settings: Any) -> None:
    settings.REDISLOCK = {
        **OTEL,
        "THROTTLE": [{"name": "exports", "path": "^/exports/", "limit": 4}],
    }
    sem = get_semaphore("throttle:exports", 4, wait=0)
    assert sem.acquire()
    try:
        from django_redislock.contrib import opentelemetry as rl_otel

        rl_otel._levels = (0.0, [])  # forget a read of an earlier test
        key = (("redislock.name", "exports"),)
        assert otel_points("redislock.permits.in_use")[key].value == 1
        assert otel_points("redislock.permits.limit")[key].value == 4
        assert otel_points("redislock.queue.length")[key].value == 0
    finally:
        sem.release()


def test_async_lock_in_code_reports_too(prometheus: None) -> None:
    before = outcome("sync-job", "lock", "acquired")

    async def run() -> None:
        try:
            async with redis_lock("sync-job:1", metric_name="sync-job"):
                pass
        finally:
            await close_async_clients()

    asyncio.run(run())
    assert outcome("sync-job", "lock", "acquired") == before + 1


# -- what docs/metrics.rst says ----------------------------------------------------------------
DOC = (ROOT / "docs" / "metrics.rst").read_text()


def test_docs_list_exactly_the_prometheus_metrics(throttled: Any) -> None:
    """docs/metrics.rst, Prometheus: the table of metric names."""
    table = DOC.split("\nPrometheus\n==========\n", 1)[1].split("The wait buckets", 1)[0]
    documented = set(re.findall(r"^``(redislock_\w+)``", table, re.M))
    typed = re.findall(r"^# TYPE (redislock_\w+) (\w+)", scrape(), re.M)
    # The creation times prometheus_client adds to each labelled series.
    # prometheus_client names a counter's family without its _total.
    exposed = {
        f"{n}_total" if kind == "counter" and not n.endswith("_total") else n
        for n, kind in typed
        if not n.endswith("_created")
    }
    assert documented == exposed


def test_docs_bounds() -> None:
    """docs/metrics.rst: "at most 500 distinct names"; buckets "from 1 ms to 60 s",
    "from 5 ms to 15 minutes"."""
    from django_redislock.contrib import prometheus as rl_prometheus

    assert "at most 500 distinct names" in DOC
    assert rl_metrics.MAX_NAMES == 500
    assert "from 1 ms to 60 s, the hold buckets from 5 ms to 15 minutes" in flowing(DOC)
    assert (rl_prometheus.WAIT_BUCKETS[0], rl_prometheus.WAIT_BUCKETS[-1]) == (0.001, 60)
    assert (rl_prometheus.HOLD_BUCKETS[0], rl_prometheus.HOLD_BUCKETS[-1]) == (0.005, 900)
