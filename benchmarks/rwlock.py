"""The read-write lock against the plain lock: uncontended cost, and readers' throughput.

Usage::

    python -m benchmarks.rwlock             # 5 rounds; 8 processes for 3 s each
    python -m benchmarks.rwlock --quick

On a private redis-server (unix socket), with a fresh handle per acquisition
as the decorator makes one:

* uncontended, on fresh names, p50 of acquire + release for ``Lock``, a
  ``ReadWriteLock`` reader and a ``ReadWriteLock`` writer, interleaved
  round-robin with the order rotated each round;
* throughput: ``--procs`` processes (8) each acquire and release one name in a
  loop for ``--seconds``, holding it ``--hold`` ms (1) each time; readers of one
  ``ReadWriteLock`` share it, while ``Lock`` holders take turns. Acquisitions
  per second, all processes together.

Results go to ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import (
    fmt,
    machine_facts,
    private_redis,
    ratio,
    rst_table,
    table,
    write_results,
)
from django_redislock.core import Lock, ReadWriteLock


def _uncontended(client: Any) -> dict[str, Callable[[int], None]]:
    def lock(i: int) -> None:
        handle = Lock(client, f"bench:l:{i}", ttl=10, wait=0)
        assert handle.acquire()
        handle.release()

    def read(i: int) -> None:
        handle = ReadWriteLock(client, f"bench:r:{i}", "read", ttl=10, wait=0)
        assert handle.acquire()
        handle.release()

    def write(i: int) -> None:
        handle = ReadWriteLock(client, f"bench:w:{i}", "write", ttl=10, wait=0)
        assert handle.acquire()
        handle.release()

    return {"lock": lock, "read": read, "write": write}


def _throughput_worker(
    url: str, kind: str, start: float, seconds: float, hold: float, out: Any
) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5)
    done = 0
    time.sleep(max(0.0, start - time.time()))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if kind == "lock":
            handle: Lock = Lock(client, "bench:shared", ttl=10, wait=30)
        else:
            handle = ReadWriteLock(client, "bench:shared", "read", ttl=10, wait=30)
        assert handle.acquire()
        if hold:
            time.sleep(hold)
        handle.release()
        done += 1
    out.value = done
    client.close()
    os._exit(0)


def _throughput(url: str, kind: str, cfg: argparse.Namespace) -> float:
    ctx = multiprocessing.get_context("fork")
    counts = [ctx.Value("q", 0, lock=False) for _ in range(cfg.procs)]
    start = time.time() + 0.5
    procs = [
        ctx.Process(
            target=_throughput_worker,
            args=(url, kind, start, cfg.seconds, cfg.hold / 1000, out),
        )
        for out in counts
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(cfg.seconds + 60)
    if any(p.exitcode != 0 for p in procs):
        raise SystemExit(f"a {kind} worker failed: exit codes {[p.exitcode for p in procs]}")
    return sum(c.value for c in counts) / cfg.seconds


def run(cfg: argparse.Namespace) -> dict[str, Any]:
    counter = itertools.count()
    results: dict[str, Any] = {
        "rounds": cfg.rounds,
        "per_round": cfg.n,
        "procs": cfg.procs,
        "seconds": cfg.seconds,
        "hold_ms": cfg.hold,
    }
    with private_redis() as server:
        client = server.client()
        results["machine"] = machine_facts(str(client.info("server")["redis_version"]))
        variants = _uncontended(client)
        samples: dict[str, list[float]] = {v: [] for v in variants}
        for v in variants.values():  # warm up scripts and connections
            for _ in range(20):
                v(next(counter))
        for r in range(cfg.rounds):
            order = list(variants)
            order = order[r % len(order) :] + order[: r % len(order)]
            for v in order:
                op = variants[v]
                for _ in range(cfg.n):
                    i = next(counter)
                    t = time.perf_counter_ns()
                    op(i)
                    samples[v].append((time.perf_counter_ns() - t) / 1000)
        results["p50_us"] = {v: statistics.median(s) for v, s in samples.items()}
        client.close()
        results["per_second"] = {
            "lock": _throughput(server.url, "lock", cfg),
            "read": _throughput(server.url, "read", cfg),
        }
    return results


def render(data: dict[str, Any], rst: bool = False) -> str:
    p = data["p50_us"]
    rate = data["per_second"]
    headers = ["measure", "Lock", "ReadWriteLock", "ratio (rw / Lock)"]
    rows = [
        ["uncontended read, p50 us", fmt(p["lock"], 0), fmt(p["read"], 0)],
        ["uncontended write, p50 us", fmt(p["lock"], 0), fmt(p["write"], 0)],
        [
            f"{data['procs']} processes, {data['hold_ms']} ms hold: acquisitions/s",
            fmt(rate["lock"], 0),
            fmt(rate["read"], 0),
        ],
    ]
    rows[0].append(fmt(ratio(p["read"], p["lock"]), 2))
    rows[1].append(fmt(ratio(p["write"], p["lock"]), 2))
    rows[2].append(fmt(ratio(rate["read"], rate["lock"]), 2))
    return (rst_table if rst else table)(headers, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 100; 1 s of throughput")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-n", type=int, default=300, help="acquisitions per variant per round")
    parser.add_argument("--procs", type=int, default=8, help="processes for the throughput run")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of a throughput run")
    parser.add_argument("--hold", type=float, default=1.0, help="ms each holder keeps it")
    parser.add_argument("--rst", action="store_true", help="print the table as RST")
    cfg = parser.parse_args(argv)
    if cfg.quick:
        cfg.rounds, cfg.n, cfg.seconds = 1, 100, 1.0
    data = run(cfg)
    path = write_results("rwlock", data)
    print(render(data, rst=cfg.rst))
    print(f"\nresults: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
