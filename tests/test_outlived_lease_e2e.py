"""A purchase that outlives its idempotency lease, through a real gunicorn and PostgreSQL.

The example shop (``tests/outlived_lease_app.py``: ``ATOMIC_REQUESTS``, a
2 s idempotency lease without renewal) on a database of its own, created on
the suite's PostgreSQL server as the demo creates one (``tests/test_carts_e2e.py``)
and dropped at the end. The first purchase with a key is held in its payment
step until its lease has run out in Redis; a retry with the same key then
finds the key marked running with nobody holding it, and is answered 409
(outcome unknown) instead of running beside it; the first is let go, finds
its lease gone before its commit and rolls back, which frees the key; the
next retry runs. Exactly one charge must be recorded. Every step waits on
state the test can see (Redis keys, HTTP answers), each wait bounded.
"""

from __future__ import annotations

import http.client
import subprocess
import sys
import threading
from types import ModuleType
from typing import Any

import pytest

from django_redislock.core.engine.keys import KeySpace
from tests.helpers import module_from_file
from tests.helpers_oracles import wait_until
from tests.servers import free_port
from tests.test_carts_e2e import _postgres_url, needs_pg
from tests.test_example_project import PROJECT, ROOT, _env

WAIT = 30  # bound on every wait
SHOP = "outlived"  # SHOP_REDIS_PREFIX

SEED = """
import django
from django.core.management import call_command

django.setup()
call_command("migrate", verbosity=0)
from shop.models import Product

print(Product.objects.create(name="tea", stock=5).pk)
"""


def _demo() -> ModuleType:
    return module_from_file("example_demo", PROJECT / "demo.py")


def _buy(port: int, pk: int, out: dict[str, Any], name: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    try:
        conn.request("POST", f"/products/{pk}/buy", headers={"Idempotency-Key": "k"})
        reply = conn.getresponse()
        out[name] = (reply.status, reply.getheader("Idempotent-Replayed"), reply.read())
    finally:
        conn.close()


def _count(url: str, query: str, *args: Any) -> int:
    import psycopg

    with psycopg.connect(url, connect_timeout=5) as conn:
        row = conn.execute(query, args).fetchone()
        assert row is not None
        return int(row[0])


@pytest.mark.server
@pytest.mark.slow
@needs_pg
def test_a_purchase_that_outlives_its_lease_is_charged_once(redis_factory, tmp_path):
    demo = _demo()
    server = redis_factory(port=free_port(), unix=False).start()
    redis = server.client()
    name, url = demo.create_postgres_database(_postgres_url())
    env = _env(
        REDIS_URL=server.url,
        DATABASE_URL=url,
        SHOP_REDIS_PREFIX=SHOP,
        DJANGO_SETTINGS_MODULE="example.settings",
        DJANGO_DEBUG="0",
    )
    gunicorn = None
    try:
        seeded = subprocess.run(
            [sys.executable, "-c", SEED],
            env=env,
            cwd=PROJECT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert seeded.returncode == 0, seeded.stdout + seeded.stderr
        pk = int(seeded.stdout.split()[-1])
        port, log = free_port(), tmp_path / "gunicorn.log"
        with log.open("wb") as logfile:
            gunicorn = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gunicorn",
                    "tests.outlived_lease_app:application",
                    "--chdir",
                    str(ROOT),
                    "--bind",
                    f"127.0.0.1:{port}",
                    "--workers",
                    "2",
                    "--threads",
                    "2",
                    "--worker-class",
                    "gthread",
                    "--log-level",
                    "warning",
                ],
                env=env,
                stdout=logfile,
                stderr=subprocess.STDOUT,
            )
        demo.wait_ready(gunicorn, port, log, deadline=60)

        # The key's lease and record, as the shop names them (anonymous: scoped by IP).
        keys = KeySpace(f"{SHOP}:locks").idempotency("ip:127.0.0.1", "k")
        replies: dict[str, Any] = {}
        first = threading.Thread(target=_buy, args=(port, pk, replies, "first"))
        first.start()
        wait_until(lambda: redis.exists(f"{SHOP}:test:paying"), WAIT)  # it is paying
        assert redis.hget(keys.record, "state") == b"running"
        wait_until(lambda: not redis.exists(keys.lease), WAIT)  # and outlived its lease
        _buy(port, pk, replies, "retry")  # answered at once: it does not run
        redis.rpush(f"{SHOP}:test:go", "1")  # the first may finish now
        first.join(WAIT)
        assert not first.is_alive()
        _buy(port, pk, replies, "later")
        _buy(port, pk, replies, "again")
        orders = _count(url, "SELECT count(*) FROM shop_order")
        stock = _count(url, "SELECT stock FROM shop_product WHERE id = %s", pk)
    finally:
        demo.stop_process(gunicorn)
        demo.drop_postgres_database(_postgres_url(), name)
        redis.close()

    # The retry did not run while the first might still; the first found its
    # lease gone before its commit and rolled back (503), freeing the key; the
    # later purchase is the one charged, and the one replayed afterwards.
    status = {n: replies[n][0] for n in ("first", "retry", "later", "again")}
    expected = {"first": 503, "retry": 409, "later": 200, "again": 200}
    assert status == expected, log.read_text()[-3000:]
    assert b"its outcome was not recorded" in replies["retry"][2]  # plain text: no JSON asked for
    assert replies["later"][1] is None
    assert replies["again"][1:] == ("true", replies["later"][2])
    assert (orders, stock) == (1, 4)
