"""Carts through a real gunicorn and a real database server: the example shop's checkout.

The example's demo (``demo.py --only carts --postgres URL``, or ``--mysql
URL``) creates a database of its own on the suite's PostgreSQL server (or
MariaDB/MySQL server, at READ COMMITTED and at REPEATABLE READ), serves the shop with
gunicorn against it and a private Redis, sends concurrent carts over
overlapping products listed in random orders (mixed with single purchases of
the same products), then carts retried with one Idempotency-Key each, to the
locked checkout and to its unsafe twin; it drops the database at the end.

Servers only: SQLite takes one writer at a time, so carts there can
neither write different rows at once nor deadlock. PostgreSQL counts the
deadlocks of one database; MariaDB counts them for the whole server, so there
the demo does not count them and a deadlock shows as a 500.
"""

from __future__ import annotations

import json
import subprocess
import sys
from urllib.parse import quote, quote_plus

import pytest
from django.conf import settings

from tests.servers import free_port
from tests.test_example_project import PROJECT, ROOT, _env

needs_pg = pytest.mark.skipif(
    "postgres" not in settings.DATABASES,
    reason="PostgreSQL not reachable (127.0.0.1:5432, or PGHOST/PGPORT/PGUSER/PGDATABASE)",
)
needs_mysql = pytest.mark.skipif(
    "mysql" not in settings.DATABASES,
    reason="MariaDB/MySQL not reachable (127.0.0.1:3306, or REDISLOCK_MYSQL_*)",
)

CARTS, STOCK, RETRY_KEYS, COPIES = 40, 8, 6, 3


def _postgres_url() -> str:
    pg = settings.PG  # the server the suite found; libpq reads PGPASSWORD itself
    return f"postgres://{pg['USER']}@{pg['HOST']}:{pg['PORT']}/{pg['NAME']}"


def _mysql_url(isolation: str) -> str:
    my = settings.MYSQL
    password = f":{quote(my['PASSWORD'], safe='')}" if my["PASSWORD"] else ""
    return (
        f"mysql://{quote(my['USER'], safe='')}{password}@{my['HOST']}:{my['PORT']}/{my['NAME']}"
        f"?isolation_level={quote_plus(isolation)}"
    )


def _database_exists(vendor: str, name: str) -> bool:
    if vendor == "mysql":
        import MySQLdb

        my = settings.MYSQL
        conn = MySQLdb.connect(
            host=my["HOST"],
            port=int(my["PORT"]),
            user=my["USER"],
            password=my["PASSWORD"],
            connect_timeout=5,
        )
        try:
            cursor = conn.cursor()
            cursor.execute(
                "SELECT 1 FROM information_schema.schemata WHERE schema_name = %s", [name]
            )
            return cursor.fetchone() is not None
        finally:
            conn.close()
    import psycopg

    pg = settings.PG
    with psycopg.connect(
        host=pg["HOST"], port=pg["PORT"], user=pg["USER"], dbname=pg["NAME"], connect_timeout=5
    ) as conn:
        return (
            conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
            is not None
        )


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize(
    ("vendor", "database"),
    [
        pytest.param("postgresql", ["--postgres", None], marks=needs_pg, id="postgres"),
        pytest.param("mysql", ["--mysql", "read committed"], marks=needs_mysql, id="mysql"),
        pytest.param(
            "mysql", ["--mysql", "repeatable read"], marks=needs_mysql, id="mysql_repeatable_read"
        ),
    ],
)
def test_carts_never_oversell_never_deadlock_and_retries_charge_once(
    redis_factory, tmp_path, vendor, database
):
    option, isolation = database
    url = _postgres_url() if vendor == "postgresql" else _mysql_url(isolation)
    server = redis_factory(port=free_port(), unix=False).start()
    results_file = tmp_path / "results.json"
    done = subprocess.run(
        [
            sys.executable,
            str(PROJECT / "demo.py"),
            "--only",
            "carts",
            option,
            url,
            "--carts",
            str(CARTS),
            "--cart-clients",
            "8",
            "--cart-products",
            "4",
            "--cart-stock",
            str(STOCK),
            "--cart-retry-keys",
            str(RETRY_KEYS),
            "--retry-copies",
            str(COPIES),
            "--workers",
            "2",
            "--threads",
            "4",
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
    assert results["database"] == vendor
    # Counted for one database on PostgreSQL; MariaDB counts server-wide, so not at all.
    counted = vendor == "postgresql"

    locked = results["carts"]["locked"]
    # Never oversold: every unit is in stock or in exactly one order, per product.
    for pk, product in locked["per_product"].items():
        assert product["orders"] + product["stock_left"] == STOCK, (pk, product)
    assert locked["oversold"] == 0, locked
    # The race was for the last units: some product sold out, and carts that
    # wanted it were turned away whole.
    assert any(p["stock_left"] == 0 for p in locked["per_product"].values()), locked
    assert locked["sold_out_410"] > 0, locked
    # All or nothing: the orders are exactly the units of the requests answered 200.
    assert locked["orders_match_answers"], locked
    # Never deadlocked: every request was answered, none stayed busy for the
    # whole lock wait (409), none failed (a deadlock is a 500), and
    # PostgreSQL saw no deadlock.
    assert locked["answered"] == CARTS, locked
    assert locked["ok_200"] + locked["sold_out_410"] == CARTS, locked
    assert (locked["busy_409"], locked["server_errors_5xx"], locked["errors"]) == (0, 0, 0), locked
    assert (locked["unsent"], locked["deadlocks"]) == (0, 0 if counted else None), locked

    # Each cart sent COPIES times at once with one key, then once more: the
    # idempotent checkout charges it once and replays the later retry.
    retried = results["cart_retries"]["idempotent"]
    assert retried["orders"] == RETRY_KEYS * retried["cart_size"], retried
    assert (retried["carts_charged"], retried["double_charges"]) == (RETRY_KEYS, 0), retried
    assert retried["orders_match_answers"], retried
    assert (retried["ran_200"], retried["later_replayed"]) == (RETRY_KEYS, RETRY_KEYS), retried
    assert retried["in_progress_409"] + retried["replayed"] == RETRY_KEYS * COPIES, retried
    assert (retried["errors"], retried["server_errors_5xx"]) == (0, 0), retried
    assert retried["deadlocks"] == (0 if counted else None), retried

    # The control, without the lock and @idempotent: it oversells or has the
    # database end carts that wrote the same rows in opposite orders, and
    # it charges retries again. On PostgreSQL each of its 500s is one of
    # those deadlocks.
    unsafe = results["carts"]["unsafe"]
    assert unsafe["oversold"] > 0 or unsafe["server_errors_5xx"] > 0, unsafe
    unprotected = results["cart_retries"]["unprotected"]
    assert unprotected["double_charges"] > 0, unprotected
    assert unprotected["orders_match_answers"], unprotected
    if counted:
        assert unsafe["server_errors_5xx"] == unsafe["deadlocks"], unsafe
        assert unprotected["server_errors_5xx"] == unprotected["deadlocks"], unprotected
    assert f"Control (no lock, no @idempotent) on {vendor}:" in done.stdout

    # The run dropped its database and removed its Redis keys.
    assert not _database_exists(vendor, results["server_database"])
    with server.client() as client:
        assert client.keys("*") == []
