"""View benchmark: what ``@redis_locked`` and the concurrency-limit middleware cost.

Usage::

    python -m benchmarks.views --quick
    python -m benchmarks.views --rounds 5 --duration 5 --gunicorn-workers 2 --gunicorn-threads 4

It starts a private redis-server and gunicorn (gthread workers) serving the
small site in ``benchmarks/viewsite``, then drives three paths with keep-alive
HTTP/1.1 connections on loopback, interleaved round-robin:

* ``/plain/<key>/``      a view that returns ``ok``;
* ``/locked/<key>/``     the same view under ``@redis_locked("bench:{key}")``,
  with a distinct key per request, so every lock is uncontended;
* ``/throttled/<key>/``  the plain view on a path matched by a
  ``ConcurrencyLimitMiddleware`` rule whose limit (1000) is never reached;

and two references: ``/pings/<key>/`` makes two bare PINGs (the floor for any
lock with one round trip to acquire and one to release) and
``/corelock/<key>/`` takes a core ``Lock`` by hand, without the decorator.

It reports requests per second for each path and the locked/plain and
throttled/plain ratios. While the decorator or the middleware cannot be
imported, their paths are skipped and the output says why. Both servers are
stopped by their PIDs at the end.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
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
    uptime_line,
    write_results,
)

ROOT = Path(__file__).resolve().parent.parent
CTX = mp.get_context("fork")
PATHS = {
    "plain": "/plain/",
    "pings": "/pings/",  # reference: two bare PINGs around the body
    "corelock": "/corelock/",  # reference: a core Lock taken by hand, no Django layer
    "locked": "/locked/",
    "throttled": "/throttled/",
}
TARGET_RATIO = 0.90


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- what can be benchmarked --------------------------------------------------------
_PROBE = r"""
import json, sys
import django
django.setup()
out = {}
try:
    from django_redislock import redis_locked
    redis_locked("bench:{key}")(lambda request, key: None)
    out["decorator"] = None
except Exception as exc:
    out["decorator"] = f"{type(exc).__name__}: {exc}"
try:
    from django_redislock.middleware import ConcurrencyLimitMiddleware
    ConcurrencyLimitMiddleware(lambda request: None)
    out["middleware"] = None
except Exception as exc:
    out["middleware"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def site_env(
    redis_url: str,
    flags: dict[str, bool] | None = None,
    work_ms: float = 0.0,
    no_db: bool = False,
) -> dict[str, str]:
    env = dict(os.environ)
    env["BENCH_WORK_MS"] = str(work_ms)
    env["BENCH_DB"] = "0" if no_db else "1"
    env["DJANGO_SETTINGS_MODULE"] = "benchmarks.viewsite.settings"
    env["BENCH_REDIS_URL"] = redis_url
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if flags is not None:
        env["BENCH_DECORATOR"] = "1" if flags.get("decorator") else "0"
        env["BENCH_MIDDLEWARE"] = "1" if flags.get("middleware") else "0"
    return env


def probe(redis_url: str, no_db: bool = False) -> dict[str, str | None]:
    """Import the decorator and middleware in a fresh process; an error message each or None."""
    env = site_env(redis_url, {"decorator": False, "middleware": False}, no_db=no_db)
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        return {"decorator": proc.stderr[-500:], "middleware": proc.stderr[-500:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- gunicorn -------------------------------------------------------------------------
def get(port: int, path: str) -> tuple[int, bytes]:
    return http_request(port, "GET", path, timeout=5)


def start_site(env: dict[str, str], workers: int, threads: int) -> Gunicorn:
    """The views site under gunicorn, once it answers."""
    site = Gunicorn("benchmarks.viewsite.wsgi:application", env, workers, threads, keep_alive=10)
    return site.start(lambda port: get(port, "/features/")[0] == 200)


# -- load -------------------------------------------------------------------------------
def _client_thread(
    port: int, prefix: str, tag: str, deadline: float, budget: int, out: dict[str, Any]
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    lat: list[float] = []
    statuses: dict[int, int] = {}
    errors = 0
    n = 0
    clock = time.monotonic
    while n < budget and clock() < deadline:
        n += 1
        t0 = clock()
        try:
            conn.request("GET", f"{prefix}{tag}-{n}/")
            resp = conn.getresponse()
            resp.read()
            statuses[resp.status] = statuses.get(resp.status, 0) + 1
            if resp.status == 200:
                lat.append(clock() - t0)
            if resp.will_close:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        except (OSError, http.client.HTTPException):
            errors += 1
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.close()
    out["lat"] = lat
    out["statuses"] = statuses
    out["errors"] = errors


def _client_process(
    port: int,
    prefix: str,
    pid_tag: str,
    threads: int,
    start: float,
    duration: float,
    budget: int,
    conn: Any,
) -> None:
    while time.monotonic() < start:
        time.sleep(0.001)
    deadline = start + duration
    outs: list[dict[str, Any]] = [{} for _ in range(threads)]
    ts = [
        threading.Thread(
            target=_client_thread,
            args=(port, prefix, f"{pid_tag}t{i}", deadline, budget, outs[i]),
        )
        for i in range(threads)
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join(duration + 30)
    conn.send(outs)
    conn.close()


def run_load(
    port: int, prefix: str, tag: str, cfg: argparse.Namespace, duration: float, budget: int
) -> dict[str, Any]:
    start = time.monotonic() + 0.2
    pipes, procs = [], []
    for p in range(cfg.clients):
        a, b = CTX.Pipe(duplex=False)
        proc = CTX.Process(
            target=_client_process,
            args=(port, prefix, f"{tag}p{p}", cfg.client_threads, start, duration, budget, b),
        )
        proc.start()
        pipes.append(a)
        procs.append(proc)
    outs: list[dict[str, Any]] = []
    for a in pipes:
        if a.poll(duration + 60):
            outs += a.recv()
    for proc in procs:
        proc.join(10)
        if proc.is_alive():
            proc.kill()  # our own client process, by its PID
            proc.join(5)
    elapsed = max(1e-9, min(duration, time.monotonic() - start))
    lat = [x for o in outs for x in o.get("lat", [])]
    statuses: dict[str, int] = {}
    for o in outs:
        for k, v in o.get("statuses", {}).items():
            statuses[str(k)] = statuses.get(str(k), 0) + v
    ok = statuses.get("200", 0)
    return {
        "rps": ok / elapsed,
        "ok": ok,
        "statuses": statuses,
        "errors": sum(o.get("errors", 0) for o in outs),
        "lat": lat,
    }


def count_keys(client: Any, pattern: str) -> int:
    return sum(1 for _ in client.scan_iter(match=pattern, count=1000))


# -- report -----------------------------------------------------------------------------
def render(data: dict[str, Any], rst: bool = False) -> str:
    tab = rst_table if rst else table
    res = data["paths"]
    plain = res.get("plain", {}).get("rps")
    pings = res.get("pings", {}).get("rps")
    rows = []
    for name, v in res.items():
        rows.append(
            [
                PATHS[name],
                fmt(v["rps"], 0),
                fmt(ratio(v["rps"], plain), 2),
                fmt(ratio(v["rps"], pings), 2) if pings else "-",
                fmt(v["p50_ms"], 2),
                fmt(v["p99_ms"], 2),
                v["non_200"],
                v["errors"],
            ]
        )
    out = "Requests per second (median of rounds) and latency\n\n" + tab(
        ["path", "req/s", "vs plain", "vs 2 PINGs", "p50 ms", "p99 ms", "non-200", "errors"], rows
    )
    for name, reason in data["skipped"].items():
        out += f"\n\nskipped {PATHS[name]}: {reason}"
    t = data.get("targets")
    if t:
        rows = [["PASS" if x["pass"] else "FAIL", x["target"], x["detail"]] for x in t]
        out += "\n\nTargets\n\n" + tab(["result", "target", "measured"], rows)
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser("views", __doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int)
    p.add_argument("--duration", type=float, help="seconds per path per round")
    p.add_argument(
        "--max-requests",
        type=int,
        default=200_000,
        help="bound on requests per client thread per path per round",
    )
    p.add_argument("--clients", type=int, default=2, help="load generator processes")
    p.add_argument("--client-threads", type=int, default=4, help="keep-alive connections each")
    p.add_argument("--gunicorn-workers", type=int, default=2)
    p.add_argument("--gunicorn-threads", type=int, default=4)
    p.add_argument("--tcp", action="store_true", help="Redis on loopback TCP, not a unix socket")
    p.add_argument(
        "--work-ms",
        type=float,
        default=0.0,
        help="milliseconds every view sleeps, a stand-in for real work (default 0)",
    )
    p.add_argument(
        "--no-db",
        action="store_true",
        help="run the site without a database (no transaction around the view)",
    )
    p.add_argument("--rst", action="store_true")
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--render", metavar="JSON", help="print the tables of a saved run and exit")
    cfg = p.parse_args(argv)
    cfg.rounds = cfg.rounds or (2 if cfg.quick else 5)
    cfg.duration = cfg.duration or (3.0 if cfg.quick else 5.0)
    return cfg


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    if cfg.render:
        print(render(json.loads(Path(cfg.render).read_text()), rst=cfg.rst))
        return 0
    data: dict[str, Any] = {
        "command": "python -m benchmarks.views " + " ".join(sys.argv[1:] if argv is None else argv),
        "config": vars(cfg).copy(),
        "load_before": loadavg(),
        "uptime_before": uptime_line(),
        "skipped": {},
    }
    server = PrivateRedis(tcp=cfg.tcp).start()
    gunicorn: Gunicorn | None = None
    try:
        data["machine"] = machine_facts(server.version())
        errors = probe(server.url, cfg.no_db)
        flags = {k: errors.get(k) is None for k in ("decorator", "middleware")}
        if errors.get("decorator"):
            data["skipped"]["locked"] = f"@redis_locked is not usable yet ({errors['decorator']})"
        if errors.get("middleware"):
            data["skipped"]["throttled"] = (
                f"ConcurrencyLimitMiddleware is not usable yet ({errors['middleware']})"
            )
        for name, reason in data["skipped"].items():
            log(f"skipping {PATHS[name]}: {reason}")
        paths = [n for n in PATHS if n not in data["skipped"]]
        env = site_env(server.url, flags, cfg.work_ms, cfg.no_db)
        gunicorn = start_site(env, cfg.gunicorn_workers, cfg.gunicorn_threads)
        log(f"gunicorn on 127.0.0.1:{gunicorn.port}, paths: {', '.join(paths)}")
        for name in paths:  # warm every worker's code paths and connections
            run_load(gunicorn.port, PATHS[name], f"warm-{name}", cfg, 1.0, 500)
        rounds: dict[str, list[dict[str, Any]]] = {n: [] for n in paths}
        for r in range(cfg.rounds):
            for name in paths[r % len(paths) :] + paths[: r % len(paths)]:
                log(f"  round {r + 1}/{cfg.rounds}: {PATHS[name]}")
                rounds[name].append(
                    run_load(
                        gunicorn.port,
                        PATHS[name],
                        f"r{r}-{name}",
                        cfg,
                        cfg.duration,
                        cfg.max_requests,
                    )
                )
        with server.client() as c:
            data["redis_keys_after"] = {
                "lock state (redislock:H:*)": count_keys(c, "redislock:H:*"),
                "semaphore keys (redislock:S*)": count_keys(c, "redislock:S*"),
            }
    finally:
        if gunicorn is not None:
            gunicorn.stop()
        server.stop()
    data["load_after"] = loadavg()
    data["uptime_after"] = uptime_line()
    res: dict[str, Any] = {}
    for name, runs in rounds.items():
        lat = [x for run in runs for x in run["lat"]]
        res[name] = {
            "rps": statistics.median(run["rps"] for run in runs),
            "rps_rounds": [run["rps"] for run in runs],
            "p50_ms": percentile(lat, 50) * 1000,
            "p99_ms": percentile(lat, 99) * 1000,
            "non_200": sum(v for run in runs for k, v in run["statuses"].items() if k != "200"),
            "errors": sum(run["errors"] for run in runs),
        }
    data["paths"] = res
    plain = res.get("plain", {}).get("rps")
    data["targets"] = [
        {
            "target": f"{PATHS[n]} >= {TARGET_RATIO:.2f} x plain",
            "pass": ratio(res[n]["rps"], plain) >= TARGET_RATIO and res[n]["non_200"] == 0,
            "detail": f"{ratio(res[n]['rps'], plain):.2f}x, {res[n]['non_200']} non-200",
        }
        for n in ("locked", "throttled")
        if n in res
    ]
    m = data["machine"]
    print(f"{m['date_utc']}  {m['cpu']}, {m['cores']} cores, Python {m['python']}")
    print(
        f"Redis {m['redis_server']}, redis-py {m['redis_py']}, hiredis {m['hiredis']}; "
        f"gunicorn gthread {cfg.gunicorn_workers}x{cfg.gunicorn_threads}, "
        f"load {cfg.clients}x{cfg.client_threads} keep-alive connections, "
        f"view work {cfg.work_ms:g} ms, "
        f"database: {'none' if cfg.no_db else 'sqlite :memory:'}"
    )
    print(f"load averages before {data['load_before']}, after {data['load_after']}")
    print(f"Redis keys left by the run: {data.get('redis_keys_after')}\n")
    print(render(data))
    if cfg.rst:
        print("\n\n" + render(data, rst=True))
    if not cfg.no_save:
        print(f"\nresults: {write_results('views', data)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
