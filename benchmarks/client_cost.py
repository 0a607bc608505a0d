"""What a lock costs its client, in instructions: a count a busy machine does not move.

Usage::

    python -m benchmarks.client_cost                     # uncontended, ~4 min
    python -m benchmarks.client_cost --contended 8       # a contended section, 8 processes
    python -m benchmarks.client_cost --other ../older    # another checkout's django_redislock
    python -m benchmarks.client_cost --contended 8 --footprint   # and what a section touches
    python -m benchmarks.client_cost --calls             # one script call, ours and redis-py's

Client CPU time per operation moves by tens of percent on a shared two-core
host from one run to the next, more than most changes to the client move it.
Instructions do not. For each implementation this runs a Python process under
``valgrind --tool=callgrind`` doing N operations, then 5N, against a private
``redis-server`` (unix socket, stopped by its PID): the difference over 4N is
what one operation costs the client, with interpreter start-up, imports and
the first connections cancelled out. Everything the process runs is counted:
this library, redis-py, hiredis, the interpreter and the system calls' user
side.

An operation is an acquire+release pair on a new handle and a new name (the
decorator's path), or, for ``decorator``, one call of a function under
``@redis_locked("bench:dec:{n}")`` with Django set up around it (what the
decorator adds to the pair). With ``--contended W`` it is a critical section
(a new handle, a ``GET`` and a ``SET`` on the same server inside) while W-1
other processes, not counted, take turns on the same lock: the counted one
queues behind them and is handed the lease, as each does. Instructions are
not time: the same count runs slower when it touches more code and data.

``--footprint`` adds two figures of how much an operation touches, also
counts: the Python functions (and built-ins) the worker calls in at least
half of its operations (``cProfile``, a run of N operations), and the misses
per operation of a simulated 256 KB last-level cache (callgrind's cache
simulation in the same two runs, 32 KB first-level caches): a small cache,
like what a process finds of its own between two turns when others have run
on its core. Needs ``valgrind``.

``--calls`` counts one script call instead of a lock: the same script, with
the acquire's three keys and eight arguments, through the library's bounded
call (``core/io/calls.py``: its breaker, its own checkout, one connect
without retries) and through redis-py's ``Redis.evalsha`` (its
``execute_command``, pool and retries), which the bounded call replaces;
then the same on asyncio clients (``core/io/calls_async.py`` and redis-py's
asyncio ``evalsha``), each call run to its end by one event loop.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .common import fmt, parser, private_redis, show
from .impls import IMPLS

DECORATOR = "decorator"
# ``--calls``: one script call through the library's bounded call, and through redis-py.
CALLS = {
    "call:library": "bounded call (core/io/calls.py)",
    "call:redis_py": "Redis.evalsha",
    "call:library_async": "bounded call, asyncio (core/io/calls_async.py)",
    "call:redis_py_async": "redis.asyncio Redis.evalsha",
}
# The directory of another django_redislock to measure (``--other``).
_OTHER = "REDISLOCK_BENCH_OTHER"
_SUMMARY = re.compile(rb"^(?:summary|totals):((?:[ \t]+\d+)+)", re.MULTILINE)
_EVENTS = re.compile(rb"^events:((?:[ \t]+\w+)+)", re.MULTILINE)
# Where the worker writes its cProfile statistics (``--footprint``).
_PROFILE = "REDISLOCK_BENCH_PROFILE"
# The library's own functions, by the path of their file.
_LIBRARY = f"{os.sep}django_redislock{os.sep}"
# The simulated caches of --footprint: 32 KB first-level, a 256 KB last level.
CACHES = ["--cache-sim=yes", "--I1=32768,8,64", "--D1=32768,8,64", "--LL=262144,8,64"]


# -- the measured side (``--worker``) -------------------------------------------------
def _operation(what: str, url: str, contended: bool) -> Any:
    """A callable doing one operation of ``what`` against the server at ``url``."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=60.0)
    names = itertools.count()
    if what in CALLS:
        return _script_call(client, what, url)
    if what == DECORATOR:
        import django
        from django.conf import settings

        settings.configure(
            INSTALLED_APPS=["django_redislock"],
            DATABASES={},
            CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url}},
            REDISLOCK={"TIMEOUT": 60.0, "WAIT": 60.0},
        )
        django.setup()
        from django_redislock import redis_locked

        @redis_locked("bench:dec:{n}")
        def work(n: int) -> int:
            return n

        return lambda: work(next(names))
    factory = IMPLS[what].factory
    section = redis.Redis.from_url(url, socket_timeout=60.0)

    def pair() -> None:
        name = "bench:contended" if contended else f"bench:{what}:{next(names)}"
        handle = factory(client, name, 60.0, 60.0)
        if not handle.acquire():
            raise RuntimeError(f"{what}: an acquire gave up")
        if contended:
            section.set("bench:counter", int(section.get("bench:counter") or 0) + 1)
        handle.release()

    return pair


def _script_call(client: Any, what: str, url: str) -> Any:
    """One call of a script that returns at once, with the acquire's shape
    (three keys, eight arguments), through the library or through redis-py;
    the ``_async`` ones on an asyncio client, each run to its end by one
    event loop (the loop's own steps are the same on both paths)."""
    from django_redislock.core.engine.scripts import Script
    from django_redislock.core.io.calls import run

    source = b"return 1"
    script = Script("bench", source, hashlib.sha1(source).hexdigest())
    client.script_load(source)
    keys = (b"bench:{c}:lease", b"bench:{c}:queue", b"bench:{c}:state")
    args = (b"token", b"60000", b"", b'{"pid": 1}', b"60000", b"p-ch", b"61000", b"1")
    if what == "call:library":
        return lambda: run(client, script, keys, args)
    if what == "call:redis_py":
        return lambda: client.evalsha(script.sha, len(keys), *keys, *args)
    import asyncio

    import redis.asyncio

    from django_redislock.core.io.calls_async import run_async

    aclient = redis.asyncio.Redis.from_url(url, socket_timeout=60.0)
    loop = asyncio.new_event_loop()
    if what == "call:library_async":
        return lambda: loop.run_until_complete(run_async(aclient, script, keys, args))
    return lambda: loop.run_until_complete(aclient.evalsha(script.sha, len(keys), *keys, *args))


def worker(what: str, ops: int, url: str, contended: bool) -> None:
    """``ops`` operations after a few unmeasured ones; ``ops`` 0: until killed."""
    if os.environ.get(_OTHER):
        sys.path.insert(0, os.environ[_OTHER])
    operation = _operation(what, url, contended)
    for _ in range(20):  # scripts loaded, wake-up channel subscribed, caches filled
        operation()
    profile_to = os.environ.get(_PROFILE)
    if profile_to and ops:
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
        for _ in range(ops):
            operation()
        profile.disable()
        profile.dump_stats(profile_to)
        return
    for _ in range(ops) if ops else itertools.count():
        operation()


# -- the measuring side --------------------------------------------------------------
def _command(what: str, ops: int, url: str, contended: bool) -> list[str]:
    shape = "shared" if contended else "fresh"  # one name for all, or a new one each
    return [sys.executable, "-m", "benchmarks.client_cost", "--worker", what, str(ops), url, shape]


def _child_variables(other: str | None) -> dict[str, str]:
    root = str(Path(__file__).resolve().parent.parent)
    path = [p for p in (root, os.environ.get("PYTHONPATH")) if p]
    # The worker puts the library first on its path itself: the directory
    # may hold a ``benchmarks`` package of its own, without this module.
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), _OTHER: other or ""}


def _counted(
    what: str,
    ops: int,
    url: str,
    contended: bool,
    variables: dict[str, str],
    caches: bool = False,
) -> dict[str, int]:
    """Callgrind's totals for one worker process doing ``ops`` operations:
    ``Ir`` (instructions) and, with ``caches``, the simulated caches' events."""
    with tempfile.TemporaryDirectory(prefix="redislock-bench-") as tmp:
        out = Path(tmp) / "callgrind.out"
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
            + (CACHES if caches else [])
            + _command(what, ops, url, contended),
            env=variables,
            cwd=tmp,  # not the checkout: the library comes from PYTHONPATH alone
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=3600,
        )
        return totals_of(out.read_bytes())


def totals_of(report: bytes) -> dict[str, int]:
    """Each event's total from a callgrind output file: its ``events:`` line
    names them, its ``summary:`` (or ``totals:``) line counts them."""
    events, summary = _EVENTS.search(report), _SUMMARY.search(report)
    if events is None or summary is None:
        raise RuntimeError("callgrind wrote no totals")
    names = events.group(1).decode().split()
    return dict(zip(names, map(int, summary.group(1).split()), strict=True))


def _functions(
    what: str, ops: int, url: str, contended: bool, variables: dict[str, str]
) -> tuple[int, int]:
    """The functions a worker doing ``ops`` operations calls in at least half
    of them: all, and this library's own."""
    import pstats

    with tempfile.TemporaryDirectory(prefix="redislock-bench-") as tmp:
        stats = Path(tmp) / "profile.out"
        subprocess.run(
            _command(what, ops, url, contended),
            env={**variables, _PROFILE: str(stats)},
            cwd=tmp,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=600,
        )
        profile = pstats.Stats(str(stats))
        return called_in_half(profile, ops), called_in_half(profile, ops, _LIBRARY)


def called_in_half(stats: Any, ops: int, within: str = "") -> int:
    """How many functions ``stats`` (``pstats.Stats``) saw called at least
    ``ops / 2`` times: those that run in an operation's usual path; with
    ``within``, only those of a file whose path holds it."""
    return sum(
        1 for (path, _, _), row in stats.stats.items() if row[1] * 2 >= ops and within in path
    )


def per_operation(what: str, ops: int, cfg: argparse.Namespace) -> dict[str, float]:
    """Instructions per operation and, with ``--footprint``, the functions
    called and the simulated last-level cache's misses per operation."""
    variables = _child_variables(cfg.other)
    with private_redis() as server:
        others: list[subprocess.Popen[bytes]] = []
        try:
            for _ in range(max(0, cfg.contended - 1)):
                others.append(
                    subprocess.Popen(
                        _command(what, 0, server.url, True),
                        env=variables,
                        cwd=server.dir,
                        stderr=subprocess.DEVNULL,
                    )
                )
            contended = cfg.contended > 0
            short = _counted(what, ops, server.url, contended, variables, cfg.footprint)
            long = _counted(what, 5 * ops, server.url, contended, variables, cfg.footprint)
            figures = {event: (long[event] - short[event]) / (4 * ops) for event in short}
            if cfg.footprint:
                called, own = _functions(what, ops, server.url, contended, variables)
                figures["functions"], figures["own functions"] = called, own
        finally:
            for proc in others:  # ours, by PID
                proc.kill()
                proc.wait(30)
    return figures


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser("client_cost", __doc__)
    p.add_argument("--ops", type=int, default=200, help="N, operations in the shorter run")
    p.add_argument(
        "--impls",
        default="ours,redis_py,python_redis_lock,fifo_floor,decorator",
        help="comma-separated implementations (benchmarks/impls.py), and 'decorator'",
    )
    p.add_argument("--contended", type=int, default=0, metavar="W", help="W processes on one lock")
    p.add_argument(
        "--other",
        metavar="DIR",
        help="a directory holding another django_redislock, imported by the measured processes",
    )
    p.add_argument(
        "--footprint",
        action="store_true",
        help="also the functions called and a simulated 256 KB cache's misses per operation",
    )
    p.add_argument(
        "--calls",
        action="store_true",
        help="count one script call through the library and through redis-py instead",
    )
    p.add_argument("--rst", action="store_true", help="also print the table as reStructuredText")
    p.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    if cfg.worker:
        what, ops, url, shape = cfg.worker
        worker(what, int(ops), url, shape == "shared")
        return 0
    if cfg.calls:
        if cfg.contended or cfg.footprint:
            raise SystemExit(
                "--calls counts an uncontended call alone: drop --contended and --footprint"
            )
        return _main_calls(cfg)
    keys = [k for k in cfg.impls.split(",") if k]
    unknown = [k for k in keys if k != DECORATOR and k not in IMPLS]
    if unknown:
        raise SystemExit(f"unknown implementation(s) {unknown}; choose from {[*IMPLS, DECORATOR]}")
    if cfg.contended and DECORATOR in keys:
        keys.remove(DECORATOR)  # one name per call: never contended
    keys = [k for k in keys if k == DECORATOR or IMPLS[k].missing() is None]
    results: dict[str, dict[str, float]] = {}
    for key in keys:
        print(f"  {key} ...", file=sys.stderr, flush=True)
        results[key] = per_operation(key, cfg.ops, cfg)
    base = results["redis_py"]["Ir"] if "redis_py" in results else None
    rows = []
    for key, figures in results.items():
        row = [
            "@redis_locked function, new names" if key == DECORATOR else IMPLS[key].label,
            f"{figures['Ir']:,.0f}",
            fmt(figures["Ir"] / base, 2) if base else "-",
        ]
        if cfg.footprint:
            misses = figures["ILmr"] + figures["DLmr"] + figures["DLmw"]
            row += [
                f"{figures['functions']:,.0f}",
                f"{figures['own functions']:,.0f}",
                f"{misses:,.0f}",
            ]
        rows.append(row)
    headers = ["implementation", "client instructions", "x redis-py"]
    if cfg.footprint:
        headers += ["functions called", "of this library", "256 KB cache misses"]
    shape = (
        f"a contended critical section, {cfg.contended} processes on one lock"
        if cfg.contended
        else "an uncontended acquire+release, a new handle and name each"
    )
    print(f"Client instructions per operation (callgrind; {shape})\n")
    show(headers, rows, cfg.rst)
    return 0


def _main_calls(cfg: argparse.Namespace) -> int:
    counts = {}
    for key in CALLS:
        print(f"  {key} ...", file=sys.stderr, flush=True)
        counts[key] = per_operation(key, cfg.ops, cfg)["Ir"]
    rows = []
    for key, n in counts.items():
        # Each against redis-py's own call of its kind: sync with sync, asyncio with asyncio.
        base = counts[key.replace("library", "redis_py")]
        rows.append([CALLS[key], f"{n:,.0f}", fmt(n / base, 2)])
    print("Client instructions per script call (callgrind; uncontended, three keys, eight args)\n")
    show(["path", "client instructions", "x redis-py"], rows, cfg.rst)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
