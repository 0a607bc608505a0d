"""The example project: its demo, end to end at a small scale, and its upkeep.

The demo runs in a subprocess (it configures Django with the example's own
settings, which must not replace this suite's), against a private Redis on a
TCP port, with the same gunicorn the README's command uses.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.servers import free_port

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "example_project"


def _env(**extra: str) -> dict[str, str]:
    """This environment minus anything that would point the example elsewhere."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL", "SHOP_REDIS_PREFIX"}
    }
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(PROJECT)])
    env.update(extra)
    return env


@pytest.mark.server
@pytest.mark.slow
def test_demo_sells_exactly_the_stock_and_charges_retries_once(redis_factory, tmp_path):
    server = redis_factory(port=free_port(), unix=False).start()
    results_file = tmp_path / "results.json"
    stock, purchases = 8, 30
    done = subprocess.run(
        [
            sys.executable,
            str(PROJECT / "demo.py"),
            "--stock",
            str(stock),
            "--purchases",
            str(purchases),
            "--clients",
            "6",
            "--reports",
            "10",
            "--report-clients",
            "5",
            "--retry-keys",
            "6",
            "--retry-copies",
            "3",
            "--carts",
            "24",
            "--cart-clients",
            "4",
            "--cart-stock",
            "6",
            "--cart-retry-keys",
            "4",
            "--workers",
            "2",
            "--threads",
            "3",
            "--deadline",
            "30",
            "--json",
            str(results_file),
        ],
        env=_env(REDIS_URL=server.url),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(results_file.read_text())
    assert results["problems"] == []

    for name in ("locked", "locked async"):
        run = results["purchases"][name]
        assert (run["orders"], run["stock_left"], run["oversold"]) == (stock, 0, 0), run
        assert run["errors"] == run["unsent"] == 0, run
        # Everyone after the last unit was told it is sold out (or, on a very
        # slow machine, that the product stayed busy past the lock wait).
        assert run["sold_out_410"] + run["busy_409"] == purchases - stock, run

    # Each purchase sent three times at once with one Idempotency-Key, then
    # once more: the idempotent endpoints charge it once, and every later
    # retry gets the first answer; the control charges every copy.
    for name in ("idempotent", "idem. async"):
        run = results["retries"][name]
        assert (run["orders"], run["double_charges"], run["ran_200"]) == (6, 0, 6), run
        assert run["later_replayed"] == 6, run
        assert run["in_progress_409"] + run["replayed"] == 6 * 3 + 6 - 6, run
        assert run["errors"] == 0, run
    control = results["retries"]["unprotected"]
    assert (control["orders"], control["double_charges"]) == (24, 18), control

    # Carts (on SQLite here; tests/test_carts_e2e.py runs them on PostgreSQL):
    # never oversold, all or nothing, none busy past its wait; each retried
    # cart of three products charged once, every copy of it in the control.
    carts = results["carts"]["locked"]
    assert carts["oversold"] == 0 and carts["consistent"], carts
    assert carts["orders_match_answers"], carts
    assert carts["ok_200"] + carts["sold_out_410"] == 24, carts
    assert carts["busy_409"] == carts["errors"] == carts["unsent"] == 0, carts
    retried = results["cart_retries"]["idempotent"]
    assert (retried["orders"], retried["double_charges"]) == (4 * 3, 0), retried
    assert retried["later_replayed"] == 4, retried
    control = results["cart_retries"]["unprotected"]
    assert (control["orders"], control["double_charges"]) == (48, 12), control

    reports = results["reports"]
    assert 1 <= reports["max_in_flight"] <= reports["limit"] == 2, reports
    assert reports["ok_200"] + reports["throttled_503"] == 10, reports
    assert reports["throttled_with_retry_after"] == reports["throttled_503"], reports

    assert results["restock"]["skipped_while_held"], results["restock"]
    assert results["restock"]["ran_after"], results["restock"]

    # The run used a unique prefix on what it took for a shared Redis, and
    # removed its own keys at the end.
    with server.client() as client:
        assert client.keys("*") == []
    assert "oversold" in done.stdout
    assert "double charges" in done.stdout


@pytest.mark.slow
def test_migrations_are_committed_and_checks_pass(redis_factory, tmp_path):
    server = redis_factory(port=free_port(), unix=False).start()
    done = subprocess.run(
        [sys.executable, "manage.py", "makemigrations", "--check", "--dry-run"],
        env=_env(REDIS_URL=server.url, DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}"),
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "No changes detected"


def _dburl() -> ModuleType:
    spec = importlib.util.spec_from_file_location("example_dburl", PROJECT / "example" / "dburl.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "sqlite:////tmp/shop/db.sqlite3",
            {"ENGINE": "django.db.backends.sqlite3", "NAME": "/tmp/shop/db.sqlite3"},
        ),
        ("sqlite:///db.sqlite3", {"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"}),
        ("sqlite://", {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}),
        (
            "postgres://shop:s%40cret@db.example.com:6432/shop?sslmode=require",
            {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": "shop",
                "USER": "shop",
                "PASSWORD": "s@cret",
                "HOST": "db.example.com",
                "PORT": "6432",
                "OPTIONS": {"sslmode": "require"},
            },
        ),
        (
            "postgresql://postgres@%2Fvar%2Frun%2Fpostgresql/test",
            {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": "test",
                "USER": "postgres",
                "PASSWORD": "",
                "HOST": "/var/run/postgresql",
                "PORT": "",
            },
        ),
        (
            "postgres://u:p@[::1]:5432/x",
            {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": "x",
                "USER": "u",
                "PASSWORD": "p",
                "HOST": "::1",
                "PORT": "5432",
            },
        ),
    ],
)
def test_database_url(url, expected):
    assert _dburl().parse(url) == expected


def test_database_url_names_the_supported_schemes():
    with pytest.raises(ValueError, match=r"'mysql' is not supported.*sqlite:///.*postgres://"):
        _dburl().parse("mysql://root@localhost/shop")
