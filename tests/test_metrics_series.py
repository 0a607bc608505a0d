"""Every series a lock template will use exists at 0 before anything is counted.

A counter made on first use appears at 1, and ``increase(...[10m]) > 0``
cannot see a series go from nothing to 1: the documented alert missed the
first lost lease or outage of each template after every deploy. So a
template's series are made at 0 the moment it is declared (a decorator at
import, a throttling rule, a unique task) or first used, without touching
Redis, within the bound of names a process admits: in one process, in
prometheus_client's multiprocess mode, and behind a real gunicorn.
"""

from __future__ import annotations

import http.client
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
import redis
from django.test import RequestFactory, override_settings
from prometheus_client import REGISTRY, generate_latest

from django_redislock import connection, redis_lock, redis_locked, signals
from django_redislock.middleware import concurrency_limited
from django_redislock.ops import metrics as rl_metrics
from tests.helpers import end_process, run_python
from tests.servers import RedisServer, free_port
from tests.test_metrics import otel, otel_points  # noqa: F401  (otel: a fixture)

ROOT = Path(__file__).resolve().parent.parent
PROM = {"METRICS": ["prometheus"]}
OTEL = {"METRICS": ["opentelemetry"]}

# Every series of one (name, kind), as the exposition names them.
SERIES = [
    *(
        f'redislock_outcomes_total{{kind="{{k}}",name="{{n}}",outcome="{o}"}}'
        for o in ("acquired", "busy", "lost", "unavailable", "fail_open")
    ),
    *(
        f'redislock_losses_total{{cause="{c}",kind="{{k}}",name="{{n}}"}}'
        for c in ("expired", "force_released", "redis_lost")
    ),
    *(
        f'redislock_wait_seconds_count{{kind="{{k}}",name="{{n}}",outcome="{o}"}}'
        for o in ("acquired", "busy")
    ),
    *(
        f'redislock_hold_seconds_count{{kind="{{k}}",name="{{n}}",outcome="{o}"}}'
        for o in ("released", "lost")
    ),
]


def series_of(name: str, kind: str) -> list[str]:
    return [s.replace("{n}", name).replace("{k}", kind) for s in SERIES]


def values(text: str, name: str, kind: str) -> dict[str, float]:
    """The value of each series of (name, kind) in an exposition; missing ones absent."""
    found = {}
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if head in series_of(name, kind):
            found[head] = float(value)
    return found


def scrape() -> str:
    return generate_latest(REGISTRY).decode()


@pytest.fixture
def prometheus() -> Iterator[None]:
    with override_settings(REDISLOCK=PROM):
        yield


@contextmanager
def no_network() -> Iterator[None]:
    """Declaring must not touch Redis: any client asked for fails the test."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a declaration asked for a Redis client")

    with (
        patch.object(connection, "get_client", refuse),
        patch.object(connection, "get_async_client", refuse),
    ):
        yield


# -- one process ------------------------------------------------------------------------------
def test_a_decorated_template_has_every_series_at_0_before_any_call(prometheus: None) -> None:
    with no_network():

        @redis_locked("zero-invoice:{number}")
        def bill(number: int) -> None:  # pragma: no cover - never called
            pass

    found = values(scrape(), "zero-invoice:{number}", "lock")
    assert found == dict.fromkeys(series_of("zero-invoice:{number}", "lock"), 0.0)


def test_declared_before_the_backend_is_on_counts_once_it_is() -> None:
    # Imported (decorated) while metrics are off: the backend, switched on
    # later, makes the series of everything declared so far.
    with no_network():

        @redis_locked("early:{id}")
        def early(id: int) -> None:  # pragma: no cover - never called
            pass

    with no_network(), override_settings(REDISLOCK=PROM):
        pass
    with override_settings(REDISLOCK=PROM):
        found = values(scrape(), "early:{id}", "lock")
    assert found == dict.fromkeys(series_of("early:{id}", "lock"), 0.0)


def test_throttling_rules_and_limited_views_are_declared() -> None:
    with no_network():

        @concurrency_limited("series-deco", 2)
        def view(request: Any) -> None:  # pragma: no cover - never called
            pass

    rules = [{"name": "series-rule", "path": r"^/series/", "limit": 2}]
    with override_settings(REDISLOCK={**PROM, "THROTTLE": rules}):
        text = scrape()
    for name in ("series-rule", "series-deco"):
        assert values(text, name, "semaphore") == dict.fromkeys(series_of(name, "semaphore"), 0.0)


def test_a_name_first_used_gets_every_series(prometheus: None) -> None:
    with redis_lock("ad-hoc:1", metric_name="ad-hoc"):
        pass
    found = values(scrape(), "ad-hoc", "lock")
    assert set(found) == set(series_of("ad-hoc", "lock"))
    assert found['redislock_outcomes_total{kind="lock",name="ad-hoc",outcome="acquired"}'] >= 1
    assert found['redislock_outcomes_total{kind="lock",name="ad-hoc",outcome="lost"}'] == 0


def test_other_exists_from_the_start(prometheus: None) -> None:
    for kind in ("lock", "semaphore"):
        assert set(values(scrape(), "other", kind)) == set(series_of("other", kind))


def test_declarations_stay_within_the_bound_of_names(
    prometheus: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rl_metrics, "names", rl_metrics._Names(limit=3))
    with no_network():
        for number in range(10):
            signals.declare(f"bounded:{number}", "lock")
    made = set(re.findall(r'name="(bounded:\d+)"', scrape()))
    assert made == {"bounded:0", "bounded:1", "bounded:2"}
    # And what the registry of declarations keeps is bounded too.
    assert signals.MAX_DECLARED == 1000


def test_otel_counters_start_at_0(otel: Any) -> None:  # noqa: F811
    with no_network():

        @redis_locked("otel-zero:{id}")
        def job(id: int) -> None:  # pragma: no cover - never called
            pass

    points = otel_points("redislock.outcomes")
    for what in ("acquired", "busy", "lost", "unavailable", "fail_open"):
        key = (
            ("redislock.kind", "lock"),
            ("redislock.name", "otel-zero:{id}"),
            ("redislock.outcome", what),
        )
        assert key in points and points[key].value == 0, what
    causes = otel_points("redislock.losses")
    for cause in ("expired", "force_released", "redis_lost"):
        key = (
            ("redislock.cause", cause),
            ("redislock.kind", "lock"),
            ("redislock.name", "otel-zero:{id}"),
        )
        assert key in causes and causes[key].value == 0, cause


# -- prometheus_client's multiprocess mode ------------------------------------------------------
_DECLARING_CHILD = r"""
import tests.settings as s
s.REDISLOCK = {"METRICS": ["prometheus"]}
import django
django.setup()
from django_redislock import redis_locked

@redis_locked("mp:{n}")
def job(n):
    return n
# Never called: the process only declared its template, and exits.
"""

_SCRAPING_CHILD = r"""
import tests.settings as s
s.REDISLOCK = {"METRICS": ["prometheus"]}
import django
django.setup()
from prometheus_client import generate_latest
from django_redislock.contrib.prometheus import registry
print(generate_latest(registry()).decode())
"""


def test_multiprocess_mode_exports_the_zeroes_of_another_process(tmp_path: Path) -> None:
    """prometheus_client writes each child series to the process's file as it
    is made, at 0; the collector merges every file: a scrape answered by any
    worker shows the series a worker declared."""
    env = dict(
        os.environ, DJANGO_SETTINGS_MODULE="tests.settings", PROMETHEUS_MULTIPROC_DIR=str(tmp_path)
    )
    for child in (_DECLARING_CHILD, _SCRAPING_CHILD):
        out = run_python("-c", child, env=env, timeout=120)
    found = values(out, "mp:{n}", "lock")
    assert found == dict.fromkeys(series_of("mp:{n}", "lock"), 0.0), out


# -- a real gunicorn ------------------------------------------------------------------------------
class Gunicorn:
    """gunicorn with two workers on tests/metrics_settings.py, stopped by its PID."""

    def __init__(self, redis_url: str, multiproc_dir: str) -> None:
        self.port = free_port()
        self.log = Path(tempfile.mkdtemp(prefix="redislock-metrics-")) / "gunicorn.log"
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.metrics_settings",
            "REDISLOCK_SERVER_REDIS_URL": redis_url,
            "PROMETHEUS_MULTIPROC_DIR": multiproc_dir,
            "PYTHONPATH": str(ROOT),
        }
        args = [
            sys.executable,
            "-m",
            "gunicorn",
            "django.core.wsgi:get_wsgi_application()",
            "--bind",
            f"127.0.0.1:{self.port}",
            "--workers",
            "2",
            "--graceful-timeout",
            "2",
            "--timeout",
            "60",
        ]
        self.out = self.log.open("wb")
        self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=self.out, stderr=self.out)

    def get(self, path: str) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read().decode()
        finally:
            conn.close()

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited early:\n{self.log.read_text()[-3000:]}")
            try:
                # No lock taken: a 404 says the server answers (and loads the URLs).
                self.get("/ready/")
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"gunicorn not ready:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        end_process(self.proc)
        self.out.close()


@pytest.fixture
def site(redis_factory: Any, tmp_path: Path) -> Iterator[tuple[Gunicorn, redis.Redis]]:
    server: RedisServer = redis_factory(port=free_port(), unix=False).start()
    app = Gunicorn(server.url, str(tmp_path))
    try:
        app.wait_ready()
        with server.client() as client:
            yield app, client
    finally:
        app.stop()


@pytest.mark.server
def test_behind_gunicorn_the_first_loss_moves_a_series_that_was_at_0(
    site: tuple[Gunicorn, redis.Redis],
) -> None:
    app, r = site
    status, before = app.get("/metrics")
    assert status == 200
    # Before any request touched a lock: the templates of the site, and its
    # throttling rule, with every series at 0.
    assert values(before, "export:{n}", "lock") == dict.fromkeys(
        series_of("export:{n}", "lock"), 0.0
    )
    assert values(before, "report:{n}", "lock") == dict.fromkeys(
        series_of("report:{n}", "lock"), 0.0
    )
    assert values(before, "exports", "semaphore") == dict.fromkeys(
        series_of("exports", "semaphore"), 0.0
    )
    # The first loss: its lease vanishes under the view, which has answered
    # by the time its release finds out.
    assert app.get("/export/1/") == (200, "ran")
    _, after = app.get("/metrics")
    moved = {k: v for k, v in values(after, "export:{n}", "lock").items() if v}
    assert moved == {
        'redislock_outcomes_total{kind="lock",name="export:{n}",outcome="acquired"}': 1.0,
        'redislock_outcomes_total{kind="lock",name="export:{n}",outcome="lost"}': 1.0,
        'redislock_losses_total{cause="redis_lost",kind="lock",name="export:{n}"}': 1.0,
        'redislock_wait_seconds_count{kind="lock",name="export:{n}",outcome="acquired"}': 1.0,
        'redislock_hold_seconds_count{kind="lock",name="export:{n}",outcome="lost"}': 1.0,
    }


# -- a scrape while Redis hangs ------------------------------------------------------------------
def test_a_scrape_while_redis_hangs_answers_within_its_own_bound(
    redis_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The gauges are read from Redis at scrape time. With Redis frozen
    (SIGSTOP), a scrape waited for the socket timeout of lock calls; it waits
    ``SCRAPE_TIMEOUT`` (0.5 s) and answers without the gauges. The socket
    timeout here is a minute, so a scrape bound by it could not pass."""
    from django_redislock.contrib.prometheus import metrics_view
    from django_redislock.ops.levels import SCRAPE_TIMEOUT

    assert SCRAPE_TIMEOUT == 0.5
    server = redis_factory(port=free_port(), unix=False).start()
    caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": server.url}}
    rules = [{"name": "frozen", "path": r"^/frozen/", "limit": 3}]
    settings = {**PROM, "THROTTLE": rules, "SOCKET_TIMEOUT": 60.0, "CONNECT_TIMEOUT": 60.0}
    request = RequestFactory().get("/metrics")
    connection.reset()
    try:
        with override_settings(CACHES=caches, REDISLOCK=settings):
            assert 'redislock_permits_limit{name="frozen"} 3.0' in (
                metrics_view(request).content.decode()
            )
            server.pause()
            try:
                with caplog.at_level(logging.WARNING, logger="django_redislock.metrics"):
                    for _ in range(3):
                        started = time.monotonic()
                        text = metrics_view(request).content.decode()
                        # Far from the minute a lock call would wait.
                        assert time.monotonic() - started < 20
                        assert "redislock_permits_limit{" not in text
                        # The counters are there all the same.
                        assert 'redislock_outcomes_total{kind="semaphore",name="frozen"' in text
            finally:
                server.resume()
            assert "could not read the throttling semaphores" in caplog.text
            # Once the read in flight ends, the gauges come back.
            deadline = time.monotonic() + 60
            while 'redislock_permits_limit{name="frozen"} 3.0' not in (
                metrics_view(request).content.decode()
            ):
                assert time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        connection.reset()
