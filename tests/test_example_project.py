"""The example project: its demo, end to end at a small scale, and its upkeep.

The demo runs in a subprocess (it configures Django with the example's own
settings, which must not replace this suite's), against a private Redis on a
TCP port, with the same gunicorn the README's command uses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers import module_from_file
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


# Run in a subprocess with the example's own settings: a checkout through
# Django's test client, each case printing its outcome as one JSON object.
CHECKOUT_CASES = """
import json

import django
from django.conf import settings
from django.core.management import call_command
from django.test import Client, override_settings
from django.test.utils import setup_test_environment

django.setup()
setup_test_environment()
call_command("migrate", verbosity=0)

from django_redislock import get_lock
from shop import views
from shop.models import Order, Product

a, b = (Product.objects.create(name=n, stock=5).pk for n in "ab")
gone = Product.objects.create(name="gone", stock=0).pk
client = Client()


def post(body, **headers):
    return client.post("/checkout", body, content_type="application/json", headers=headers)


def state():
    stock = dict(Product.objects.values_list("pk", "stock"))
    return {"stock": [stock[a], stock[b]], "orders": Order.objects.count()}


out = {}
reply = post({"products": [b, a]})
out["bought"] = [reply.status_code, reply.json(), state()]
out["sold_out"] = [post({"products": [a, gone]}).status_code, state()]
out["unknown"] = [post({"products": [a, 10**6]}).status_code, state()]
out["bad"] = [
    post(body).status_code
    for body in ("not json", {}, {"products": []}, {"products": [a, a]},
                 {"products": [True]}, {"products": "1"}, {"products": list(range(1, 22))})
]

# A newer holder wrote product b while this cart was paying: its fence is
# stale, and the whole cart rolls back, product a included.
pay = views._pay
views._pay = lambda: Product.objects.filter(pk=b).update(fence=2**62)
out["stale"] = [post({"products": [a, b]}).status_code, state()]
views._pay = pay
Product.objects.update(fence=0)

# A single purchase of a holds purchase:a: the cart waits for it, not for b alone.
with override_settings(REDISLOCK={**settings.REDISLOCK, "WAIT": 0}):
    with get_lock(f"purchase:{a}", timeout=30, wait=0):
        out["excluded"] = [post({"products": [b, a]}).status_code, state()]

first = post({"products": [a, b]}, **{"Idempotency-Key": "cart-1"})
again = post({"products": [a, b]}, **{"Idempotency-Key": "cart-1"})
out["retried"] = [
    first.status_code, again.status_code, again.headers.get("Idempotent-Replayed"),
    first.content == again.content, state(),
]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_checkout_sells_whole_carts_or_nothing(redis_factory, tmp_path):
    server = redis_factory(port=free_port(), unix=False).start()
    done = subprocess.run(
        [sys.executable, "-c", CHECKOUT_CASES],
        env=_env(
            REDIS_URL=server.url,
            DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
            DJANGO_SETTINGS_MODULE="example.settings",
            DJANGO_DEBUG="0",
            SHOP_PURCHASE_DELAY="0",
        ),
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout.splitlines()[-1])

    status, body, state = out["bought"]
    assert status == 200, body
    assert (body["products"], body["stock"], len(body["orders"])) == ([2, 1], [4, 4], 2)
    assert state == {"stock": [4, 4], "orders": 2}
    # Sold out or unknown on one product: nothing is bought, on any product.
    assert out["sold_out"] == [410, {"stock": [4, 4], "orders": 2}]
    assert out["unknown"] == [404, {"stock": [4, 4], "orders": 2}]
    assert out["bad"] == [400] * 7
    # A stale fence on one product rolls back the whole cart: 503, as for buy.
    assert out["stale"] == [503, {"stock": [4, 4], "orders": 2}]
    # The cart and a single purchase share the product's lock.
    assert out["excluded"] == [409, {"stock": [4, 4], "orders": 2}]
    # One Idempotency-Key, sent twice: charged once, the same answer replayed.
    assert out["retried"] == [200, 200, "true", True, {"stock": [3, 3], "orders": 4}]


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
    return module_from_file("example_dburl", PROJECT / "example" / "dburl.py")


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
        (
            "mysql://root@127.0.0.1:3306/shop?isolation_level=repeatable+read",
            {
                "ENGINE": "django.db.backends.mysql",
                "NAME": "shop",
                "USER": "root",
                "PASSWORD": "",
                "HOST": "127.0.0.1",
                "PORT": "3306",
                "OPTIONS": {"isolation_level": "repeatable read"},
            },
        ),
        (
            "mariadb://shop:pw@%2Frun%2Fmysqld%2Fmysqld.sock/shop",
            {
                "ENGINE": "django.db.backends.mysql",
                "NAME": "shop",
                "USER": "shop",
                "PASSWORD": "pw",
                "HOST": "/run/mysqld/mysqld.sock",
                "PORT": "",
            },
        ),
    ],
)
def test_database_url(url, expected):
    assert _dburl().parse(url) == expected


def test_database_url_names_the_supported_schemes():
    with pytest.raises(
        ValueError, match=r"'oracle' is not supported.*sqlite:///.*postgres://.*mysql://"
    ):
        _dburl().parse("oracle://scott@localhost/shop")
