"""Several names at once: ``MultiLock`` against k single locks taken one by one.

Usage::

    python -m benchmarks.multi              # k = 1, 2, 5, 10; 5 rounds
    python -m benchmarks.multi --quick

Uncontended, on a private redis-server (unix socket), with a fresh handle per
acquisition on fresh names as the decorator does. Per k it times:

* ``multi``    ``MultiLock(client, names)``: acquire + release;
* ``singles``  k ``Lock`` handles acquired one by one, then released;
* ``bare``     k times ``SET NX PX`` + an ``EVALSHA`` compare-and-delete, the
               least any lock can do per name.

Variants are interleaved round-robin, the order rotated each round. The
table gives p50 per acquire+release of all k names, and ratios to ``singles``
and ``bare``. Results go to ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import itertools
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
from django_redislock.core import Lock, MultiLock

RELEASE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)


def _variants(client: Any, k: int) -> dict[str, Callable[[int], None]]:
    release_sha = client.script_load(RELEASE)

    def names(i: int) -> list[str]:
        return [f"bench:{i}:{j}" for j in range(k)]

    def multi(i: int) -> None:
        lock = MultiLock(client, names(i), ttl=10, wait=0)
        assert lock.acquire()
        lock.release()

    def singles(i: int) -> None:
        locks = [Lock(client, name, ttl=10, wait=0) for name in names(i)]
        for lock in locks:
            assert lock.acquire()
        for lock in locks:
            lock.release()

    def bare(i: int) -> None:
        keys = [f"bare:{name}" for name in names(i)]
        for key in keys:
            assert client.set(key, "t", nx=True, px=10_000)
        for key in keys:
            client.evalsha(release_sha, 1, key, "t")

    return {"multi": multi, "singles": singles, "bare": bare}


def run(cfg: argparse.Namespace) -> dict[str, Any]:
    counter = itertools.count()
    results: dict[str, Any] = {"ks": cfg.k, "rounds": cfg.rounds, "per_round": cfg.n, "cells": {}}
    with private_redis() as server:
        client = server.client()
        results["machine"] = machine_facts(str(client.info("server")["redis_version"]))
        for k in cfg.k:
            variants = _variants(client, k)
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
            p50 = {v: statistics.median(s) for v, s in samples.items()}
            results["cells"][str(k)] = {"p50_us": p50}
        client.close()
    return results


def render(data: dict[str, Any], rst: bool = False) -> str:
    headers = [
        "names",
        "MultiLock p50 us",
        "k single Locks p50 us",
        "k bare SET+EVALSHA p50 us",
        "multi / singles",
        "multi / bare",
    ]
    rows = []
    for k, cell in data["cells"].items():
        p = cell["p50_us"]
        rows.append(
            [
                k,
                fmt(p["multi"], 0),
                fmt(p["singles"], 0),
                fmt(p["bare"], 0),
                fmt(ratio(p["multi"], p["singles"]), 2),
                fmt(ratio(p["multi"], p["bare"]), 2),
            ]
        )
    return (rst_table if rst else table)(headers, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 100 per variant")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-n", type=int, default=300, help="acquisitions per variant per round")
    parser.add_argument("--k", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 5, 10])
    parser.add_argument("--rst", action="store_true", help="print the table as RST")
    cfg = parser.parse_args(argv)
    if cfg.quick:
        cfg.rounds, cfg.n = 1, 100
    data = run(cfg)
    path = write_results("multi", data)
    print(render(data, rst=cfg.rst))
    print(f"\nresults: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
