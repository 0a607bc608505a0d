#!/usr/bin/env python3
"""Hammer the example shop with concurrent purchases, with and without a lock.

    python3 example_project/demo.py

On this machine only, and cleaned up afterwards, it:

1. makes sure Django, redis-py, django-redis and gunicorn are importable, or
   creates ``example_project/.venv`` with ``requirements.txt`` (once) and
   re-runs itself there;
2. picks a Redis: ``REDIS_URL`` if set, else one answering on 127.0.0.1:6379
   (used under a key prefix unique to this run; nothing else is touched),
   else a private ``redis-server`` on a free port, stopped at the end;
3. migrates a fresh SQLite database in a temporary directory and seeds one
   product;
4. serves the shop with gunicorn (several processes, several threads each)
   on a free loopback port;
5. sends many concurrent purchases to the unsafe endpoint, the locked one and
   the locked async one (fresh stock each time); then purchases retried with
   one ``Idempotency-Key`` each (several copies at once, and one later) to
   the unprotected endpoint and the two ``@idempotent`` ones, counting double
   charges; then many concurrent requests to the throttled report, then runs
   the restock job while another run holds its lock;
6. prints what happened, measured in this run.

Exit status: 0 when the locked endpoints sold exactly the stock there was,
the idempotent ones charged each retried purchase once, and the other
guarantees held, 1 when they did not, 2 when the demo could not run.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import importlib.util
import itertools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROJECT_DIR = Path(__file__).resolve().parent
REPO_DIR = PROJECT_DIR.parent
VENV_DIR = PROJECT_DIR / ".venv"
REQUIRED_MODULES = ("django", "redis", "django_redis", "gunicorn")


class DemoError(Exception):
    """The demo could not run (as opposed to: it ran and found a problem)."""


def say(message: str = "") -> None:
    print(message, flush=True)


# -- 1. environment -------------------------------------------------------------------
def missing_modules() -> list[str]:
    return [name for name in REQUIRED_MODULES if importlib.util.find_spec(name) is None]


def ensure_environment() -> None:
    """Return if the requirements import; otherwise re-run inside .venv (made once)."""
    if sys.version_info < (3, 10):  # noqa: UP036  (say so, rather than fail obscurely)
        raise DemoError("Python 3.10 or newer is needed (Django 5.2); run it with python3.10+")
    missing = missing_modules()
    if not missing:
        return
    venv_python = VENV_DIR / "bin" / "python"
    if Path(sys.prefix).resolve() == VENV_DIR.resolve():
        raise DemoError(
            f"{', '.join(missing)} still missing in {VENV_DIR} after installing "
            f"requirements.txt; delete that directory and run the demo again"
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
) -> Load:
    """Send ``total`` requests from ``clients`` keep-alive connections, all starting together.

    ``sample`` is called about five times a second while they run.
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
                    if next(counter) >= total:
                        return
                sent = time.perf_counter()
                try:
                    conn.request(method, path, headers={"Accept": "application/json"})
                    response = conn.getresponse()
                    response.read()
                except (OSError, http.client.HTTPException) as exc:
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                    with lock:
                        load.failures.append(f"{type(exc).__name__}: {exc}")
                    continue
                took = time.perf_counter() - sent
                reply = Reply(response.status, took, dict(response.getheaders()))
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
    from django_redislock.core.inspect import list_locks
    from django_redislock.locks import keyspace
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


def send_at_once(port: int, path: str, keys: list[str], deadline: float) -> list[Reply | str]:
    """One POST per key (a key may repeat), each on its own connection, all at one instant.

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
                body=b'{"quantity": 1}',
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


def print_results(results: dict[str, Any], args: argparse.Namespace) -> None:
    runs = results["purchases"]
    names = list(runs)
    say()
    say(
        f"Purchases: {args.purchases} requests from {args.clients} concurrent clients "
        f"for {args.stock} units of one product"
    )
    say(f"  {'':<26}" + "".join(f"{name:>14}" for name in names))
    rows: list[tuple[str, Any]] = [
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
        ("response p50 / p99 ms", lambda r: fmt_pair(r["response_ms_p50"], r["response_ms_p99"])),
        ("requests/s", lambda r: f"{r['requests_per_s']:.0f}"),
        ("most queued for the lock", lambda r: r["max_queued_seen"] if r["locked"] else "-"),
    ]
    for title, get in rows:
        say(f"  {title:<26}" + "".join(f"{get(runs[name])!s:>14}" for name in names))
    retries = results["retries"]
    say()
    say(
        f"Retried purchases: {args.retry_keys} purchases, each sent {args.retry_copies} times at "
        "once with one Idempotency-Key, then once more afterwards"
    )
    say(f"  {'':<26}" + "".join(f"{name:>14}" for name in retries))
    retry_rows: list[tuple[str, Any]] = [
        ("orders created", lambda r: r["orders"]),
        ("double charges", lambda r: r["double_charges"]),
        ("ran (200)", lambda r: r["ran_200"]),
        ("409 still running", lambda r: r["in_progress_409"]),
        ("replayed", lambda r: r["replayed"]),
        ("errors", lambda r: r["errors"]),
    ]
    for title, get in retry_rows:
        say(f"  {title:<26}" + "".join(f"{get(retries[name])!s:>14}" for name in retries))
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
    job = results["restock"]
    say()
    say('Restock job (manage.py restock, @redis_locked(..., on_busy="skip")):')
    say(f"  while another run holds its lock: {job['while_held']}")
    say(f"  once it is free:                  {job['after']}")


def verdict(results: dict[str, Any]) -> list[str]:
    problems = []
    for name, run in results["purchases"].items():
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
    for name, run in results["retries"].items():
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
    rep = results["reports"]
    if rep["max_in_flight"] > rep["limit"]:
        problems.append(f"report: {rep['max_in_flight']} ran at once, limit {rep['limit']}")
    if rep["errors"] or rep["unsent"]:
        problems.append(f"report: {rep['errors'] + rep['unsent']} requests failed")
    job = results["restock"]
    if not (job["skipped_while_held"] and job["ran_after"]):
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
    parser.add_argument("--json", metavar="FILE", help="also write the results to FILE")
    return parser.parse_args(argv)


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
    started = time.monotonic()
    try:
        say("[1/7] Redis")
        redis_choice = choose_redis(workdir, private=args.private_redis)
        say(f"    using {redis_choice.description}, keys under {prefix}:")
        os.environ.update(
            {
                "DJANGO_SETTINGS_MODULE": "example.settings",
                "DATABASE_URL": f"sqlite:///{workdir / 'db.sqlite3'}",
                "REDIS_URL": redis_choice.url,
                "SHOP_REDIS_PREFIX": prefix,
                "DJANGO_DEBUG": "0",
                "PYTHONPATH": os.pathsep.join(
                    [str(REPO_DIR), str(PROJECT_DIR), os.environ.get("PYTHONPATH", "")]
                ).rstrip(os.pathsep),
            }
        )

        say(f"[2/7] Database: fresh SQLite in {workdir}")
        import django
        from django.core.management import call_command

        django.setup()
        from shop.models import Product

        call_command("migrate", verbosity=0, interactive=False)
        product = Product.objects.create(name="Limited print", stock=args.stock)

        port = free_port()
        say(
            f"[3/7] gunicorn: {args.workers} processes x {args.threads} threads on 127.0.0.1:{port}"
        )
        log = workdir / "gunicorn.log"
        gunicorn = start_gunicorn(port, args.workers, args.threads, log)
        ready = wait_ready(gunicorn, port, log, deadline=60)
        say(f"    ready in {ready:.1f} s")

        say("[4/7] Concurrent purchases (fresh stock for each endpoint)")
        purchases = {}
        for name, path, locked in (
            ("unsafe", f"/unsafe/products/{product.pk}/buy", False),
            ("locked", f"/products/{product.pk}/buy", True),
            ("locked async", f"/async/products/{product.pk}/buy", True),
        ):
            purchases[name] = purchase_run(
                port, path, product.pk, args, label=f"{name:<12} {path}", locked=locked
            )

        say("[5/7] Retried purchases with an Idempotency-Key (fresh stock for each endpoint)")
        retries = {
            name: retry_run(port, path, product.pk, args, protected=protected)
            for name, path, protected in (
                ("unprotected", f"/unsafe/products/{product.pk}/buy", False),
                ("idempotent", f"/products/{product.pk}/buy", True),
                ("idem. async", f"/async/products/{product.pk}/buy", True),
            )
        }

        say("[6/7] Concurrent reports through the throttle")
        reports = report_run(port, args)

        say("[7/7] Restock job")
        restock = restock_run()

        results = {
            "purchases": purchases,
            "retries": retries,
            "reports": reports,
            "restock": restock,
            "seconds": time.monotonic() - started,
        }
        print_results(results, args)
        problems = verdict(results)
        if args.json:
            Path(args.json).write_text(json.dumps({**results, "problems": problems}, indent=2))
        say()
        if problems:
            say("FAILED: " + "; ".join(problems))
            return 1
        say(
            f"OK: the locked endpoints sold exactly the stock there was, and retried "
            f"purchases were charged once "
            f"({time.monotonic() - started:.0f} s in all)."
        )
        return 0
    finally:
        stop_process(gunicorn)
        if redis_choice is not None:
            if redis_choice.shared:
                with contextlib.suppress(Exception):
                    delete_own_keys(redis_choice.url, prefix)
            stop_process(redis_choice.process)
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        ensure_environment()
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
