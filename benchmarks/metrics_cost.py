"""What turning metrics on costs a locked or throttled view.

Usage::

    python -m benchmarks.metrics_cost --quick
    python -m benchmarks.metrics_cost --rounds 6 --duration 4 --work-ms 5

It starts one private redis-server and one gunicorn per variant, all serving
the site of ``benchmarks.views`` (``benchmarks/viewsite``) with the same
settings but ``REDISLOCK["METRICS"]``:

* ``off``: no metrics (the default);
* ``prometheus``: the Prometheus backend (prometheus_client's default,
  single-process registry in each worker);
* ``opentelemetry``: the OpenTelemetry backend with the SDK configured (spans
  batched, measurements aggregated, both then dropped: no exporter's network).

Each round drives ``/locked/`` and ``/throttled/`` on every variant, one at a
time, in an order that rotates from round to round, so that drift in the
host's load falls on every variant alike. It reports, per path and variant,
the median requests per second and the ratio to ``off`` of the same round:
its median and its range over the rounds (the spread a shared host gives).

On a shared host that spread is wider than the few per cent being looked
for, so ``--micro`` also measures the cost where it arises, in one process
and without Redis: the lock signals of one acquire and one release
(``acquired`` then ``released``, as a locked request sends them), timed with
each variant's receivers connected, the variants interleaved, best of
several repeats. Its extra microseconds per request, set against the CPU
time a request takes in the end-to-end run (its cores over its requests per
second), bound what metrics can take off the requests per second.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from .common import (
    Gunicorn,
    PrivateRedis,
    fmt,
    loadavg,
    machine_facts,
    parser,
    show,
    write_results,
)
from .views import PATHS, log, run_load, site_env, start_site

VARIANTS = {"off": "", "prometheus": "prometheus", "opentelemetry": "opentelemetry"}
MEASURED = ("locked", "throttled")
TARGET = 0.97  # under 3% of requests per second at 5 ms of work


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser("metrics_cost", __doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int)
    p.add_argument("--duration", type=float, help="seconds per path per variant per round")
    p.add_argument("--work-ms", type=float, default=5.0, help="milliseconds each view sleeps")
    p.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma-separated, among: " + ", ".join(VARIANTS),
    )
    p.add_argument("--max-requests", type=int, default=200_000)
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--client-threads", type=int, default=4)
    p.add_argument("--gunicorn-workers", type=int, default=2)
    p.add_argument("--gunicorn-threads", type=int, default=4)
    p.add_argument(
        "--micro", action="store_true", help="also time the signals in-process (see above)"
    )
    p.add_argument("--micro-only", action="store_true", help="only the in-process timing")
    p.add_argument("--rst", action="store_true")
    p.add_argument("--no-save", action="store_true")
    cfg = p.parse_args(argv)
    cfg.rounds = cfg.rounds or (2 if cfg.quick else 6)
    cfg.duration = cfg.duration or (2.0 if cfg.quick else 4.0)
    cfg.variants = [v for v in cfg.variants.split(",") if v]
    unknown = set(cfg.variants) - set(VARIANTS)
    if unknown or "off" not in cfg.variants:
        p.error(f"--variants takes 'off' and some of {', '.join(VARIANTS)}")
    return cfg


def summarise(rounds: dict[tuple[str, str], list[float]], variants: list[str]) -> list[list[Any]]:
    rows = []
    for path in MEASURED:
        base = rounds[(path, "off")]
        for variant in variants:
            rps = rounds[(path, variant)]
            ratios = [v / b for v, b in zip(rps, base, strict=True) if b]
            rows.append(
                [
                    PATHS[path],
                    variant,
                    fmt(statistics.median(rps), 0),
                    fmt(statistics.median(ratios), 3),
                    f"{min(ratios):.3f} .. {max(ratios):.3f}",
                ]
            )
    return rows


MICRO_CALLS = 20_000
MICRO_REPEATS = 7


def micro(variants: list[str], redis_url: str) -> dict[str, dict[str, float]]:
    """Microseconds per locked request (one acquired + one released signal), per variant.

    Redis is only read by the OpenTelemetry gauges, every export interval.
    """
    import os
    import time

    import django
    import redis

    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.viewsite.settings"
    os.environ.setdefault("BENCH_DB", "0")
    os.environ["BENCH_METRICS"] = ""
    os.environ["BENCH_REDIS_URL"] = redis_url
    django.setup()
    from django.conf import settings
    from django.test import override_settings

    from django_redislock.core.drivers.lock import Lock
    from django_redislock.core.drivers.semaphore import Semaphore
    from django_redislock.ops import metrics
    from django_redislock.signals import observer

    from .viewsite.otel import setup as otel_setup

    if "opentelemetry" in variants:
        otel_setup()
    # Never connected: the signals only read the handle.
    client = redis.Redis(host="127.0.0.1", port=1)
    handles = {
        "locked": Lock(client, "bench:1", observer=observer),
        "throttled": Semaphore(client, "throttle:bench", 1000, observer=observer),
    }
    handles["locked"].metric_name = "bench:{key}"
    handles["throttled"].metric_name = "bench"
    for handle in handles.values():
        handle.fence = 123456

    def cycle(handle: Any, n: int) -> float:
        acquired, released = observer.acquired, observer.released
        start = time.perf_counter()
        for _ in range(n):
            acquired(handle, 0.0003)
            released(handle, 0.005)
        return (time.perf_counter() - start) / n * 1e6

    best: dict[str, dict[str, float]] = {p: {v: float("inf") for v in variants} for p in handles}
    for repeat in range(MICRO_REPEATS):
        turn = variants[repeat % len(variants) :] + variants[: repeat % len(variants)]
        for variant in turn:
            backends = [VARIANTS[variant]] if VARIANTS[variant] else []
            with override_settings(REDISLOCK={**settings.REDISLOCK, "METRICS": backends}):
                assert metrics.installed() == backends
                for path, handle in handles.items():
                    cycle(handle, 500)  # warm: label children, first spans
                    best[path][variant] = min(best[path][variant], cycle(handle, MICRO_CALLS))
    return best


def report_micro(
    cfg: argparse.Namespace, best: dict[str, dict[str, float]], cpu_us: dict[str, float] | None
) -> int:
    rows = []
    for path, by_variant in best.items():
        for variant, us in by_variant.items():
            extra = us - by_variant["off"]
            row = [PATHS[path], variant, fmt(us, 2), fmt(extra, 2)]
            if cpu_us and path in cpu_us:
                row += [fmt(cpu_us[path], 0), f"{extra / cpu_us[path]:.2%}"]
            rows.append(row)
    headers = ["path", "metrics", "us / request", "extra us"]
    if cpu_us:
        headers += ["CPU us / request (e2e, off)", "extra / CPU"]
    print(
        f"\nIn-process: signals of one acquire and one release, best of {MICRO_REPEATS} "
        f"x {MICRO_CALLS} (no Redis)\n"
    )
    show(headers, rows, cfg.rst)
    return 0


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    if cfg.micro_only:
        server = PrivateRedis().start()
        try:
            best = micro(cfg.variants, server.url)
        finally:
            server.stop()
        return report_micro(cfg, best, None)
    data: dict[str, Any] = {
        "command": "python -m benchmarks.metrics_cost "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "config": vars(cfg).copy(),
        "load_before": loadavg(),
    }
    server = PrivateRedis().start()
    sites: dict[str, Gunicorn] = {}
    rounds: dict[tuple[str, str], list[float]] = {
        (p, v): [] for p in MEASURED for v in cfg.variants
    }
    try:
        data["machine"] = machine_facts(server.version())
        for variant in cfg.variants:
            env = site_env(server.url, {"decorator": True, "middleware": True}, cfg.work_ms)
            env["BENCH_METRICS"] = VARIANTS[variant]
            sites[variant] = start_site(env, cfg.gunicorn_workers, cfg.gunicorn_threads)
        for variant, site in sites.items():  # warm every worker's code paths and connections
            for path in MEASURED:
                run_load(site.port, PATHS[path], f"warm-{variant}-{path}", cfg, 1.0, 500)
        order = list(cfg.variants)
        for r in range(cfg.rounds):
            turn = order[r % len(order) :] + order[: r % len(order)]
            for path in MEASURED:
                for variant in turn:
                    log(f"  round {r + 1}/{cfg.rounds}: {PATHS[path]} {variant}")
                    result = run_load(
                        sites[variant].port,
                        PATHS[path],
                        f"r{r}-{variant}-{path}",
                        cfg,
                        cfg.duration,
                        cfg.max_requests,
                    )
                    if result["errors"] or set(result["statuses"]) - {"200"}:
                        log(f"    non-200 or errors: {result['statuses']} {result['errors']}")
                    rounds[(path, variant)].append(result["rps"])
        for site in sites.values():
            site.stop()
        if cfg.micro:
            data["micro_us"] = micro(cfg.variants, server.url)
    finally:
        for site in sites.values():
            site.stop()
        server.stop()
    data["load_after"] = loadavg()
    data["rounds"] = {f"{p} {v}": rps for (p, v), rps in rounds.items()}
    rows = summarise(rounds, cfg.variants)
    data["rows"] = rows
    headers = ["path", "metrics", "req/s (median)", "vs off (median)", "vs off (range)"]
    m = data["machine"]
    print(f"{m['date_utc']}  {m['cpu']}, {m['cores']} cores, Python {m['python']}")
    print(
        f"gunicorn gthread {cfg.gunicorn_workers}x{cfg.gunicorn_threads} per variant, "
        f"load {cfg.clients}x{cfg.client_threads} connections, view work {cfg.work_ms:g} ms, "
        f"{cfg.rounds} rounds of {cfg.duration:g} s"
    )
    print(f"load averages before {data['load_before']}, after {data['load_after']}\n")
    show(headers, rows, cfg.rst)
    print(
        f"\ntarget: metrics cost under {1 - TARGET:.0%} of requests per second (ratio >= {TARGET})"
    )
    if cfg.micro:
        cpu_us = {
            p: m["cores"] * 1e6 / statistics.median(rounds[(p, "off")])
            for p in MEASURED
            if statistics.median(rounds[(p, "off")])
        }
        data["cpu_us_per_request"] = cpu_us
        report_micro(cfg, data["micro_us"], cpu_us)
    if not cfg.no_save:
        print(f"results: {write_results('metrics_cost', data)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
