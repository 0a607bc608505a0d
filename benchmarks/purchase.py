"""Purchase benchmark: one hot product, bought through five kinds of critical section.

Usage::

    python -m benchmarks.purchase                      # CONN_MAX_AGE=0, Django's default
    python -m benchmarks.purchase --conn-max-age 60    # persistent connections
    python -m benchmarks.purchase --pool 3             # Django's psycopg pool, 3 a process
    python -m benchmarks.purchase --pool 3 --bystanders 4 --variants sfu,locked
    python -m benchmarks.purchase --quick

It creates its own PostgreSQL database (``redislock_bench_<pid>``, dropped at
the end), starts a private redis-server and gunicorn (gthread workers serving
``benchmarks/purchasesite``), and has N clients (threads in two processes, on
keep-alive loopback connections) POST purchases of one product as fast as
they are answered. Per round, each of these runs for ``--duration`` seconds,
in an order rotated from round to round:

* ``sfu``     ``select_for_update()`` in a transaction;
* ``cond``    a conditional ``UPDATE ... SET stock = stock - 1 WHERE stock > 0``;
* ``locked``  ``@redis_locked`` with fenced updates, the README's view;
* ``lean``    the same lock and fencing in fewer round trips;

each without and with a ``--slow-ms`` (20 ms) "external call" inside the
critical section, a ``time.sleep``: a call to a payment provider waits on
the network with the GIL released, which a sleep reproduces at no CPU cost,
so the two shared cores go to what is measured. ``unsafe`` (read, call, write
back, no lock) runs once per setting as a control: it must oversell.

Each variant gets a fresh product with more stock than can be sold, so every
answer is a sale; after it, ``oversold = orders + stock left - stock seeded``
(units sold that the stock never had, through lost updates) must be 0.
While it runs, a thread samples ``pg_stat_activity`` for the benchmark's
database every 10 ms: connections open, busy (running a statement or idle
inside a transaction), and waiting for a row lock.

The database connections are set up one of three ways: ``CONN_MAX_AGE = 0``
(Django's default, a connection per request), ``--conn-max-age 60``
(persistent, one per thread) or ``--pool N`` (Django's psycopg connection
pool, Django 5.1+: N connections per gunicorn process that its threads share;
N below ``--threads`` makes threads wait for a connection).

With ``--bystanders N``, N more clients read the product page of another
product (``GET /product/<pk>/``, one SELECT) from the same gunicorn while each
variant runs, and once alone before the rounds ("quiet"): the sale's cost to
the rest of the site, which shares its threads and database connections.

Every response carries a trace (``benchmarks/purchasesite/views.py``): when
its critical section began and ended, how long the connection took to open
and whether that happened inside the critical section, and the statements
and commits it ran. From them: the mean hold of the critical section, the
hand-off (from one holder's end to the next one's start) and the share of
the run during which the section was held.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .common import (
    Gunicorn,
    PrivateRedis,
    fmt,
    http_request,
    loadavg,
    machine_facts,
    parser,
    percentile,
    ratio,
    rst_table,
    table,
    tree_cpu,
    uptime_line,
    write_results,
)

ROOT = Path(__file__).resolve().parent.parent
CTX = mp.get_context("fork")
VARIANTS = ["sfu", "cond", "locked", "lean"]
CONTROL = "unsafe"
SEED_STOCK = 1_000_000


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- PostgreSQL -------------------------------------------------------------------------
def pg_connect(cfg: argparse.Namespace, dbname: str) -> Any:
    import psycopg

    return psycopg.connect(
        host=cfg.pg_host,
        port=cfg.pg_port,
        user=cfg.pg_user,
        dbname=dbname,
        autocommit=True,
        connect_timeout=5,
    )


class BenchDatabase:
    """A database of the benchmark's own, created at start and dropped at the end."""

    def __init__(self, cfg: argparse.Namespace) -> None:
        self.cfg = cfg
        self.name = f"redislock_bench_{os.getpid()}"

    def create(self) -> BenchDatabase:
        with pg_connect(self.cfg, self.cfg.pg_admin_db) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        return self

    def drop(self) -> None:
        with pg_connect(self.cfg, self.cfg.pg_admin_db) as conn:
            # FORCE: a gunicorn worker killed mid-request may leave a backend behind.
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def postmaster_pid(self) -> int | None:
        """The server's postmaster, when it runs on this host and can be seen:
        every backend is its child."""
        with pg_connect(self.cfg, self.name) as conn:
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            # Read while the backend lives: it exits with the connection.
            try:
                with open(f"/proc/{backend}/status") as f:
                    for line in f:
                        if line.startswith("PPid:"):
                            return int(line.split()[1])
            except OSError:
                pass
        return None

    def server_facts(self) -> dict[str, Any]:
        with pg_connect(self.cfg, self.name) as conn:
            return {
                "version": conn.execute("SHOW server_version").fetchone()[0],
                "max_connections": conn.execute("SHOW max_connections").fetchone()[0],
                "synchronous_commit": conn.execute("SHOW synchronous_commit").fetchone()[0],
                "fsync": conn.execute("SHOW fsync").fetchone()[0],
            }


class Sampler:
    """Samples ``pg_stat_activity`` for one database every ``interval`` seconds."""

    QUERY = """
        SELECT count(*),
               count(*) FILTER (WHERE state = 'active' OR state LIKE 'idle in transaction%%'),
               count(*) FILTER (WHERE wait_event_type = 'Lock')
        FROM pg_stat_activity
        WHERE datname = %s AND pid <> pg_backend_pid() AND backend_type = 'client backend'
    """

    def __init__(self, cfg: argparse.Namespace, dbname: str, interval: float = 0.01) -> None:
        self.conn = pg_connect(cfg, cfg.pg_admin_db)
        self.dbname = dbname
        self.interval = interval
        self.samples: list[tuple[int, int, int]] = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            row = self.conn.execute(self.QUERY, (self.dbname,)).fetchone()
            self.samples.append(tuple(row))

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join(10)
        self.conn.close()

    def summary(self) -> dict[str, float]:
        s = self.samples or [(0, 0, 0)]
        return {
            "open_mean": statistics.fmean(x[0] for x in s),
            "open_max": max(x[0] for x in s),
            "busy_mean": statistics.fmean(x[1] for x in s),
            "waiting_mean": statistics.fmean(x[2] for x in s),
            "waiting_max": max(x[2] for x in s),
            "samples": len(self.samples),
        }


# -- servers -----------------------------------------------------------------------------
def site_env(cfg: argparse.Namespace, redis_url: str, dbname: str) -> dict[str, str]:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "benchmarks.purchasesite.settings"
    env["BENCH_REDIS_URL"] = redis_url
    env["BENCH_PG_HOST"] = cfg.pg_host
    env["BENCH_PG_PORT"] = str(cfg.pg_port)
    env["BENCH_PG_USER"] = cfg.pg_user
    env["BENCH_PG_NAME"] = dbname
    env["BENCH_CONN_MAX_AGE"] = str(cfg.conn_max_age)
    env["BENCH_POOL"] = str(cfg.pool)
    env.pop("BENCH_CONNECT_EARLY", None)
    if cfg.connect_early != "default":
        env["BENCH_CONNECT_EARLY"] = "1" if cfg.connect_early == "on" else "0"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def migrate(env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "--run-syncdb", "-v", "0"],
        env=env,
        cwd=ROOT,
        check=True,
        timeout=120,
    )


def post(port: int, path: str) -> tuple[int, bytes]:
    return http_request(port, "POST", path)


# -- load -----------------------------------------------------------------------------------
def _client_thread(port: int, method: str, path: str, deadline: float, out: dict[str, Any]) -> None:
    def connect() -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    conn = connect()
    lat: list[float] = []
    traces: list[str] = []
    statuses: dict[int, int] = {}
    errors = 0
    clock = time.monotonic
    while clock() < deadline:
        t0 = clock()
        try:
            conn.request(method, path)
            resp = conn.getresponse()
            resp.read()
            statuses[resp.status] = statuses.get(resp.status, 0) + 1
            if resp.status == 200:
                lat.append(clock() - t0)
                traces.append(resp.getheader("X-Trace") or "{}")
            if resp.will_close:
                conn.close()
                conn = connect()
        except (OSError, http.client.HTTPException):
            errors += 1
            conn.close()
            conn = connect()
    conn.close()
    out.update(lat=lat, traces=traces, statuses=statuses, errors=errors)


def _client_process(
    port: int, method: str, path: str, threads: int, start: float, duration: float, pipe: Any
) -> None:
    while time.monotonic() < start:
        time.sleep(0.001)
    outs: list[dict[str, Any]] = [{} for _ in range(threads)]
    ts = [
        threading.Thread(
            target=_client_thread, args=(port, method, path, start + duration, outs[i])
        )
        for i in range(threads)
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join(duration + 60)
    pipe.send(outs)
    pipe.close()


def run_load(
    port: int,
    path: str,
    clients: int,
    duration: float,
    *,
    bystander_path: str | None = None,
    bystanders: int = 0,
) -> dict[str, Any]:
    """``clients`` POST ``path`` for ``duration`` seconds; with ``bystanders``,
    that many more GET ``bystander_path`` over the same seconds, in a process
    of their own (their results under ``"bystander"``)."""
    start = time.monotonic() + 0.3
    # The buyers in up to two processes, the bystanders in one of their own.
    procs_n = min(2, clients)
    streams = [
        ("POST", path, clients // procs_n + (1 if i < clients % procs_n else 0))
        for i in range(procs_n)
    ]
    if bystanders and bystander_path:
        streams.append(("GET", bystander_path, bystanders))
    pipes, procs = [], []
    for method, target, n in streams:
        a, b = CTX.Pipe(duplex=False)
        proc = CTX.Process(
            target=_client_process, args=(port, method, target, n, start, duration, b)
        )
        proc.start()
        pipes.append(a)
        procs.append(proc)
    results: list[list[dict[str, Any]]] = []
    for a in pipes:
        results.append(a.recv() if a.poll(duration + 90) else [])
    for proc in procs:
        proc.join(10)
        if proc.is_alive():
            proc.kill()  # our own client process, by its PID
            proc.join(5)
    # Requests still in flight at the deadline are answered after it: count
    # the time until the last one came back.
    elapsed = max(1e-9, time.monotonic() - start)
    buyers = len(streams) - (1 if bystanders and bystander_path else 0)
    out = _summarise([o for outs in results[:buyers] for o in outs], elapsed)
    if buyers < len(streams):
        page = _summarise(results[-1], elapsed)
        page.pop("traces")
        out["bystander"] = page
    return out


def _summarise(outs: list[dict[str, Any]], elapsed: float) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    for o in outs:
        for k, v in o.get("statuses", {}).items():
            statuses[str(k)] = statuses.get(str(k), 0) + v
    return {
        "elapsed": elapsed,
        "ok": statuses.get("200", 0),
        "statuses": statuses,
        "errors": sum(o.get("errors", 0) for o in outs),
        "lat": [x for o in outs for x in o.get("lat", [])],
        "traces": [json.loads(t) for o in outs for t in o.get("traces", [])],
    }


def bystander_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The product page's latency and rate over the runs that had bystanders."""
    pages = [r["bystander"] for r in runs if "bystander" in r]
    if not pages:
        return {}
    lat = [x for p in pages for x in p["lat"]]
    return {
        "requests": sum(p["ok"] for p in pages),
        "rps": statistics.median(p["ok"] / p["elapsed"] for p in pages),
        "p50_ms": percentile(lat, 50) * 1000,
        "p99_ms": percentile(lat, 99) * 1000,
        "max_ms": max(lat) * 1000 if lat else float("nan"),
        "errors": sum(p["errors"] for p in pages)
        + sum(v for p in pages for k, v in p["statuses"].items() if k != "200"),
    }


def trace_summary(traces: list[dict[str, Any]]) -> dict[str, float]:
    """Means over one run's responses, and the hold / hand-off of its critical sections."""
    n = max(1, len(traces))
    out: dict[str, float] = {
        "connects": sum(1 for t in traces if "connect_ms" in t) / n,
        "connect_ms": statistics.fmean(
            [t["connect_ms"] for t in traces if "connect_ms" in t] or [0]
        ),
        "connect_in_cs": sum(1 for t in traces if t.get("connect_in_cs")) / n,
        "statements": sum(t.get("q", 0) for t in traces) / n,
        "statement_ms": sum(t.get("q_ms", 0.0) for t in traces) / n,
        "commits": sum(t.get("tx", 0) for t in traces) / n,
        "commit_ms": sum(t.get("commit_ms", 0.0) for t in traces) / n,
    }
    sections = sorted((t["cs0"], t["cs1"]) for t in traces if "cs0" in t and "cs1" in t)
    if len(sections) > 1:
        holds = [b - a for a, b in sections]
        gaps = [max(0.0, nxt[0] - cur[1]) for cur, nxt in zip(sections, sections[1:], strict=False)]
        span = sections[-1][1] - sections[0][0]
        out["hold_ms"] = statistics.fmean(holds) * 1000
        out["handoff_ms"] = statistics.median(gaps) * 1000
        out["held_share"] = min(1.0, sum(holds) / span) if span > 0 else float("nan")
        out["enter_ms"] = (
            statistics.fmean(a - t["t0"] for t in traces if "cs0" in t for a in [t["cs0"]]) * 1000
        )
    return out


# -- one variant ------------------------------------------------------------------------------
def run_variant(
    cfg: argparse.Namespace,
    db: BenchDatabase,
    port: int,
    variant: str,
    slow_ms: int,
    duration: float,
) -> dict[str, Any]:
    with pg_connect(cfg, db.name) as conn:
        product = conn.execute(
            "INSERT INTO purchasesite_product (stock, fence) VALUES (%s, 0) RETURNING id",
            (SEED_STOCK,),
        ).fetchone()[0]
    roots = getattr(cfg, "cpu_roots", {})
    cpu_before = tree_cpu(roots)
    clients_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with Sampler(cfg, db.name) as sampler:
        run = run_load(
            port,
            f"/buy/{variant}/{slow_ms}/{product}/",
            cfg.clients,
            duration,
            bystander_path=cfg.page_path,
            bystanders=cfg.bystanders,
        )
    with pg_connect(cfg, db.name) as conn:
        stock = conn.execute(
            "SELECT stock FROM purchasesite_product WHERE id = %s", (product,)
        ).fetchone()[0]
        orders = conn.execute(
            "SELECT count(*) FROM purchasesite_order WHERE product_id = %s", (product,)
        ).fetchone()[0]
    # CPU of the whole purchase: the site, Redis, PostgreSQL (every backend of
    # the server, so the host must be otherwise quiet), and the client
    # processes (reaped by run_load). The sampler of pg_stat_activity runs in
    # this process and is left out, but its backend is the server's.
    cpu_after = tree_cpu(roots)
    clients_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = {name: cpu_after[name] - cpu_before[name] for name in roots}
    cpu["clients"] = (clients_after.ru_utime + clients_after.ru_stime) - (
        clients_before.ru_utime + clients_before.ru_stime
    )
    # Per request answered: the purchases, and the bystanders' pages when
    # there are any (the same processes serve both).
    answered = max(1, run["ok"] + run.get("bystander", {}).get("ok", 0))
    run["cpu_ms"] = {name: seconds * 1000 / answered for name, seconds in cpu.items()}
    run["oversold"] = orders + stock - SEED_STOCK
    run["orders"] = orders
    run["pg"] = sampler.summary()
    run["trace"] = trace_summary(run.pop("traces"))
    run["rps"] = run["ok"] / run["elapsed"]
    return run


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    lat = [x for r in runs for x in r["lat"]]

    def med(get: Any) -> float:
        values = [get(r) for r in runs]
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else float("nan")

    return {
        "rps": med(lambda r: r["rps"]),
        "rps_rounds": [round(r["rps"], 1) for r in runs],
        "purchases": sum(r["ok"] for r in runs),
        "p50_ms": percentile(lat, 50) * 1000,
        "p99_ms": percentile(lat, 99) * 1000,
        "errors": sum(r["errors"] for r in runs)
        + sum(v for r in runs for k, v in r["statuses"].items() if k != "200"),
        "oversold": sum(r["oversold"] for r in runs),
        "pg": {k: med(lambda r, k=k: r["pg"][k]) for k in runs[0]["pg"]},
        "trace": {k: med(lambda r, k=k: r["trace"].get(k)) for k in runs[0]["trace"]},
        "cpu_ms": {k: med(lambda r, k=k: r["cpu_ms"].get(k)) for k in runs[0].get("cpu_ms", {})},
        "bystander": bystander_summary(runs),
    }


# -- report -------------------------------------------------------------------------------
def render(data: dict[str, Any], rst: bool = False) -> str:
    tab = rst_table if rst else table
    res = data["results"]
    rows = []
    details = []
    for key, v in res.items():
        variant, slow = key.split("/")
        base = res.get(f"sfu/{slow}", {}).get("rps")
        spread = v["rps_rounds"]
        rows.append(
            [
                variant,
                slow,
                fmt(v["rps"], 0),
                f"{min(spread):.0f}-{max(spread):.0f}",
                fmt(ratio(v["rps"], base), 2),
                fmt(v["p50_ms"], 0),
                fmt(v["p99_ms"], 0),
                fmt(v["pg"]["open_mean"], 1),
                fmt(v["pg"]["busy_mean"], 1),
                fmt(v["pg"]["waiting_mean"], 1),
                v["errors"],
                v["oversold"],
            ]
        )
        t = v["trace"]
        details.append(
            [
                variant,
                slow,
                fmt(t.get("hold_ms"), 1),
                fmt(t.get("handoff_ms"), 1),
                fmt(t.get("held_share"), 2),
                fmt(t.get("enter_ms"), 0),
                fmt(t["connects"], 2),
                fmt(t["connect_ms"], 1),
                fmt(t["connect_in_cs"], 2),
                fmt(t["statements"], 1),
                fmt(t["statement_ms"], 1),
                fmt(t["commits"], 1),
                fmt(t["commit_ms"], 1),
            ]
        )
    out = tab(
        [
            "variant",
            "call ms",
            "buys/s",
            "rounds",
            "vs sfu",
            "p50 ms",
            "p99 ms",
            "db conns",
            "busy",
            "waiting",
            "errors",
            "oversold",
        ],
        rows,
    )
    out += (
        "\n\nWhere the time goes (medians of rounds; per purchase; hold: the critical "
        "section, from the lock taken to the lock given back; hand-off: from one\nholder's "
        "end to the next one's start; held: share of the run the section was held; enter: "
        "from the view's start to the section's)\n\n"
    ) + tab(
        [
            "variant",
            "call ms",
            "hold ms",
            "hand-off ms",
            "held",
            "enter ms",
            "connects",
            "connect ms",
            "in section",
            "statements",
            "stmt ms",
            "commits",
            "commit ms",
        ],
        details,
    )
    cpu_rows = []
    pages_served = any(v.get("bystander") for v in res.values())
    for key, v in res.items():
        cpu = v.get("cpu_ms") or {}
        if not cpu:
            continue
        variant, slow = key.split("/")
        total = sum(cpu.values())
        base = sum((res.get(f"sfu/{slow}", {}).get("cpu_ms") or {}).values())
        cpu_rows.append(
            [
                variant,
                slow,
                *(fmt(cpu.get(name), 2) for name in ("site", "postgres", "redis", "clients")),
                fmt(total, 2),
                fmt(ratio(total, base), 2),
            ]
        )
    if cpu_rows:
        out += (
            f"\n\nCPU per {'request (purchases and pages)' if pages_served else 'purchase'}, "
            "ms (medians of rounds; every process counted: the site's gunicorn, "
            "PostgreSQL's server with all its backends, the private Redis, the "
            "clients; meaningful on an otherwise quiet host)\n\n"
        ) + tab(
            ["variant", "call ms", "site", "postgres", "redis", "clients", "total", "vs sfu"],
            cpu_rows,
        )
    pages = [(k, v["bystander"]) for k, v in res.items() if v.get("bystander")]
    if pages:
        quiet = data.get("quiet") or {}
        rows = []
        if quiet:
            rows.append(["(quiet)", "-", *_page_cells(quiet, quiet)])
        for key, b in pages:
            variant, slow = key.split("/")
            rows.append([variant, slow, *_page_cells(b, quiet)])
        out += (
            "\n\nBystanders: the product page of another product (GET, one SELECT), "
            "read by other clients from the same gunicorn during each variant; "
            "quiet: alone, before the rounds\n\n"
        ) + tab(
            ["variant", "call ms", "pages/s", "p50 ms", "p99 ms", "max ms", "p50/quiet", "errors"],
            rows,
        )
    return out


def _page_cells(b: dict[str, Any], quiet: dict[str, Any]) -> list[Any]:
    return [
        fmt(b["rps"], 0),
        fmt(b["p50_ms"], 1),
        fmt(b["p99_ms"], 0),
        fmt(b["max_ms"], 0),
        fmt(ratio(b["p50_ms"], quiet.get("p50_ms", float("nan"))), 1),
        b["errors"],
    ]


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser("purchase", __doc__)
    p.add_argument("--quick", action="store_true", help="1 round of 3 s: a smoke run")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=8.0, help="seconds per variant per round")
    p.add_argument("--clients", type=int, default=16, help="concurrent clients (threads)")
    p.add_argument("--workers", type=int, default=3, help="gunicorn processes")
    p.add_argument("--threads", type=int, default=4, help="gunicorn threads per process")
    p.add_argument("--slow-ms", type=int, default=20, help="the external call inside the section")
    p.add_argument(
        "--conn-max-age",
        type=float,
        default=0,
        help="CONN_MAX_AGE of the site's database (0, Django's default: a connection per "
        "request; 60: persistent)",
    )
    p.add_argument(
        "--pool",
        type=int,
        default=0,
        metavar="N",
        help="Django's psycopg connection pool (DATABASES OPTIONS 'pool'; Django 5.1+, "
        "psycopg-pool) of N connections per gunicorn process; with CONN_MAX_AGE 0",
    )
    p.add_argument(
        "--bystanders",
        type=int,
        default=0,
        metavar="N",
        help="N more clients read another product's page during every variant "
        "(and alone, before the rounds); their latency is reported",
    )
    p.add_argument(
        "--connect-early",
        choices=["default", "on", "off"],
        default="default",
        help="REDISLOCK['CONNECT_EARLY'] for the locked views (default: the library's default)",
    )
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset")
    p.add_argument("--no-control", action="store_true", help="skip the unsafe control")
    p.add_argument("--pg-host", default=os.environ.get("PGHOST", "127.0.0.1"))
    p.add_argument("--pg-port", type=int, default=int(os.environ.get("PGPORT", "5432")))
    p.add_argument("--pg-user", default=os.environ.get("PGUSER", "postgres"))
    p.add_argument(
        "--pg-admin-db", default="postgres", help="database to connect to for CREATE DATABASE"
    )
    p.add_argument("--rst", action="store_true")
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--render", metavar="JSON", help="print the tables of a saved run and exit")
    cfg = p.parse_args(argv)
    if cfg.quick:
        cfg.rounds, cfg.duration = 1, 3.0
    if cfg.pool and cfg.conn_max_age:
        p.error("--pool needs CONN_MAX_AGE 0: Django's pool does not take persistent connections")
    if cfg.pool:
        try:
            import django
            import psycopg_pool  # noqa: F401
        except ImportError as exc:
            p.error(f"--pool needs psycopg-pool: {exc}")
        if django.VERSION < (5, 1):
            p.error("--pool needs Django 5.1 or later")
    cfg.page_path = None
    cfg.variants = [v for v in cfg.variants.split(",") if v]
    unknown = set(cfg.variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}; choose from {VARIANTS}")
    return cfg


def _db_setup(cfg: argparse.Namespace) -> str:
    setup = f"CONN_MAX_AGE={cfg.conn_max_age:g}"
    if cfg.pool:
        setup += f", pool of {cfg.pool} per process ({cfg.threads} threads)"
    if cfg.bystanders:
        setup += f", {cfg.bystanders} bystanders"
    return setup


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    if cfg.render:
        print(render(json.loads(Path(cfg.render).read_text()), rst=cfg.rst))
        return 0
    started = time.monotonic()
    data: dict[str, Any] = {
        "command": "python -m benchmarks.purchase "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "config": {k: v for k, v in vars(cfg).items() if k != "render"},
        "load_before": loadavg(),
        "uptime_before": uptime_line(),
    }
    db = BenchDatabase(cfg)
    server = PrivateRedis().start()
    gunicorn: Gunicorn | None = None
    runs: dict[str, list[dict[str, Any]]] = {}
    control: dict[str, dict[str, Any]] = {}
    try:
        db.create()
        data["machine"] = machine_facts(server.version())
        data["postgres"] = db.server_facts()
        env = site_env(cfg, server.url, db.name)
        migrate(env)
        with pg_connect(cfg, db.name) as conn:
            warm = conn.execute(
                "INSERT INTO purchasesite_product (stock, fence) VALUES (%s, 0) RETURNING id",
                (SEED_STOCK,),
            ).fetchone()[0]
            page = conn.execute(
                "INSERT INTO purchasesite_product (stock, fence) VALUES (%s, 0) RETURNING id",
                (SEED_STOCK,),
            ).fetchone()[0]
        if cfg.bystanders:
            cfg.page_path = f"/product/{page}/"
        gunicorn = Gunicorn(
            "benchmarks.purchasesite.wsgi:application", env, cfg.workers, cfg.threads, keep_alive=30
        ).start(lambda port: post(port, f"/buy/sfu/0/{warm}/")[0] == 200)
        log(f"gunicorn {cfg.workers}x{cfg.threads} on 127.0.0.1:{gunicorn.port}, db {db.name}")
        cfg.cpu_roots = {"site": gunicorn.proc.pid, "redis": server.proc.pid}  # type: ignore[union-attr]
        postmaster = db.postmaster_pid()
        if postmaster is not None:
            cfg.cpu_roots["postgres"] = postmaster
        keys = [f"{v}/{s}" for s in (0, cfg.slow_ms) for v in cfg.variants]
        for v in cfg.variants:  # warm every worker's imports and code paths
            run_load(gunicorn.port, f"/buy/{v}/0/{warm}/", cfg.clients, 1.0)
        if cfg.bystanders:
            # The page alone (no buyers): what the bystanders see on a quiet day.
            quiet = run_load(
                gunicorn.port,
                f"/buy/sfu/0/{warm}/",
                0,
                min(cfg.duration, 3.0),
                bystander_path=cfg.page_path,
                bystanders=cfg.bystanders,
            )
            data["quiet"] = bystander_summary([quiet])
            log(f"  quiet: product page p50 {data['quiet']['p50_ms']:.1f} ms")
        for r in range(cfg.rounds):
            order = keys[r % len(keys) :] + keys[: r % len(keys)]
            for key in order:
                variant, slow_text = key.split("/")
                run = run_variant(cfg, db, gunicorn.port, variant, int(slow_text), cfg.duration)
                log(
                    f"  round {r + 1}/{cfg.rounds} {key:<10} {run['rps']:6.1f}/s  "
                    f"oversold {run['oversold']}  errors {run['errors']}"
                )
                runs.setdefault(key, []).append(run)
        if not cfg.no_control:
            for slow in (0, cfg.slow_ms):
                run = run_variant(cfg, db, gunicorn.port, CONTROL, slow, min(cfg.duration, 3.0))
                control[f"{CONTROL}/{slow}"] = {
                    "rps": run["rps"],
                    "orders": run["orders"],
                    "oversold": run["oversold"],
                    "errors": run["errors"],
                }
                log(f"  control {CONTROL}/{slow}: oversold {run['oversold']} of {run['orders']}")
    finally:
        if gunicorn is not None:
            gunicorn.stop()
        server.stop()
        db.drop()
    data["load_after"] = loadavg()
    data["uptime_after"] = uptime_line()
    data["results"] = {key: combine(runs[key]) for key in runs}
    data["control"] = control
    data["seconds"] = round(time.monotonic() - started, 1)
    m, pg = data["machine"], data["postgres"]
    print(f"{m['date_utc']}  {m['cpu']}, {m['cores']} cores, Python {m['python']}, {m['platform']}")
    print(
        f"PostgreSQL {pg['version']} (synchronous_commit={pg['synchronous_commit']}, "
        f"fsync={pg['fsync']}), Redis {m['redis_server']} (unix socket), redis-py "
        f"{m['redis_py']}, hiredis {m['hiredis']}"
    )
    print(
        f"gunicorn gthread {cfg.workers}x{cfg.threads}, {cfg.clients} clients, "
        f"{_db_setup(cfg)}, CONNECT_EARLY={cfg.connect_early}, "
        f"{cfg.rounds} rounds x {cfg.duration:g} s per variant, external call "
        f"{cfg.slow_ms} ms (time.sleep)"
    )
    print(
        f"load averages before {data['load_before']}, after {data['load_after']} "
        f"(the host may be shared); {data['seconds']} s in all\n"
    )
    print(render(data))
    for key, c in control.items():
        print(
            f"\ncontrol {key}: {c['orders']} orders, oversold {c['oversold']} "
            f"({c['rps']:.0f}/s, {c['errors']} errors)"
        )
    if cfg.rst:
        print("\n\n" + render(data, rst=True))
    if not cfg.no_save:
        print(f"\nresults: {write_results('purchase', data)}")
    bad = [k for k, v in data["results"].items() if v["oversold"] or v["errors"]]
    if bad:
        print(f"\nFAIL: errors or oversell in {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
