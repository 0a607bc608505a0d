"""Uncontended latency of this checkout's core against another version's, interleaved.

Usage::

    mkdir /tmp/old && git archive <commit> django_redislock | tar -x -C /tmp/old
    python -m benchmarks.versus /tmp/old/django_redislock --rounds 20

Both cores are loaded in one process (the other one under the name
``othercore``: the core imports nothing from the Django layer) and timed in
turn against the SET NX + EVALSHA baseline on one private Redis, the order
rotated each round, so that the machine's load falls on all of them alike.
For each: one handle taking one name over and over, and a new handle on a
name never used before each time (what a decorator does). Reported: p50 per
acquire+release, and p50 and client CPU as multiples of the baseline made
the same way.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import sys
import time
from pathlib import Path
from typing import Any

from .common import PrivateRedis, percentile, table
from .impls import IMPLS


def _load_core(package_dir: Path) -> Any:
    core = package_dir / "core"
    spec = importlib.util.spec_from_file_location(
        "othercore", core / "__init__.py", submodule_search_locations=[str(core)]
    )
    if spec is None or spec.loader is None:
        raise SystemExit(f"no core package under {package_dir}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["othercore"] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.versus", description=__doc__)
    p.add_argument("other", type=Path, help="the django_redislock directory of the other version")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--iters", type=int, default=200, help="pairs per implementation per round")
    cfg = p.parse_args(argv)
    other = _load_core(cfg.other)
    import django_redislock.core as this

    server = PrivateRedis().start()
    try:
        client = server.client()
        counter = itertools.count()
        baseline = IMPLS["baseline"].factory

        def cycle(handle: Any) -> Any:
            def op() -> None:
                if not handle.acquire():
                    raise RuntimeError("uncontended acquire failed")
                handle.release()

            return op

        def fresh(make: Any) -> Any:
            def op() -> None:
                handle = make(f"versus:{next(counter)}")
                if not handle.acquire():
                    raise RuntimeError("uncontended acquire failed")
                handle.release()

            return op

        ops = {
            "baseline": cycle(baseline(client, "versus:b", 10.0, 10.0)),
            "other": cycle(other.Lock(client, "versus:o", ttl=10.0, wait=10.0)),
            "this": cycle(this.Lock(client, "versus:t", ttl=10.0, wait=10.0)),
            "baseline, new handle+name": fresh(lambda n: baseline(client, n, 10.0, 10.0)),
            "other, new handle+name": fresh(lambda n: other.Lock(client, n, ttl=10.0, wait=10.0)),
            "this, new handle+name": fresh(lambda n: this.Lock(client, n, ttl=10.0, wait=10.0)),
        }
        names = list(ops)
        samples: dict[str, list[int]] = {k: [] for k in names}
        cpu = dict.fromkeys(names, 0.0)
        for op in ops.values():  # warm: connections, scripts, functions
            for _ in range(200):
                op()
        clock = time.perf_counter_ns
        for r in range(cfg.rounds):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                op = ops[name]
                c0 = time.process_time()
                for _ in range(cfg.iters):
                    t0 = clock()
                    op()
                    samples[name].append(clock() - t0)
                cpu[name] += time.process_time() - c0
        client.close()
    finally:
        server.stop()
    p50 = {k: percentile(v, 50) / 1000 for k, v in samples.items()}
    rows = []
    for name in names:
        base = "baseline, new handle+name" if "new handle" in name else "baseline"
        rows.append(
            [
                name,
                f"{p50[name]:.1f}",
                f"{p50[name] / p50[base]:.2f}",
                f"{cpu[name] / cpu[base]:.2f}",
            ]
        )
    print(f"other: {cfg.other}\n")
    print(table(["acquire+release", "p50 us", "p50 x base", "client CPU x base"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
