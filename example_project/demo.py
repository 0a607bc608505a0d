#!/usr/bin/env python3
"""Hammer the example shop with concurrent purchases and carts, with and without locks.

    python3 example_project/demo.py
    python3 example_project/demo.py --only carts --postgres postgres://postgres@127.0.0.1/test
    python3 example_project/demo.py --only carts --mysql mysql://root@127.0.0.1:3306/test

On this machine only, and cleaned up afterwards, it:

1. makes sure Django, redis-py, django-redis and gunicorn are importable, or
   creates ``example_project/.venv`` with ``requirements.txt`` (once) and
   re-runs itself there;
2. picks a Redis: ``REDIS_URL`` if set, else one answering on 127.0.0.1:6379
   (used under a key prefix unique to this run; nothing else is touched),
   else a private ``redis-server`` on a free port, stopped at the end;
3. migrates a fresh SQLite database in a temporary directory, or with
   ``--postgres URL`` (``--mysql URL``) a database of its own that it
   creates on that PostgreSQL (MariaDB, MySQL) server and drops at the end,
   and seeds the products;
4. serves the shop with gunicorn (several processes, several threads each)
   on a free loopback port;
5. sends many concurrent purchases to the unsafe endpoint, the locked one and
   the locked async one (fresh stock each time); then purchases retried with
   one ``Idempotency-Key`` each (several copies at once, and one later) to
   the unprotected endpoint and the two ``@idempotent`` ones, counting double
   charges; then concurrent carts over overlapping products listed in random
   orders, mixed with single purchases, to the unsafe checkout and the locked
   one, and carts retried with one key each, counting oversold units,
   answers past the lock's wait, database deadlocks and double charges; then
   many concurrent requests to the throttled report, then runs the restock
   job while another run holds its lock (``--only`` picks some of these);
6. prints what happened, measured in this run.

Exit status: 0 when the locked endpoints sold exactly the stock there was,
every locked cart was answered within its wait, the idempotent endpoints
charged each retried purchase or cart once, and the other guarantees held,
1 when they did not, 2 when the demo could not run.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import importlib.util
import itertools
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

PROJECT_DIR = Path(__file__).resolve().parent
REPO_DIR = PROJECT_DIR.parent
VENV_DIR = PROJECT_DIR / ".venv"
REQUIRED_MODULES = ("django", "redis", "django_redis", "gunicorn")
# With --postgres or --mysql only; requirements.txt leaves them out for SQLite users.
POSTGRES_DRIVER = ("psycopg", "psycopg[binary]>=3.1")
MYSQL_DRIVER = ("MySQLdb", "mysqlclient>=2.2.1")  # built from source: needs the client headers


class DemoError(Exception):
    """The demo could not run (as opposed to: it ran and found a problem)."""


def say(message: str = "") -> None:
    print(message, flush=True)


# -- 1. environment -------------------------------------------------------------------
def missing_modules(*, driver: tuple[str, str] | None = None) -> list[str]:
    wanted = [*REQUIRED_MODULES, driver[0]] if driver else REQUIRED_MODULES
    return [name for name in wanted if importlib.util.find_spec(name) is None]


def ensure_environment(*, driver: tuple[str, str] | None = None) -> None:
    """Return if the requirements import; otherwise re-run inside .venv (made once)."""
    if sys.version_info < (3, 10):  # noqa: UP036  (say so, rather than fail obscurely)
        raise DemoError("Python 3.10 or newer is needed (Django 5.2); run it with python3.10+")
    missing = missing_modules(driver=driver)
    if not missing:
        return
    venv_python = VENV_DIR / "bin" / "python"
    if Path(sys.prefix).resolve() == VENV_DIR.resolve():
        raise DemoError(
            f"{', '.join(missing)} still missing in {VENV_DIR} after installing "
            f"requirements.txt{' and ' + driver[1] if driver else ''}; delete "
            "that directory and run the demo again"
        )
    if not venv_python.exists():
        say(
            f"demo: {', '.join(missing)} not importable here: creating a private "
            f"virtualenv in {VENV_DIR.relative_to(REPO_DIR)}/"
        )
        made = subprocess.run([sys.executable, "-m", "venv", str(VENV_DIR)], check=False)
        if made.returncode != 0 or not venv_python.exists():
            shutil.rmtree(VENV_DIR, ignore_errors=True)
            raise DemoError(
                "could not create a virtualenv; install the venv module "
                "(Debian/Ubuntu: sudo apt-get install python3-venv) or install "
                "example_project/requirements.txt yourself"
            )
    stamp = VENV_DIR / ".requirements-installed"
    requirements = (PROJECT_DIR / "requirements.txt").read_bytes()
    if not stamp.exists() or stamp.read_bytes() != requirements:
        say("demo: installing example_project/requirements.txt into it (once; needs network)")
        # pip reads the "-e .." line relative to the working directory.
        installed = subprocess.run(
            [
                str(venv_python),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--quiet",
                "-r",
                "requirements.txt",
            ],
            cwd=PROJECT_DIR,
            check=False,
        )
        if installed.returncode != 0:
            raise DemoError("pip could not install requirements.txt (see its output above)")
        stamp.write_bytes(requirements)
    has_driver = [str(venv_python), "-c", f"import {driver[0] if driver else 'sys'}"]
    if driver and subprocess.run(has_driver, capture_output=True, check=False).returncode:
        say(f"demo: installing {driver[1]} into it (once)")
        installed = subprocess.run(
            [
                str(venv_python),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--quiet",
                driver[1],
            ],
            check=False,
        )
        if installed.returncode != 0:
            raise DemoError(f"pip could not install {driver[1]} (see its output above)")
    say("demo: continuing inside example_project/.venv")
    os.execv(str(venv_python), [str(venv_python), str(Path(__file__).resolve()), *sys.argv[1:]])


# -- processes we start, and stop by PID ------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


def log_tail(path: Path, size: int = 3000) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-size:]
    return ""


# -- 2. Redis ---------------------------------------------------------------------------
@dataclass
class RedisChoice:
    url: str
    description: str
    shared: bool  # someone else's server: touch only our own keys
    process: subprocess.Popen[bytes] | None = None


def redis_answers(url: str) -> bool:
    import redis

    try:
        with redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1) as client:
            return bool(client.ping())
    except (redis.RedisError, OSError, ValueError):
        return False


def start_private_redis(workdir: Path, deadline: float = 10.0) -> RedisChoice:
    binary = shutil.which("redis-server")
    if binary is None:
        raise DemoError(
            "no Redis to use: REDIS_URL is not set, nothing answers on 127.0.0.1:6379, and "
            "redis-server is not on PATH. Install it (Debian/Ubuntu: sudo apt-get install "
            "redis-server; macOS: brew install redis) or set REDIS_URL=redis://host:port/0"
        )
    port = free_port()
    log = workdir / "redis.log"
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(workdir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            "--logfile",
            str(log),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    give_up = time.monotonic() + deadline
    while not redis_answers(url):
        if proc.poll() is not None or time.monotonic() > give_up:
            stop_process(proc)
            raise DemoError(f"the private redis-server did not start: {log_tail(log)}")
        time.sleep(0.05)
    return RedisChoice(
        url, f"private redis-server on port {port} (stopped at the end)", shared=False, process=proc
    )


def choose_redis(workdir: Path, *, private: bool) -> RedisChoice:
    url = os.environ.get("REDIS_URL")
    if url and not private:
        if not redis_answers(url):
            raise DemoError(f"REDIS_URL={url} does not answer PING; fix it or unset it")
        return RedisChoice(url, f"REDIS_URL ({url})", shared=True)
    local = "redis://127.0.0.1:6379/0"
    if not private and redis_answers(local):
        return RedisChoice(local, "the Redis on 127.0.0.1:6379", shared=True)
    return start_private_redis(workdir)


def delete_own_keys(url: str, prefix: str) -> int:
    """Remove what this run left under its unique prefix (every key has a TTL anyway)."""
    import redis

    with redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2) as client:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=500))
        if keys:
            client.delete(*keys)
        return len(keys)


# -- 3. database ------------------------------------------------------------------------
def create_postgres_database(url: str) -> tuple[str, str]:
    """Create a database of this run's own on the server ``url`` points to.

    Returns its name and its URL; nothing else on that server is touched.
    """
    try:
        import psycopg
        from psycopg import sql
    except ImportError:
        raise DemoError(
            f"--postgres needs psycopg: {sys.executable} -m pip install '{POSTGRES_DRIVER[1]}'"
        ) from None
    name = f"redislock_demo_{secrets.token_hex(4)}"
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.Error as exc:
        raise DemoError(
            f"could not create a database on the server --postgres names ({exc}); "
            "check the URL, and that its user may CREATE DATABASE"
        ) from None
    return name, urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def drop_postgres_database(url: str, name: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        # FORCE: a worker stopped mid-request may leave a session behind.
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def _mysql_connect(url: str) -> Any:
    import MySQLdb

    from example.dburl import parse

    entry = parse(url)
    where = {"unix_socket": entry["HOST"]} if entry["HOST"].startswith("/") else {}
    return MySQLdb.connect(
        host=entry["HOST"] or "localhost",
        port=int(entry["PORT"] or 3306),
        user=entry["USER"],
        password=entry["PASSWORD"],
        connect_timeout=5,
        **where,
    )


def create_mysql_database(url: str) -> tuple[str, str]:
    """``create_postgres_database`` for a MariaDB or MySQL server."""
    try:
        import MySQLdb
    except ImportError:
        raise DemoError(
            f"--mysql needs mysqlclient: {sys.executable} -m pip install '{MYSQL_DRIVER[1]}'"
        ) from None
    name = f"redislock_demo_{secrets.token_hex(4)}"
    try:
        conn = _mysql_connect(url)
        try:
            conn.cursor().execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        finally:
            conn.close()
    except MySQLdb.Error as exc:
        raise DemoError(
            f"could not create a database on the server --mysql names ({exc}); "
            "check the URL, and that its user may CREATE DATABASE"
        ) from None
    return name, urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def drop_mysql_database(url: str, name: str) -> None:
    conn = _mysql_connect(url)
    try:
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        conn.close()


# -- 4. gunicorn -------------------------------------------------------------------------
def start_gunicorn(port: int, workers: int, threads: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "example.wsgi:application",
                "--chdir",
                str(PROJECT_DIR),
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                str(workers),
                "--threads",
                str(threads),
                "--worker-class",
                "gthread",
                "--graceful-timeout",
                "5",
                "--timeout",
                "60",
                "--log-level",
                "warning",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def wait_ready(proc: subprocess.Popen[bytes], port: int, log: Path, deadline: float) -> float:
    started = time.monotonic()
    while True:
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            try:
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    return time.monotonic() - started
            finally:
                conn.close()
        if proc.poll() is not None:
            raise DemoError(f"gunicorn exited with status {proc.returncode}:\n{log_tail(log)}")
        if time.monotonic() - started > deadline:
            raise DemoError(f"gunicorn was not ready after {deadline:.0f} s:\n{log_tail(log)}")
        time.sleep(0.1)


# -- 5. load ------------------------------------------------------------------------------
@dataclass
class Reply:
    status: int
    seconds: float
    headers: dict[str, str]
    index: int = -1  # which request of a plan this answers


@dataclass
class Load:
    replies: list[Reply] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # no HTTP answer at all
    elapsed: float = 0.0  # from the common start to the last answer
    unsent: int = 0  # requests not sent before the deadline


def hammer(
    port: int,
    method: str,
    path: str,
    *,
    total: int,
    clients: int,
    deadline: float,
    label: str,
    sample: Callable[[], None] | None = None,
    plan: Sequence[tuple[str, bytes | None]] | None = None,
) -> Load:
    """Send ``total`` requests from ``clients`` keep-alive connections, all starting together.

    ``plan``, if given, says each request's path and body (``path`` is then
    unused). ``sample`` is called about five times a second while they run.
    """
    load = Load()
    lock = threading.Lock()
    counter = itertools.count()
    start = threading.Barrier(clients + 1)
    stop_at = [float("inf")]
    last = [0.0]

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        with contextlib.suppress(threading.BrokenBarrierError):
            start.wait(30)
        try:
            while time.monotonic() < stop_at[0]:
                with lock:
                    index = next(counter)
                    if index >= total:
                        return
                target, body = plan[index] if plan is not None else (path, None)
                headers = {"Accept": "application/json"}
                if body is not None:
                    headers["Content-Type"] = "application/json"
                sent = time.perf_counter()
                try:
                    conn.request(method, target, body=body, headers=headers)
                    response = conn.getresponse()
                    response.read()
                except (OSError, http.client.HTTPException) as exc:
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                    with lock:
                        load.failures.append(f"{type(exc).__name__}: {exc}")
                    continue
                took = time.perf_counter() - sent
                reply = Reply(response.status, took, dict(response.getheaders()), index)
                with lock:
                    load.replies.append(reply)
                    last[0] = time.monotonic()
        finally:
            conn.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    start.wait(30)
    began = time.monotonic()
    stop_at[0] = began + deadline
    show = sys.stdout.isatty()
    # Requests in flight at the deadline still get their socket timeout.
    give_up = stop_at[0] + 35
    while any(thread.is_alive() for thread in threads) and time.monotonic() < give_up:
        if show:
            done = len(load.replies) + len(load.failures)
            print(f"\r    {label}: {done}/{total}", end="", flush=True)
        if sample is not None:
            sample()
        time.sleep(0.2)
    load.elapsed = max(last[0] - began, 1e-3)
    done = len(load.replies) + len(load.failures)
    load.unsent = total - done
    end = "\r" if show else ""
    say(f"{end}    {label}: {done}/{total} in {load.elapsed:.1f} s")
    return load


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


# -- the scenarios -----------------------------------------------------------------------
def reset_stock(product_id: int, stock: int) -> None:
    from django.db import connection

    from shop.models import Order, Product

    Order.objects.all().delete()
    Product.objects.filter(pk=product_id).update(stock=stock, fence=0)
    connection.close()  # let gunicorn's workers have SQLite to themselves


def purchase_run(
    port: int, path: str, product_id: int, args: argparse.Namespace, *, label: str, locked: bool
) -> dict[str, Any]:
    from django.db import connection

    from django_redislock.connection import get_client
    from django_redislock.core.ops.inspection import list_locks
    from django_redislock.locking.factories import keyspace
    from shop.models import Order, Product

    reset_stock(product_id, args.stock)
    queued = [0]

    def sample() -> None:
        # What an operator sees meanwhile (manage.py redislocks list).
        for row in list_locks(get_client(), keyspace(), f"purchase:{product_id}", literal=True):
            queued[0] = max(queued[0], row.waiters)

    load = hammer(
        port,
        "POST",
        path,
        total=args.purchases,
        clients=args.clients,
        deadline=args.deadline,
        label=label,
        sample=sample if locked else None,
    )
    orders = Order.objects.filter(product_id=product_id).count()
    stock_left = Product.objects.get(pk=product_id).stock
    connection.close()
    ok = [reply for reply in load.replies if reply.status == 200]
    waits = [float(r.headers["X-Lock-Wait-Ms"]) for r in ok if "X-Lock-Wait-Ms" in r.headers]
    times = [reply.seconds * 1000 for reply in ok]
    statuses = [reply.status for reply in load.replies]
    return {
        "path": path,
        "locked": locked,
        "seeded": args.stock,
        "requests": args.purchases,
        "answered": len(load.replies),
        "orders": orders,
        "stock_left": stock_left,
        "oversold": max(0, orders - args.stock),
        # Every unit is either still in stock or in exactly one order.
        "consistent": orders + stock_left == args.stock,
        # Busy past the lock's wait: 409 with Retry-After, from redis_locked.
        "busy_409": statuses.count(409),
        "sold_out_410": statuses.count(410),
        "errors": sum(s not in (200, 409, 410) for s in statuses) + len(load.failures),
        "unsent": load.unsent,
        "lock_wait_ms_p50": percentile(waits, 0.50),
        "lock_wait_ms_p99": percentile(waits, 0.99),
        "response_ms_p50": percentile(times, 0.50),
        "response_ms_p99": percentile(times, 0.99),
        "requests_per_s": len(load.replies) / load.elapsed if load.elapsed else 0.0,
        "max_queued_seen": queued[0],
        "failures": load.failures[:5],
    }


def send_at_once(
    port: int,
    path: str,
    keys: list[str],
    deadline: float,
    bodies: dict[str, bytes] | None = None,
) -> list[Reply | str]:
    """One POST per key (a key may repeat), each on its own connection, all at one instant.

    ``bodies`` gives a key's body (a retry sends the same bytes again).
    Returns, in the order of ``keys``, each reply or the error that stood in
    for one.
    """
    out: list[Reply | str] = ["not sent"] * len(keys)
    start = threading.Barrier(len(keys) + 1)

    def client(index: int, key: str) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=deadline)
        try:
            with contextlib.suppress(threading.BrokenBarrierError):
                start.wait(deadline)
            sent = time.perf_counter()
            conn.request(
                "POST",
                path,
                body=(bodies or {}).get(key, b'{"quantity": 1}'),
                headers={
                    "Accept": "application/json",
                    "Content-Type": "application/json",
                    "Idempotency-Key": key,
                },
            )
            response = conn.getresponse()
            response.read()
            took = time.perf_counter() - sent
            out[index] = Reply(response.status, took, dict(response.getheaders()))
        except (OSError, http.client.HTTPException) as exc:
            out[index] = f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()

    threads = [
        threading.Thread(target=client, args=(i, key), daemon=True) for i, key in enumerate(keys)
    ]
    for thread in threads:
        thread.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        start.wait(deadline)
    for thread in threads:
        thread.join(deadline + 5)
    return out


def retry_run(
    port: int, path: str, product_id: int, args: argparse.Namespace, *, protected: bool
) -> dict[str, Any]:
    """Each of ``--retry-keys`` purchases sent ``--retry-copies`` times at once
    (a client retrying over a flaky network), then once more afterwards."""
    from django.db import connection

    from shop.models import Order

    copies, keys = args.retry_copies, [secrets.token_hex(8) for _ in range(args.retry_keys)]
    # Stock for every request, so that selling out never hides a double charge.
    reset_stock(product_id, len(keys) * (copies + 1))
    at_once = send_at_once(port, path, [key for key in keys for _ in range(copies)], args.deadline)
    later = send_at_once(port, path, keys, args.deadline)
    orders = Order.objects.filter(product_id=product_id).count()
    connection.close()
    replies = [reply for reply in at_once + later if isinstance(reply, Reply)]
    replayed = [r for r in replies if r.headers.get("Idempotent-Replayed") == "true"]
    statuses = [reply.status for reply in replies]
    ran = [r for r in replies if r.status == 200 and r not in replayed]
    say(f"    {'protected' if protected else 'control':<12} {path}: {len(replies)} answers")
    return {
        "path": path,
        "protected": protected,
        "purchases": len(keys),
        "requests": len(keys) * (copies + 1),
        "orders": orders,
        # Every purchase should be charged once: anything more is charged twice.
        "double_charges": max(0, orders - len(keys)),
        "ran_200": len(ran),
        "in_progress_409": statuses.count(409),
        "replayed": len(replayed),
        "later_replayed": sum(
            isinstance(r, Reply) and r.headers.get("Idempotent-Replayed") == "true" for r in later
        ),
        "errors": sum(s not in (200, 409) for s in statuses) + len(at_once + later) - len(replies),
        "failures": [r for r in at_once + later if not isinstance(r, Reply)][:5],
    }


# -- carts -----------------------------------------------------------------------------
def reset_products(product_ids: list[int], stock: int) -> None:
    from django.db import connection

    from shop.models import Order, Product

    Order.objects.all().delete()
    Product.objects.filter(pk__in=product_ids).update(stock=stock, fence=0)
    connection.close()


def postgres_deadlocks() -> int | None:
    """Deadlocks PostgreSQL has detected in this run's database; None elsewhere.

    MariaDB and MySQL count deadlocks only for the whole server, other
    clients' included: there a deadlocked request shows as a 500 alone.

    A server process reports its counts as it exits, and gunicorn's end with
    each request (``CONN_MAX_AGE`` is 0): so first wait until no other
    session is left on the database.
    """
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    give_up = time.monotonic() + 10
    with connection.cursor() as cursor:
        while time.monotonic() < give_up:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            if cursor.fetchone()[0] == 0:
                break
            time.sleep(0.05)
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        count = int(cursor.fetchone()[0])
    connection.close()
    return count


def cart_plan(
    product_ids: list[int], total: int, seed: int, *, cart_path: str, single_path: str
) -> list[tuple[str, bytes | None]]:
    """Carts of 2 to 4 of the products, each listing them in a random order;
    every fourth request a single purchase of one product instead."""
    rng = random.Random(seed)
    plan: list[tuple[str, bytes | None]] = []
    for index in range(total):
        if index % 4 == 3:
            plan.append((single_path.format(rng.choice(product_ids)), None))
        else:
            cart = rng.sample(product_ids, rng.randint(2, min(4, len(product_ids))))
            plan.append((cart_path, json.dumps({"products": cart}).encode()))
    return plan


def units_of(request: tuple[str, bytes | None]) -> int:
    body = request[1]
    return 1 if body is None else len(json.loads(body)["products"])


def cart_run(
    port: int,
    product_ids: list[int],
    args: argparse.Namespace,
    *,
    cart_path: str,
    single_path: str,
    protected: bool,
) -> dict[str, Any]:
    from django.conf import settings
    from django.db import connection

    from shop.models import Order, Product

    reset_products(product_ids, args.cart_stock)
    deadlocks_before = postgres_deadlocks()
    plan = cart_plan(
        product_ids, args.carts, args.seed, cart_path=cart_path, single_path=single_path
    )
    load = hammer(
        port,
        "POST",
        cart_path,
        total=len(plan),
        clients=args.cart_clients,
        deadline=args.deadline,
        label=f"{'locked' if protected else 'unsafe':<12} {cart_path}",
        plan=plan,
    )
    deadlocks_after = postgres_deadlocks()
    per_product = {}
    for pk in product_ids:
        orders = Order.objects.filter(product_id=pk).count()
        left = Product.objects.get(pk=pk).stock
        # Units sold that the stock never had: a lost update leaves stock
        # behind for units already sold, so count those too.
        per_product[str(pk)] = {
            "orders": orders,
            "stock_left": left,
            "oversold": max(0, orders + left - args.cart_stock),
        }
    orders_total = Order.objects.filter(product_id__in=product_ids).count()
    connection.close()
    statuses = [reply.status for reply in load.replies]
    ok = [reply for reply in load.replies if reply.status == 200]
    waits = [float(r.headers["X-Lock-Wait-Ms"]) for r in ok if "X-Lock-Wait-Ms" in r.headers]
    times = [reply.seconds for reply in load.replies]
    return {
        "cart_path": cart_path,
        "single_path": single_path,
        "protected": protected,
        "requests": len(plan),
        "carts": sum(body is not None for _, body in plan),
        "answered": len(load.replies),
        "seeded": args.cart_stock,
        "per_product": per_product,
        "oversold": sum(p["oversold"] for p in per_product.values()),
        "products_oversold": sum(p["oversold"] > 0 for p in per_product.values()),
        "consistent": all(
            p["orders"] + p["stock_left"] == args.cart_stock for p in per_product.values()
        ),
        # All or nothing: the orders are exactly the units of the carts and
        # purchases that were answered 200, never part of a cart.
        "orders": orders_total,
        "orders_match_answers": orders_total == sum(units_of(plan[r.index]) for r in ok),
        "ok_200": len(ok),
        "sold_out_410": statuses.count(410),
        "busy_409": statuses.count(409),
        "server_errors_5xx": sum(s >= 500 for s in statuses),
        "errors": sum(s not in (200, 409, 410) and s < 500 for s in statuses) + len(load.failures),
        "unsent": load.unsent,
        "deadlocks": (
            None if deadlocks_after is None else deadlocks_after - (deadlocks_before or 0)
        ),
        "lock_wait_s": settings.REDISLOCK["WAIT"],
        "slowest_s": max(times, default=0.0),
        "lock_wait_ms_p50": percentile(waits, 0.50),
        "lock_wait_ms_p99": percentile(waits, 0.99),
        "response_ms_p50": percentile([t * 1000 for t in times], 0.50),
        "response_ms_p99": percentile([t * 1000 for t in times], 0.99),
        "failures": load.failures[:5],
    }


def cart_retry_run(
    port: int, product_ids: list[int], args: argparse.Namespace, *, path: str, protected: bool
) -> dict[str, Any]:
    """Each of ``--cart-retry-keys`` carts (three products, in a random order)
    sent ``--retry-copies`` times at once with one key, then once more.

    The later retries go one at a time: a client retrying after a timeout,
    which no row lock of another copy can stop.
    """
    from django.db import connection

    from shop.models import Order

    rng = random.Random(args.seed + 1)
    size = min(3, len(product_ids))
    keys = [secrets.token_hex(8) for _ in range(args.cart_retry_keys)]
    bodies = {key: json.dumps({"products": rng.sample(product_ids, size)}).encode() for key in keys}
    copies = args.retry_copies
    reset_products(product_ids, len(keys) * (copies + 1))  # never sold out
    deadlocks_before = postgres_deadlocks()
    sent = [key for key in keys for _ in range(copies)]
    at_once = send_at_once(port, path, sent, args.deadline, bodies)
    later = [send_at_once(port, path, [key], args.deadline, bodies)[0] for key in keys]
    deadlocks_after = postgres_deadlocks()
    orders = Order.objects.filter(product_id__in=product_ids).count()
    connection.close()
    replies = [reply for reply in at_once + later if isinstance(reply, Reply)]
    replayed = [r for r in replies if r.headers.get("Idempotent-Replayed") == "true"]
    statuses = [reply.status for reply in replies]
    say(f"    {'protected' if protected else 'control':<12} {path}: {len(replies)} answers")
    # A charge is a cart that ran and answered 200 (not a replay of one).
    charges = dict.fromkeys(keys, 0)
    for key, reply in zip(sent + keys, at_once + later, strict=True):
        replay = isinstance(reply, Reply) and reply.headers.get("Idempotent-Replayed") == "true"
        if isinstance(reply, Reply) and reply.status == 200 and not replay:
            charges[key] += 1
    return {
        "path": path,
        "protected": protected,
        "carts": len(keys),
        "cart_size": size,
        "requests": len(keys) * (copies + 1),
        "orders": orders,
        # All or nothing: the orders are exactly the carts charged, whole.
        "orders_match_answers": orders == size * sum(charges.values()),
        "carts_charged": sum(charges.values()),
        # Every cart charged more than once, counted once per extra charge.
        "double_charges": sum(max(0, n - 1) for n in charges.values()),
        "ran_200": sum(r.status == 200 for r in replies) - len(replayed),
        "in_progress_409": statuses.count(409),
        "replayed": len(replayed),
        "later_replayed": sum(
            isinstance(r, Reply) and r.headers.get("Idempotent-Replayed") == "true" for r in later
        ),
        "server_errors_5xx": sum(s >= 500 for s in statuses),
        "errors": sum(s not in (200, 409) for s in statuses) + len(at_once + later) - len(replies),
        "deadlocks": (
            None if deadlocks_after is None else deadlocks_after - (deadlocks_before or 0)
        ),
        "failures": [r for r in at_once + later if not isinstance(r, Reply)][:5],
    }


def report_run(port: int, args: argparse.Namespace) -> dict[str, Any]:
    from django.conf import settings

    rule = settings.REDISLOCK["THROTTLE"][0]
    load = hammer(
        port,
        "GET",
        "/reports/sales",
        total=args.reports,
        clients=args.report_clients,
        deadline=args.deadline,
        label="throttled report",
    )
    admitted = [reply for reply in load.replies if reply.status == 200]
    throttled = [reply for reply in load.replies if reply.status == 503]
    return {
        "limit": rule["limit"],
        "requests": args.reports,
        "ok_200": len(admitted),
        "throttled_503": len(throttled),
        "throttled_with_retry_after": sum("Retry-After" in r.headers for r in throttled),
        "errors": len(load.replies) - len(admitted) - len(throttled) + len(load.failures),
        "unsent": load.unsent,
        # Each admitted report says how many were running when it began (counted
        # in Redis across workers): the highest of those is the peak.
        "max_in_flight": max((int(r.headers.get("X-In-Flight", 0)) for r in admitted), default=0),
        "requests_per_s": len(load.replies) / load.elapsed if load.elapsed else 0.0,
    }


def run_restock() -> str:
    done = subprocess.run(
        [sys.executable, str(PROJECT_DIR / "manage.py"), "restock", "--level", "100"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise DemoError(f"manage.py restock failed:\n{done.stdout}{done.stderr}")
    return done.stdout.strip()


def restock_run() -> dict[str, Any]:
    """Run the job while another run holds its lock, then again once it is free."""
    from django_redislock import get_lock

    # This handle stands in for a previous run that is still going.
    with get_lock("job:restock", timeout=60, wait=0):
        while_held = run_restock()
    after = run_restock()
    return {
        "while_held": while_held,
        "after": after,
        "skipped_while_held": "skipped" in while_held,
        "ran_after": after.startswith("Restocked"),
    }


# -- 6. output -------------------------------------------------------------------------
def fmt_pair(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "-"
    return f"{a:.0f} / {b:.0f}"


def table(runs: dict[str, dict[str, Any]], rows: list[tuple[str, Any]], width: int = 30) -> None:
    say(f"  {'':<{width}}" + "".join(f"{name:>14}" for name in runs))
    for title, get in rows:
        say(f"  {title:<{width}}" + "".join(f"{get(run)!s:>14}" for run in runs.values()))


def print_results(results: dict[str, Any], args: argparse.Namespace) -> None:
    if "purchases" in results:
        say()
        say(
            f"Purchases: {args.purchases} requests from {args.clients} concurrent clients "
            f"for {args.stock} units of one product"
        )
        table(
            results["purchases"],
            [
                ("orders created", lambda r: r["orders"]),
                ("stock left", lambda r: r["stock_left"]),
                ("oversold", lambda r: r["oversold"]),
                ("stock + orders = seeded", lambda r: "yes" if r["consistent"] else "NO"),
                ("409 busy", lambda r: r["busy_409"]),
                ("410 sold out", lambda r: r["sold_out_410"]),
                ("errors", lambda r: r["errors"] + r["unsent"]),
                (
                    "lock wait p50 / p99 ms",
                    lambda r: fmt_pair(r["lock_wait_ms_p50"], r["lock_wait_ms_p99"]),
                ),
                (
                    "response p50 / p99 ms",
                    lambda r: fmt_pair(r["response_ms_p50"], r["response_ms_p99"]),
                ),
                ("requests/s", lambda r: f"{r['requests_per_s']:.0f}"),
                (
                    "most queued for the lock",
                    lambda r: r["max_queued_seen"] if r["locked"] else "-",
                ),
            ],
            width=26,
        )
    if "retries" in results:
        say()
        say(
            f"Retried purchases: {args.retry_keys} purchases, each sent {args.retry_copies} "
            "times at once with one Idempotency-Key, then once more afterwards"
        )
        table(
            results["retries"],
            [
                ("orders created", lambda r: r["orders"]),
                ("double charges", lambda r: r["double_charges"]),
                ("ran (200)", lambda r: r["ran_200"]),
                ("409 still running", lambda r: r["in_progress_409"]),
                ("replayed", lambda r: r["replayed"]),
                ("errors", lambda r: r["errors"]),
            ],
            width=26,
        )
    if "carts" in results:
        print_carts(results, args)
    if "reports" in results:
        rep = results["reports"]
        say()
        say(
            f"Throttled report (GET /reports/sales, limit {rep['limit']} at once): "
            f"{rep['requests']} requests from {args.report_clients} concurrent clients"
        )
        say(
            f"  200 ok {rep['ok_200']}, 503 throttled {rep['throttled_503']} "
            f"({rep['throttled_with_retry_after']} with Retry-After), errors {rep['errors']}; "
            f"most running at once: {rep['max_in_flight']}"
        )
    if "restock" in results:
        job = results["restock"]
        say()
        say('Restock job (manage.py restock, @redis_locked(..., on_busy="skip")):')
        say(f"  while another run holds its lock: {job['while_held']}")
        say(f"  once it is free:                  {job['after']}")


def deadlocks(run: dict[str, Any]) -> str:
    # Counted per database on PostgreSQL only; MariaDB counts them server-wide.
    return "not counted" if run["deadlocks"] is None else str(run["deadlocks"])


def print_carts(results: dict[str, Any], args: argparse.Namespace) -> None:
    carts = results["carts"]
    wait = next(iter(carts.values()))["lock_wait_s"]
    say()
    say(
        f"Carts: {args.carts} requests from {args.cart_clients} concurrent clients over "
        f"{args.cart_products} products of {args.cart_stock} units each; 2 to 4 products a "
        "cart, listed in a random order, and every fourth request a single purchase"
    )
    table(
        carts,
        [
            ("oversold (units, all products)", lambda r: r["oversold"]),
            ("products oversold", lambda r: r["products_oversold"]),
            ("stock + orders = seeded", lambda r: "yes" if r["consistent"] else "NO"),
            ("orders = units answered 200", lambda r: "yes" if r["orders_match_answers"] else "NO"),
            ("200 bought", lambda r: r["ok_200"]),
            ("410 sold out, nothing bought", lambda r: r["sold_out_410"]),
            (f"409 busy past the {wait:g} s wait", lambda r: r["busy_409"]),
            ("no answer, or not sent in time", lambda r: r["errors"] + r["unsent"]),
            ("5xx errors", lambda r: r["server_errors_5xx"]),
            ("database deadlocks", deadlocks),
            ("slowest answer (s)", lambda r: f"{r['slowest_s']:.2f}"),
            (
                "response p50 / p99 ms",
                lambda r: fmt_pair(r["response_ms_p50"], r["response_ms_p99"]),
            ),
        ],
    )
    retries = results["cart_retries"]
    size = next(iter(retries.values()))["cart_size"]
    say()
    say(
        f"Retried carts: {args.cart_retry_keys} carts of {size} products in a random order, "
        f"each sent {args.retry_copies} times at once with one Idempotency-Key, then once more"
    )
    table(
        retries,
        [
            ("orders created", lambda r: r["orders"]),
            ("carts charged", lambda r: r["carts_charged"]),
            (
                "orders = carts charged, whole",
                lambda r: "yes" if r["orders_match_answers"] else "NO",
            ),
            ("double charges", lambda r: r["double_charges"]),
            ("ran (200)", lambda r: r["ran_200"]),
            ("409 still running", lambda r: r["in_progress_409"]),
            ("replayed", lambda r: r["replayed"]),
            ("5xx errors", lambda r: r["server_errors_5xx"]),
            ("database deadlocks", deadlocks),
        ],
    )
    say()
    say(f"  Control (no lock, no @idempotent) on {results['database']}: {cart_control(results)}")


def cart_control(results: dict[str, Any]) -> str:
    """What went wrong without the lock and @idempotent, in words."""
    unsafe, unprotected = results["carts"]["unsafe"], results["cart_retries"]["unprotected"]
    found = []
    if unsafe["oversold"]:
        found.append(
            f"oversold {unsafe['oversold']} units of {unsafe['products_oversold']} products"
        )
    if unprotected["double_charges"]:
        found.append(f"charged retried carts {unprotected['double_charges']} extra times")
    deadlocked = (unsafe["deadlocks"] or 0) + (unprotected["deadlocks"] or 0)
    errors = unsafe["server_errors_5xx"] + unprotected["server_errors_5xx"]
    if deadlocked:
        found.append(f"hit {deadlocked} database deadlocks ({errors} answers were 500)")
    elif errors:
        found.append(f"{errors} answers were 500 (deadlocks are counted on PostgreSQL only)")
    if results["database"] == "sqlite":
        found.append(
            "SQLite takes one writer at a time, so it cannot deadlock: --postgres or "
            "--mysql shows that"
        )
    return "; ".join(found) if found else "no failure seen in this run"


def verdict(results: dict[str, Any]) -> list[str]:
    problems = []
    for name, run in results.get("purchases", {}).items():
        if not run["locked"]:
            continue
        if run["oversold"]:
            problems.append(f"{name}: oversold {run['oversold']} units")
        if not run["consistent"]:
            problems.append(f"{name}: stock + orders != seeded stock")
        if run["errors"] or run["unsent"]:
            problems.append(
                f"{name}: {run['errors'] + run['unsent']} requests failed {run['failures']}"
            )
    for name, run in results.get("retries", {}).items():
        if not run["protected"]:
            continue
        if run["double_charges"] or run["orders"] != run["purchases"]:
            problems.append(
                f"retries {name}: {run['orders']} orders for {run['purchases']} purchases"
            )
        if run["errors"]:
            problems.append(f"retries {name}: {run['errors']} requests failed {run['failures']}")
        if run["later_replayed"] != run["purchases"]:
            problems.append(
                f"retries {name}: {run['later_replayed']} of {run['purchases']} later retries "
                "were replayed"
            )
    for name, run in results.get("carts", {}).items():
        if not run["protected"]:
            continue
        if run["oversold"] or not run["consistent"]:
            problems.append(f"carts {name}: oversold {run['per_product']}")
        if not run["orders_match_answers"]:
            problems.append(f"carts {name}: orders are not the units of the carts sold")
        # Every cart answers within its wait: a 409 means one stayed busy all of it.
        stuck = run["busy_409"] + run["errors"] + run["unsent"] + run["server_errors_5xx"]
        if stuck or run["deadlocks"]:
            problems.append(
                f"carts {name}: {run['busy_409']} busy past the wait, "
                f"{run['server_errors_5xx']} 5xx, {run['errors'] + run['unsent']} unanswered, "
                f"{run['deadlocks']} deadlocks {run['failures']}"
            )
    for name, run in results.get("cart_retries", {}).items():
        if not run["protected"]:
            continue
        if (
            run["double_charges"]
            or run["orders"] != run["carts"] * run["cart_size"]
            or not run["orders_match_answers"]
        ):
            problems.append(
                f"cart retries {name}: {run['orders']} orders for {run['carts']} carts "
                f"of {run['cart_size']}"
            )
        if run["errors"] or run["later_replayed"] != run["carts"]:
            problems.append(
                f"cart retries {name}: {run['errors']} requests failed {run['failures']}, "
                f"{run['later_replayed']} of {run['carts']} later retries replayed"
            )
    rep = results.get("reports")
    if rep is not None:
        if rep["max_in_flight"] > rep["limit"]:
            problems.append(f"report: {rep['max_in_flight']} ran at once, limit {rep['limit']}")
        if rep["errors"] or rep["unsent"]:
            problems.append(f"report: {rep['errors'] + rep['unsent']} requests failed")
    job = results.get("restock")
    if job is not None and not (job["skipped_while_held"] and job["ran_after"]):
        problems.append(f"restock: expected skip then run, got {job}")
    return problems


# -- main ------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stock", type=int, default=30, help="units seeded per run (30)")
    parser.add_argument(
        "--purchases", type=int, default=120, help="purchase requests per run (120)"
    )
    parser.add_argument("--clients", type=int, default=16, help="concurrent purchase clients (16)")
    parser.add_argument(
        "--retry-keys", type=int, default=10, help="purchases retried with one key each (10)"
    )
    parser.add_argument(
        "--retry-copies", type=int, default=4, help="copies of each sent at once (4)"
    )
    parser.add_argument("--carts", type=int, default=80, help="cart requests per run (80)")
    parser.add_argument("--cart-clients", type=int, default=12, help="concurrent cart clients (12)")
    parser.add_argument(
        "--cart-products", type=int, default=4, help="products the carts choose from (4)"
    )
    parser.add_argument(
        "--cart-stock", type=int, default=25, help="units seeded per cart product (25)"
    )
    parser.add_argument(
        "--cart-retry-keys", type=int, default=8, help="carts retried with one key each (8)"
    )
    parser.add_argument(
        "--seed", type=int, default=1, help="seed of the carts' random contents and order (1)"
    )
    parser.add_argument("--reports", type=int, default=24, help="report requests (24)")
    parser.add_argument(
        "--report-clients", type=int, default=8, help="concurrent report clients (8)"
    )
    parser.add_argument("--workers", type=int, default=3, help="gunicorn processes (3)")
    parser.add_argument("--threads", type=int, default=4, help="threads per process (4)")
    parser.add_argument(
        "--deadline",
        type=float,
        default=30.0,
        help="seconds allowed for each batch of requests (30)",
    )
    parser.add_argument(
        "--private-redis",
        action="store_true",
        help="always start a private redis-server, even if one answers",
    )
    parser.add_argument(
        "--postgres",
        metavar="URL",
        help="run on PostgreSQL: create a database of the run's own on the server URL "
        "names (postgres://user@host:5432/dbname) and drop it at the end "
        "(default: SQLite in a temporary directory)",
    )
    parser.add_argument(
        "--mysql",
        metavar="URL",
        help="run on MariaDB or MySQL, as --postgres does (mysql://user@host:3306/dbname; "
        "?isolation_level=repeatable+read for another level than READ COMMITTED)",
    )
    parser.add_argument(
        "--only",
        type=scenario_list,
        default=list(SCENARIOS),
        metavar="LIST",
        help=f"run only these, comma-separated ({','.join(SCENARIOS)})",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the results to FILE")
    args = parser.parse_args(argv)
    if args.postgres and args.mysql:
        parser.error("--postgres and --mysql: choose one database")
    if args.cart_products < 2:
        parser.error("--cart-products must be 2 or more: a cart needs two products")
    return args


SCENARIOS = ("purchases", "retries", "carts", "reports", "restock")


def scenario_list(value: str) -> list[str]:
    chosen = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in SCENARIOS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"{','.join(unknown) or value!r}: choose among {','.join(SCENARIOS)}"
        )
    return [name for name in SCENARIOS if name in chosen]


@contextlib.contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    # SIGTERM becomes SystemExit so that every finally below runs: the
    # processes we started are stopped by their PIDs whatever ends the demo.
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace) -> int:
    for path in (str(REPO_DIR), str(PROJECT_DIR)):  # the checkout's library, then the project
        if path not in sys.path:
            sys.path.insert(0, path)
    workdir = Path(tempfile.mkdtemp(prefix="redislock-demo-"))
    prefix = f"demo-{secrets.token_hex(4)}"
    redis_choice: RedisChoice | None = None
    gunicorn: subprocess.Popen[bytes] | None = None
    server_database: tuple[Callable[[str, str], None], str, str] | None = None  # drop, URL, name
    started = time.monotonic()
    steps = 3 + len(args.only)
    step = itertools.count(1)

    def heading(text: str) -> None:
        say(f"[{next(step)}/{steps}] {text}")

    try:
        heading("Redis")
        redis_choice = choose_redis(workdir, private=args.private_redis)
        say(f"    using {redis_choice.description}, keys under {prefix}:")
        if args.postgres:
            name, database_url = create_postgres_database(args.postgres)
            server_database = (drop_postgres_database, args.postgres, name)
            database = f"PostgreSQL database {name} (dropped at the end)"
        elif args.mysql:
            name, database_url = create_mysql_database(args.mysql)
            server_database = (drop_mysql_database, args.mysql, name)
            database = f"MariaDB/MySQL database {name} (dropped at the end)"
        else:
            database_url = f"sqlite:///{workdir / 'db.sqlite3'}"
            database = f"fresh SQLite in {workdir}"
        os.environ.update(
            {
                "DJANGO_SETTINGS_MODULE": "example.settings",
                "DATABASE_URL": database_url,
                "REDIS_URL": redis_choice.url,
                "SHOP_REDIS_PREFIX": prefix,
                "DJANGO_DEBUG": "0",
                "PYTHONPATH": os.pathsep.join(
                    [str(REPO_DIR), str(PROJECT_DIR), os.environ.get("PYTHONPATH", "")]
                ).rstrip(os.pathsep),
            }
        )

        heading(f"Database: {database}")
        import django
        from django.core.management import call_command

        django.setup()
        from django.db import connection

        from shop.models import Product

        call_command("migrate", verbosity=0, interactive=False)
        product = Product.objects.create(name="Limited print", stock=args.stock)
        cart_products = [
            Product.objects.create(name=f"Cart item {i}", stock=args.cart_stock).pk
            for i in range(1, args.cart_products + 1)
        ]
        connection.close()

        port = free_port()
        heading(f"gunicorn: {args.workers} processes x {args.threads} threads on 127.0.0.1:{port}")
        log = workdir / "gunicorn.log"
        gunicorn = start_gunicorn(port, args.workers, args.threads, log)
        ready = wait_ready(gunicorn, port, log, deadline=60)
        say(f"    ready in {ready:.1f} s")

        results: dict[str, Any] = {
            "database": connection.vendor,  # sqlite, postgresql or mysql (MariaDB too)
            "server_database": server_database[2] if server_database else None,
            "scenarios": args.only,
        }
        if "purchases" in args.only:
            heading("Concurrent purchases (fresh stock for each endpoint)")
            results["purchases"] = {
                name: purchase_run(
                    port, path, product.pk, args, label=f"{name:<12} {path}", locked=locked
                )
                for name, path, locked in (
                    ("unsafe", f"/unsafe/products/{product.pk}/buy", False),
                    ("locked", f"/products/{product.pk}/buy", True),
                    ("locked async", f"/async/products/{product.pk}/buy", True),
                )
            }
        if "retries" in args.only:
            heading("Retried purchases with an Idempotency-Key (fresh stock for each endpoint)")
            results["retries"] = {
                name: retry_run(port, path, product.pk, args, protected=protected)
                for name, path, protected in (
                    ("unprotected", f"/unsafe/products/{product.pk}/buy", False),
                    ("idempotent", f"/products/{product.pk}/buy", True),
                    ("idem. async", f"/async/products/{product.pk}/buy", True),
                )
            }
        if "carts" in args.only:
            heading("Concurrent carts, then retried carts (fresh stock for each endpoint)")
            results["carts"] = {
                name: cart_run(
                    port,
                    cart_products,
                    args,
                    cart_path=cart_path,
                    single_path=single_path,
                    protected=protected,
                )
                for name, cart_path, single_path, protected in (
                    ("unsafe", "/unsafe/checkout", "/unsafe/products/{}/buy", False),
                    ("locked", "/checkout", "/products/{}/buy", True),
                )
            }
            results["cart_retries"] = {
                name: cart_retry_run(port, cart_products, args, path=path, protected=protected)
                for name, path, protected in (
                    ("unprotected", "/unsafe/checkout", False),
                    ("idempotent", "/checkout", True),
                )
            }
        if "reports" in args.only:
            heading("Concurrent reports through the throttle")
            results["reports"] = report_run(port, args)
        if "restock" in args.only:
            heading("Restock job")
            results["restock"] = restock_run()

        results["seconds"] = time.monotonic() - started
        print_results(results, args)
        problems = verdict(results)
        if args.json:
            Path(args.json).write_text(json.dumps({**results, "problems": problems}, indent=2))
        say()
        if problems:
            say("FAILED: " + "; ".join(problems))
            return 1
        say(
            "OK: the locked endpoints sold exactly the stock there was, every cart was "
            "answered within its wait, and retried purchases and carts were charged once "
            f"({time.monotonic() - started:.0f} s in all)."
        )
        return 0
    finally:
        stop_process(gunicorn)
        if server_database is not None:
            if "django.db" in sys.modules:
                from django.db import connections

                connections.close_all()
            drop, url, name = server_database
            try:
                drop(url, name)
            except Exception as exc:
                say(f"demo: could not drop the database {name}: {exc}; drop it by hand")
        if redis_choice is not None:
            if redis_choice.shared:
                with contextlib.suppress(Exception):
                    delete_own_keys(redis_choice.url, prefix)
            stop_process(redis_choice.process)
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        ensure_environment(
            driver=POSTGRES_DRIVER if args.postgres else MYSQL_DRIVER if args.mysql else None
        )
        with terminate_on_sigterm():
            return run(args)
    except DemoError as exc:
        say(f"demo: {exc}")
        return 2
    except KeyboardInterrupt:
        say("\ndemo: interrupted; stopped everything it had started")
        return 130


if __name__ == "__main__":
    sys.exit(main())
