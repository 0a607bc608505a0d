"""The Grafana dashboard and Prometheus alerting rules the package ships.

The rules are checked by ``promtool check rules`` and unit-tested by
``promtool test rules`` (skipped where promtool is not installed, a failure
in CI: ``REDISLOCK_REQUIRE_PROMTOOL=1``, .ci/run installs it); every query of
the rules and of the dashboard names only metrics the real exporter serves.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from django.test import RequestFactory, override_settings

from django_redislock import connection, signals
from django_redislock.contrib import dashboards

ROOT = Path(__file__).resolve().parent.parent
PROMTOOL = shutil.which("promtool")


@pytest.fixture
def promtool() -> str:
    if PROMTOOL is None:
        if os.environ.get("REDISLOCK_REQUIRE_PROMTOOL") == "1":
            pytest.fail("promtool is required (REDISLOCK_REQUIRE_PROMTOOL=1) but not installed")
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return PROMTOOL


def dashboard() -> dict[str, Any]:
    return json.loads(dashboards.text("grafana"))


def queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every query the dashboard and the rules make."""
    found = []
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            found.append((f"panel {panel['title']!r}", target["expr"]))
    for var in dashboard()["templating"]["list"]:
        if var["type"] == "query":
            found.append((f"variable {var['name']!r}", var["definition"]))
    text = dashboards.text("alerts")
    for alert, expr in re.findall(
        r"- alert: (\w+)\n(?:\s+#.*\n)*\s+expr: >-\n((?:\s{10}.*\n)+)", text
    ):
        found.append((f"alert {alert}", expr))
    return found


def test_the_files_are_where_the_docs_say() -> None:
    for which, filename in (("grafana", "grafana.json"), ("alerts", "alerts.yml")):
        where = dashboards.path(which)
        assert where.name == filename and where.is_file()
        assert where.parent == ROOT / "django_redislock" / "contrib" / "dashboards"
    with pytest.raises(ValueError, match="one of"):
        dashboards.path("kibana")


def test_the_command_prints_paths_and_files() -> None:
    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "django_redislock.contrib.dashboards", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert run() == (
        f"alerts: {dashboards.path('alerts')}\ngrafana: {dashboards.path('grafana')}\n"
    )
    assert run("--path", "grafana") == f"{dashboards.path('grafana')}\n"
    assert run("alerts") == dashboards.text("alerts")
    assert json.loads(run("grafana")) == dashboard()


def test_the_rules_pass_promtool_check(promtool: str) -> None:
    done = subprocess.run(
        [promtool, "check", "rules", str(dashboards.path("alerts"))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 5 rules found" in done.stdout


def test_the_first_loss_fires_the_alert(promtool: str, tmp_path: Path) -> None:
    """With the series at 0 before the loss (as the library now exports it),
    the first lost lease and the first outage fire; a force-release does not."""
    # The rules as shipped, less their annotations (promtool compares them
    # whole; what fires, and with which labels, is what is tested here).
    rules = tmp_path / "alerts.yml"
    rules.write_text(re.sub(r"\n {8}annotations:\n(?: {10}.*\n)+", "\n", dashboards.text("alerts")))
    lost = 'redislock_losses_total{name="export:{n}",kind="lock",cause="%s"}'
    down = 'redislock_outcomes_total{name="report",kind="lock",outcome="unavailable"}'
    tests = tmp_path / "alerts_test.yml"
    tests.write_text(
        textwrap.dedent(
            f"""\
            rule_files:
              - {rules}
            evaluation_interval: 1m
            tests:
              - interval: 1m
                input_series:
                  - series: '{lost % "redis_lost"}'
                    values: '0 0 0 1 1 1 1 1 1 1 1 1 1 1 1 1'
                  - series: '{lost % "force_released"}'
                    values: '0 0 0 1 1 1 1 1 1 1 1 1 1 1 1 1'
                  - series: '{down}'
                    values: '0 0 0 0 2 2 2 2 2 2 2 2 2 2 2 2'
                alert_rule_test:
                  - eval_time: 2m
                    alertname: RedisLockLeaseLost
                    exp_alerts: []
                  - eval_time: 4m
                    alertname: RedisLockLeaseLost
                    exp_alerts:
                      - exp_labels:
                          severity: warning
                          name: "export:{{n}}"
                          kind: lock
                          cause: redis_lost
                  - eval_time: 5m
                    alertname: RedisLockRedisUnavailable
                    exp_alerts:
                      - exp_labels:
                          severity: critical
                          name: report
                          kind: lock
                          outcome: unavailable
            """
        )
    )
    done = subprocess.run(
        [promtool, "test", "rules", str(tests)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def exported(redis_server: Any) -> set[str]:
    """Every sample name the real exporter serves, every kind of series made:
    a declared template, a throttling rule (its gauges read from Redis), and
    idempotency and unique-task keys."""
    from django_redislock.contrib.prometheus import metrics_view

    rules = [{"name": "dash-rule", "path": r"^/dash/", "limit": 2}]
    connection.reset()
    try:
        with override_settings(REDISLOCK={"METRICS": ["prometheus"], "THROTTLE": rules}):
            signals.declare("dash:{id}", "lock")
            signals.declare("idempotent:dash.view", "idempotency")
            signals.declare("unique:dash:{id}", "unique_task")
            text = metrics_view(RequestFactory().get("/metrics")).content.decode()
    finally:
        connection.reset()
    return set(re.findall(r"^(redislock_\w+)[{ ]", text, re.M))


def test_every_query_names_only_metrics_the_exporter_serves(exported: set[str]) -> None:
    named = {(where, m) for where, expr in queries() for m in re.findall(r"redislock_\w+", expr)}
    # Eleven panels, the variable and five alerts.
    assert len({where for where, _ in named}) == 17
    unknown = sorted((where, m) for where, m in named if m not in exported)
    assert unknown == []


def test_the_dashboard_covers_what_on_call_looks_at() -> None:
    titles = [p["title"] for p in dashboard()["panels"] if p["type"] != "row"]
    assert titles == [
        "Wait p99 per template (acquired)",
        "Hold p99 per template",
        "Busy share per template",
        "Seconds spent waiting per second",
        "Lost leases by cause",
        "Redis unavailable",
        "Throttled requests per second",
        "Permits in use vs limit",
        "Queue length",
        "Idempotency keys",
        "Unique tasks",
    ]
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            continue
        # Any Prometheus of the reader's: the data source is a variable.
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert all('name=~"$name"' in t["expr"] for t in panel["targets"])
        # Within Grafana's 24 columns.
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
