"""Lock benchmark: django_redislock.Lock against other Redis locks, in one run.

Usage::

    python -m benchmarks.locks --quick          # about a minute
    python -m benchmarks.locks                  # the full run, a few minutes
    python -m benchmarks.locks --rounds 5 --duration 5 --workers 2,8,32
    python -m benchmarks.locks --phases contended --workers 8,32 \\
        --handle reused,new --section shm,redis --breakdown

The harness starts its own private redis-server (unix socket by default,
``--tcp`` for a loopback port), runs every phase against it and stops it by
its PID at the end. Implementations are interleaved round-robin, with the
order rotated each round, so slow drift of the machine (other processes, CPU
frequency) spreads over all of them instead of favouring one.

Phases:

1. uncontended acquire+release latency in one process, with a PING round
   trip measured in the same rounds as the unit of comparison;
2. round trips and server time per acquire+release (from the SLOWLOG);
3. release-to-waiter handoff latency between two forked processes;
4. contended throughput: N forked workers loop acquire / critical section /
   release on one lock for a fixed time; a non-atomic read-modify-write on
   shared memory inside the critical section counts mutual-exclusion
   violations, and per-worker counts give fairness. ``--handle new`` makes a
   new handle per acquisition (what the decorator does per call) instead of
   one per worker; ``--section redis`` makes the section a GET and a SET of a
   counter on the same Redis (a separate client), so that the server's one
   thread serves the section's commands beside the lock's. Every command the
   server ran (INFO commandstats, those run by scripts included) is counted
   per critical section; ``--breakdown`` also traces one cell per
   implementation with MONITOR and splits those commands by script, and
   ``--cpu-parts`` splits each worker's client CPU per critical section into
   making the handle, acquiring, the section and releasing.

The table goes to stdout, everything measured to ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import cProfile
import gc
import io
import itertools
import json
import math
import mmap
import multiprocessing as mp
import os
import pstats
import random
import shutil
import statistics
import struct
import sys
import tempfile
import time
import traceback
from array import array
from pathlib import Path
from typing import Any, TypeVar

from .common import (
    PrivateRedis,
    fmt,
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
from .impls import IMPLS, semaphore_factory

# The parts of a contended critical section whose client CPU --cpu-parts
# measures, in each worker's own thread.
CPU_PARTS = ("handle", "acquire", "section", "release")

CTX = mp.get_context("fork")
# Suffix of the uncontended rows that make a new handle on a new name per call.
FRESH = "+fresh"
NS = 1_000_000_000
T = TypeVar("T")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def rotated(items: list[T], r: int) -> list[T]:
    k = r % len(items)
    return items[k:] + items[:k]


# =============================================================================
# 1. uncontended latency
# =============================================================================
def _time_block(op: Any, n: int) -> list[int]:
    out = []
    clock = time.perf_counter_ns
    gc.collect()
    for _ in range(n):
        t0 = clock()
        op()
        out.append(clock() - t0)
    return out


def _cycle(handle: Any) -> Any:
    def op() -> None:
        if not handle.acquire():
            raise RuntimeError("uncontended acquire failed")
        handle.release()

    return op


def _fresh_cycle(key: str, client: Any, cfg: argparse.Namespace) -> Any:
    """A new handle on a name never used before, each time: what a decorator
    or a view does, as against one handle taking one lock over and over."""
    factory = IMPLS[key].factory
    counter = itertools.count()
    prefix = f"bench:fresh:{key}:"

    def op() -> None:
        handle = factory(client, f"{prefix}{next(counter)}", cfg.ttl, cfg.wait)
        if not handle.acquire():
            raise RuntimeError("uncontended acquire failed")
        handle.release()

    return op


def _decorated_cycle(server: PrivateRedis, cfg: argparse.Namespace) -> Any | None:
    """``@redis_locked`` on a plain function, a distinct name per call; None
    (and a note) when Django or django-redis cannot be set up here."""
    try:
        import django
        from django.conf import settings
    except ImportError as exc:
        log(f"decorator: Django not importable ({exc}), skipped")
        return None
    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=["django_redislock"],
            DATABASES={},
            CACHES={
                "default": {
                    "BACKEND": "django_redis.cache.RedisCache",
                    "LOCATION": server.url,
                }
            },
            REDISLOCK={"TIMEOUT": cfg.ttl, "WAIT": cfg.wait},
        )
        django.setup()
    try:
        from django_redislock import redis_locked
    except ImportError as exc:
        log(f"decorator: not importable ({exc}), skipped")
        return None

    @redis_locked("bench:dec:{n}")
    def work(n: int) -> int:
        return n

    counter = itertools.count()

    def op() -> None:
        work(next(counter))

    return op


def uncontended(server: PrivateRedis, impls: list[str], cfg: argparse.Namespace) -> dict[str, Any]:
    client = server.client()
    ops: dict[str, Any] = {"PING": client.ping}
    for key in impls:
        ops[key] = _cycle(IMPLS[key].factory(client, f"bench:unc:{key}", cfg.ttl, cfg.wait))
    for key in impls:
        ops[f"{key}{FRESH}"] = _fresh_cycle(key, client, cfg)
    if "ours" in impls:
        decorated = _decorated_cycle(server, cfg)
        if decorated is not None:
            ops["decorator"] = decorated
    make_sem = semaphore_factory()
    if make_sem is not None:
        sem = make_sem(client, "bench:unc:semaphore", 10, cfg.ttl, cfg.wait)
        ops["semaphore"] = _cycle(sem)
    else:
        log("semaphore: django_redislock.core.drivers.semaphore not importable yet, skipped")
    names = list(ops)
    for name in names:  # warm: connections, script caches, code paths
        _time_block(ops[name], cfg.warmup_iters)
    samples: dict[str, list[int]] = {name: [] for name in names}
    cpu: dict[str, float] = dict.fromkeys(names, 0.0)
    for r in range(cfg.rounds_unc):
        for name in rotated(names, r):
            c0 = time.process_time()
            samples[name] += _time_block(ops[name], cfg.iters)
            cpu[name] += time.process_time() - c0
    client.close()
    result: dict[str, Any] = {}
    for name, values in samples.items():
        result[name] = {
            "n": len(values),
            "p50_us": percentile(values, 50) / 1000,
            "p99_us": percentile(values, 99) / 1000,
            "mean_us": statistics.fmean(values) / 1000,
            # CPU this process spent per operation (client library + redis-py),
            # which does not grow when the machine is busy the way latency does.
            "client_cpu_us": cpu[name] / len(values) * 1e6,
        }
    return result


# =============================================================================
# 2. round trips and server time per acquire+release
# =============================================================================
def round_trips(server: PrivateRedis, impls: list[str], cfg: argparse.Namespace) -> dict[str, Any]:
    """Top-level commands (= round trips here: nothing pipelines) and their server time.

    The SLOWLOG with a threshold of 0 records every top-level command with its
    execution time, and not the commands a script runs inside Redis.
    """
    admin = server.client()
    client = server.client()
    n = 200
    out: dict[str, Any] = {}
    handles = {k: IMPLS[k].factory(client, f"bench:rt:{k}", cfg.ttl, cfg.wait) for k in impls}
    make_sem = semaphore_factory()
    if make_sem is not None:
        handles["semaphore"] = make_sem(client, "bench:rt:semaphore", 10, cfg.ttl, cfg.wait)
    admin.config_set("slowlog-max-len", 100_000)
    try:
        for key, handle in handles.items():
            _time_block(_cycle(handle), 20)
            admin.config_set("slowlog-log-slower-than", 0)
            admin.slowlog_reset()
            _time_block(_cycle(handle), n)
            admin.config_set("slowlog-log-slower-than", -1)
            entries = admin.slowlog_get(100_000)
            # Commands a script runs inside Redis are logged too, with no
            # client address: they are server work, not round trips.
            inner = [e for e in entries if e.get("client_address", b"").startswith(b"?")]
            mine = [
                e
                for e in entries
                if not e.get("client_address", b"").startswith(b"?")
                and not _is_admin(e.get("command", b""))
            ]
            commands: dict[str, int] = {}
            for e in mine:
                cmd = e["command"]
                word = cmd.split()[0] if isinstance(cmd, bytes) else str(cmd).split()[0]
                word = word.decode() if isinstance(word, bytes) else word
                commands[word.upper()] = commands.get(word.upper(), 0) + 1
            # Logging every command slows scripts down, so the server time
            # comes from a second pass with the SLOWLOG off: per-call times of
            # the top-level commands from INFO commandstats.
            admin.config_resetstat()
            _time_block(_cycle(handle), n)
            stats = admin.info("commandstats")
            server_us = 0.0
            for word, count in commands.items():
                st = stats.get(f"cmdstat_{word.lower()}")
                if st:
                    server_us += count / n * float(st["usec_per_call"])
            out[key] = {
                "round_trips": len(mine) / n,
                "server_us": server_us,
                "server_us_slowlog": sum(e["duration"] for e in mine) / n,
                "commands": {c: v / n for c, v in sorted(commands.items())},
                "script_commands": len(inner) / n,
            }
    finally:
        admin.config_set("slowlog-log-slower-than", 10_000)
        admin.close()
        client.close()
    return out


def _is_admin(cmd: Any) -> bool:
    text = cmd.decode(errors="replace") if isinstance(cmd, bytes) else str(cmd)
    word = text.split()[0].upper() if text.split() else ""
    return word in {"SLOWLOG", "CONFIG", "CLIENT", "HELLO"}


# =============================================================================
# 3. handoff latency
# =============================================================================
def _handoff_holder(url: str, schedule: list[str], cfg: Any, conn: Any, shm: mmap.mmap) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5.0)
    handles = {
        k: IMPLS[k].factory(client, f"bench:handoff:{k}", cfg.ttl, cfg.wait) for k in set(schedule)
    }
    rnd = random.Random(1)
    for i, key in enumerate(schedule):
        h = handles[key]
        if not h.acquire():
            raise RuntimeError(f"holder could not acquire {key}")
        conn.send(i)
        if conn.recv() != ("waiting", i):
            raise RuntimeError("handoff protocol out of step")
        # The waiter is now inside acquire(); hold for a random while so that
        # polling implementations are caught at random points of their cycle.
        time.sleep(cfg.hold_min + rnd.random() * cfg.hold_jitter)
        struct.pack_into("q", shm, 8 * i, time.monotonic_ns())
        h.release()
        if conn.recv() != ("done", i):
            raise RuntimeError("handoff protocol out of step")
    conn.send(None)


def _handoff_waiter(url: str, schedule: list[str], cfg: Any, conn: Any, shm: mmap.mmap) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5.0)
    handles = {
        k: IMPLS[k].factory(client, f"bench:handoff:{k}", cfg.ttl, cfg.wait) for k in set(schedule)
    }
    base = 8 * len(schedule)
    while True:
        i = conn.recv()
        if i is None:
            return
        h = handles[schedule[i]]
        conn.send(("waiting", i))
        ok = h.acquire()
        got = time.monotonic_ns()
        released_at = struct.unpack_from("q", shm, 8 * i)[0]
        struct.pack_into("q", shm, base + 8 * i, got - released_at if ok else -1)
        if ok:
            h.release()
        conn.send(("done", i))


def _child(target: Any, errfile: str, *args: Any) -> None:
    try:
        target(*args)
    except BaseException:
        Path(errfile).write_text(traceback.format_exc())
        os._exit(1)
    os._exit(0)


def handoff(server: PrivateRedis, impls: list[str], cfg: argparse.Namespace) -> dict[str, Any]:
    warm = 3
    schedule: list[str] = []
    for key in impls:
        schedule += [key] * warm
    per_round = max(1, math.ceil(cfg.handoff_samples / cfg.rounds_handoff))
    for r in range(cfg.rounds_handoff):
        for key in rotated(impls, r):
            schedule += [key] * per_round
    shm = mmap.mmap(-1, 16 * len(schedule) + 16)
    a, b = CTX.Pipe()
    tmp = tempfile.mkdtemp(prefix="redislock-bench-")
    errs = [os.path.join(tmp, "holder.err"), os.path.join(tmp, "waiter.err")]
    procs = [
        CTX.Process(
            target=_child, args=(_handoff_holder, errs[0], server.url, schedule, cfg, a, shm)
        ),
        CTX.Process(
            target=_child, args=(_handoff_waiter, errs[1], server.url, schedule, cfg, b, shm)
        ),
    ]
    for p in procs:
        p.start()
    limit = time.monotonic() + 60 + len(schedule) * (cfg.hold_min + cfg.hold_jitter + 1.0)
    _join(procs, limit)
    try:
        _raise_child_errors(errs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = 8 * len(schedule)
    values: dict[str, list[int]] = {k: [] for k in impls}
    failed: dict[str, int] = dict.fromkeys(impls, 0)
    seen: dict[str, int] = dict.fromkeys(impls, 0)
    for i, key in enumerate(schedule):
        seen[key] += 1
        if seen[key] <= warm:
            continue
        v = struct.unpack_from("q", shm, base + 8 * i)[0]
        if v < 0:
            failed[key] += 1
        else:
            values[key].append(v)
    shm.close()
    return {
        k: {
            "n": len(v),
            "failed": failed[k],
            "p50_ms": percentile(v, 50) / 1e6,
            "p99_ms": percentile(v, 99) / 1e6,
            "max_ms": max(v) / 1e6 if v else math.nan,
        }
        for k, v in values.items()
    }


def _join(procs: list[Any], deadline: float) -> None:
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():  # only the processes this harness forked, by their PID
            log(f"worker {p.pid} overran its time bound; stopping it")
            p.kill()
            p.join(5)


def _raise_child_errors(files: list[str]) -> None:
    for f in files:
        if os.path.exists(f):
            raise RuntimeError(f"a benchmark process failed:\n{Path(f).read_text()}")


# =============================================================================
# 4. contended throughput, fairness, waits, violations
# =============================================================================
# Shared memory: [0] counter, [1] holder id, [2] start ns, [3] unused, then
# per worker: in-window count, total count, violations, failed acquires.
_HDR = 4
_PER = 4


def _spin(us: float) -> None:
    if us > 0:
        end = time.perf_counter() + us / 1e6
        while time.perf_counter() < end:
            pass


def _contended_worker(
    url: str,
    key: str,
    name: str,
    shape: str,
    idx: int,
    cfg: Any,
    shm: mmap.mmap,
    ready: Any,
    go: Any,
    out_path: str,
) -> None:
    import redis

    handle_mode, section = shape.split("/")
    client = redis.Redis.from_url(url, socket_timeout=5.0)
    client.ping()
    factory = IMPLS[key].factory
    # "new": a handle per acquisition, as the decorator makes one per call.
    reused = factory(client, name, cfg.ttl, cfg.wait) if handle_mode == "reused" else None
    # "redis": the section reads and writes a counter in Redis, through a
    # client of its own (an application's cache or data client), so the
    # server serves the section's commands between the lock's scripts.
    plain = None
    if section == "redis":
        plain = redis.Redis.from_url(url, socket_timeout=5.0)
        plain.ping()
    counter_key = _counter_key(name)
    me = idx + 1
    slot = 8 * (_HDR + _PER * idx)
    ready.wait(60)
    go.wait(60)
    start = struct.unpack_from("q", shm, 16)[0] / NS
    window_start = start + cfg.warmup
    end = window_start + cfg.duration
    while time.monotonic() < start:
        time.sleep(0.0005)
    cpu0 = time.process_time()
    waits = array("d")
    in_window = total = violations = failed = 0
    clock = time.monotonic
    pack, unpack = struct.pack_into, struct.unpack_from
    # --cpu-parts: this thread's CPU in making the handle, acquiring (waiting
    # included), the section and releasing; else a clock that reads 0, the
    # same few calls for every implementation.
    part = time.thread_time if cfg.cpu_parts else _no_clock
    made = acquired = sectioned = released = 0.0
    while True:
        t_a = clock()
        if t_a >= end:
            break
        c_0 = part()
        handle = reused or factory(client, name, cfg.ttl, cfg.wait)
        c_1 = part()
        made += c_1 - c_0
        if not handle.acquire():
            failed += 1
            continue
        c_2 = part()
        acquired += c_2 - c_1
        t_b = clock()
        # -- critical section: a deliberately non-atomic read-modify-write --
        if unpack("q", shm, 8)[0] != 0:
            violations += 1
        pack("q", shm, 8, me)
        if plain is None:
            value = unpack("q", shm, 0)[0]
            _spin(cfg.cs_us)
            pack("q", shm, 0, value + 1)
        else:
            value = int(plain.get(counter_key) or 0)
            _spin(cfg.cs_us)
            plain.set(counter_key, value + 1)
        if unpack("q", shm, 8)[0] != me:
            violations += 1
        pack("q", shm, 8, 0)
        # -------------------------------------------------------------------
        c_3 = part()
        sectioned += c_3 - c_2
        handle.release()
        released += part() - c_3
        total += 1
        if window_start <= t_b < end:
            in_window += 1
            waits.append(t_b - t_a)
        _spin(cfg.outside_us)
    struct.pack_into("qqqq", shm, slot, in_window, total, violations, failed)
    with open(out_path, "wb") as f:
        waits.tofile(f)
    with open(f"{out_path}.cpu", "w") as f:
        f.write(repr([time.process_time() - cpu0, made, acquired, sectioned, released]))


def _no_clock() -> float:
    return 0.0


# The shape of the contended phase's loop: "<handle>/<section>". The handle is
# "reused" (one per worker, taking the lock over and over) or "new" (one per
# acquisition, what the decorator makes per call); the section is "shm" (a
# read-modify-write of shared memory: the lock's own cost alone) or "redis"
# (a GET and a SET of a counter on the same server, through a separate plain
# client: Redis's one thread serves the section and the lock's scripts).
CLASSIC = "reused/shm"
HANDLES = ("reused", "new")
SECTIONS = ("shm", "redis")
_SHAPE_LABELS = {
    "reused": "one handle per worker",
    "new": "a new handle per acquisition",
    "shm": "shared-memory section",
    "redis": "section GET+SET in Redis",
}
# Commands of the harness itself and of connection set-up: not the lock's work.
_ADMIN = frozenset(
    {"info", "config", "ping", "hello", "client", "select", "echo", "monitor", "slowlog", "command"}
)


def shape_label(shape: str) -> str:
    handle, section = shape.split("/")
    return f"{_SHAPE_LABELS[handle]}, {_SHAPE_LABELS[section]}"


def cell_key(workers: int, shape: str) -> str:
    """Key of a worker count and shape in ``data["contended"]``: the classic
    shape keeps the bare worker count, so saved runs and targets read as before."""
    return str(workers) if shape == CLASSIC else f"{workers} {shape}"


def split_cell_key(key: str) -> tuple[int, str]:
    workers, _, shape = key.partition(" ")
    return int(workers), shape or CLASSIC


def _counter_key(name: str) -> str:
    return f"{name}:counter"


def script_names() -> dict[str, str]:
    """SHA1 -> a readable name for the Lua scripts of every implementation imported.

    Found by what they are, not where they live: objects with a ``sha`` and a
    ``name`` or ``script`` (ours, redis-py's ``Script``), and Lua source kept in
    module or class attributes named ``*SCRIPT*`` (redis-py's Lock,
    python-redis-lock), hashed as the client hashes them.
    """
    import hashlib

    names: dict[str, str] = {}

    def note(owner: str, attr: str, obj: Any) -> None:
        sha = getattr(obj, "sha", None)
        if isinstance(sha, str) and len(sha) == 40:
            label = getattr(obj, "name", None)
            names.setdefault(sha, label if isinstance(label, str) else f"{owner}.{attr}")
        elif isinstance(obj, (str, bytes)) and "SCRIPT" in attr.upper():
            raw = obj.encode() if isinstance(obj, str) else obj
            names.setdefault(hashlib.sha1(raw).hexdigest(), f"{owner}.{attr}")

    prefixes = ("django_redislock", "redis.lock", "redis_lock", "pottery", "benchmarks.impls")
    for modname, module in list(sys.modules.items()):
        if module is None or not modname.startswith(prefixes):
            continue
        for attr, obj in list(vars(module).items()):
            note(modname.rsplit(".", 1)[-1], attr, obj)
            if isinstance(obj, type) and obj.__module__ == modname:
                for cattr, cobj in list(vars(obj).items()):
                    note(obj.__name__, cattr, cobj)
    return names


class _Tracer:
    """MONITOR on the private server: each command a script runs, counted
    under the script (or top-level command) that ran it.

    Redis feeds a script's own line to MONITOR before the lines of the
    commands it runs, and runs nothing else meanwhile, so every ``lua`` line
    belongs to the last top-level line before it. Tracing slows the server,
    so a traced cell is run apart from the measured ones.
    """

    END = "bench-trace-end"

    def __init__(self, server: PrivateRedis, names: dict[str, str]) -> None:
        import threading

        self.names = names
        self.client = server.client(socket_timeout=60.0)
        self.monitor = self.client.monitor()
        self.top: dict[str, int] = {}
        self.inner: dict[str, dict[str, int]] = {}
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)

    def start(self) -> _Tracer:
        self.monitor.__enter__()  # MONITOR, and its OK: tracing from here on
        self.thread.start()
        return self

    def _label(self, cmd: str, arg: str) -> str:
        if cmd in ("EVALSHA", "EVALSHA_RO"):
            return self.names.get(arg, f"script {arg[:8]}")
        if cmd in ("FCALL", "FCALL_RO"):
            return f"function {arg}"
        if cmd == "EVAL":
            return "EVAL (source)"
        if arg.endswith(":counter"):
            return f"section {cmd}"
        if cmd.lower() in _ADMIN or cmd in ("SCRIPT", "FUNCTION"):
            return f"admin {cmd}"
        return cmd

    def _read(self) -> None:
        conn = self.monitor.connection
        group: str | None = None
        try:
            while True:
                line = conn.read_response()
                if isinstance(line, bytes):
                    line = line.decode("utf-8", "replace")
                # '<time> [<db> <client>] "CMD" "arg" ...'
                b = line.find("[")
                e = line.find("] ", b)
                client = line[b + 1 : e]
                parts = line[e + 2 :].split('"', 4)
                cmd = parts[1].upper() if len(parts) > 1 else ""
                arg = parts[3] if len(parts) > 3 else ""
                if client.endswith(" lua"):
                    if group is not None:
                        inner = self.inner.setdefault(group, {})
                        inner[cmd] = inner.get(cmd, 0) + 1
                    continue
                if cmd == "ECHO" and arg == self.END:
                    return
                group = self._label(cmd, arg)
                self.top[group] = self.top.get(group, 0) + 1
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self, admin: Any) -> dict[str, Any]:
        """Read up to a marker sent now (every line the cell caused is before it)."""
        admin.echo(self.END)
        self.thread.join(120)
        with contextlib.suppress(Exception):
            self.monitor.__exit__()
        self.client.close()
        if self.thread.is_alive() or self.error is not None:
            raise RuntimeError(f"MONITOR trace did not finish: {self.error!r}")
        return {"top": self.top, "inner": self.inner}


def contended_cell(
    server: PrivateRedis,
    key: str,
    workers: int,
    r: int,
    cfg: argparse.Namespace,
    shape: str = CLASSIC,
    names: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One run of ``workers`` processes on one lock; traced with MONITOR when
    ``names`` (the scripts' names) is given."""
    tag = "trace" if names is not None else str(r)
    name = f"bench:cont:{key}:{shape.replace('/', '-')}:{workers}:{tag}"
    shm = mmap.mmap(-1, 8 * (_HDR + _PER * workers))
    ready = CTX.Barrier(workers + 1)
    go = CTX.Barrier(workers + 1)
    tmp = tempfile.mkdtemp(prefix="redislock-bench-")
    outs = [os.path.join(tmp, f"w{i}.bin") for i in range(workers)]
    errs = [os.path.join(tmp, f"w{i}.err") for i in range(workers)]
    procs = [
        CTX.Process(
            target=_child,
            args=(
                _contended_worker,
                errs[i],
                server.url,
                key,
                name,
                shape,
                i,
                cfg,
                shm,
                ready,
                go,
                outs[i],
            ),
        )
        for i in range(workers)
    ]
    # Commands the server ran in this cell (the private server runs nothing else).
    admin = server.client()
    admin.config_resetstat()
    server_cpu = _server_cpu(admin)
    tracer = _Tracer(server, names).start() if names is not None else None
    for p in procs:
        p.start()
    try:
        ready.wait(60)
        struct.pack_into("q", shm, 16, time.monotonic_ns() + int(0.05 * NS))
        go.wait(60)
    except Exception:
        _join(procs, time.monotonic() + 1)
        if tracer is not None:
            with contextlib.suppress(Exception):
                tracer.stop(admin)
        try:
            _raise_child_errors(errs)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    _join(procs, time.monotonic() + 0.05 + cfg.warmup + cfg.duration + cfg.wait + 30)
    server_cpu = _server_cpu(admin) - server_cpu
    trace = tracer.stop(admin) if tracer is not None else None
    client_cpu = 0.0
    cpu_parts = [0.0] * len(CPU_PARTS)
    try:
        _raise_child_errors(errs)
        waits: list[float] = []
        for path in outs:
            a = array("d")
            with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
                a.frombytes(f.read())
            waits += a.tolist()
            with contextlib.suppress(FileNotFoundError), open(f"{path}.cpu") as f:
                total_cpu, *parts = ast.literal_eval(f.read())
                client_cpu += total_cpu
                cpu_parts = [a + b for a, b in zip(cpu_parts, parts, strict=True)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    counts, totals, violations, failed = [], [], 0, 0
    for i in range(workers):
        c, t, v, f = struct.unpack_from("qqqq", shm, 8 * (_HDR + _PER * i))
        counts.append(c)
        totals.append(t)
        violations += v
        failed += f
    stats = admin.info("commandstats")
    if shape.endswith("/redis"):
        counter = int(admin.get(_counter_key(name)) or 0)
    else:
        counter = struct.unpack_from("q", shm, 0)[0]
    lost_updates = sum(totals) - counter
    shm.close()
    admin.close()
    done = sum(totals)

    def calls(*names: str) -> float:
        n = sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in names)
        return n / done if done else math.nan

    # Every command the server ran, those run inside scripts included (INFO
    # commandstats counts both), less the harness's own and the section's one
    # GET and one SET per critical section: the lock's server work.
    commands: dict[str, int] = {}
    for stat, values in stats.items():
        cmd = stat.removeprefix("cmdstat_")
        if cmd.split("|")[0] in _ADMIN:
            continue
        commands[cmd] = int(values.get("calls", 0))
    if shape.endswith("/redis"):
        for cmd in ("get", "set"):
            commands[cmd] = commands.get(cmd, 0) - done
    commands = {c: n for c, n in commands.items() if n}

    mean = statistics.fmean(counts) if counts else 0.0
    result = {
        "ops_per_s": sum(counts) / cfg.duration,
        "counts": counts,
        "least_over_mean": (min(counts) / mean) if mean else 0.0,
        "max_over_min": (max(counts) / min(counts)) if min(counts) else math.inf,
        "violations": violations + max(0, lost_updates),
        "lost_updates": lost_updates,
        "failed_acquires": failed,
        "waits": waits,
        "critical_sections": done,
        # Per critical section, warm-up included: scripts run (each a round
        # trip for these locks) and wake-ups published.
        "scripts_per_cs": calls("evalsha", "eval", "fcall"),
        "publish_per_cs": calls("publish", "spublish"),
        "command_calls": commands,
        "commands_per_cs": sum(commands.values()) / done if done else math.nan,
        # CPU seconds per critical section, warm-up included, in microseconds:
        # the worker processes' own (their loop, user and system) and the
        # server's (INFO cpu, its main thread and any others).
        "client_cpu_us_per_cs": client_cpu / done * 1e6 if done else math.nan,
        "server_cpu_us_per_cs": server_cpu / done * 1e6 if done else math.nan,
    }
    if cfg.cpu_parts and done:
        # The worker threads' own parts; what is left of the processes' CPU
        # is the other threads' (a notifier's, a background thread's).
        parts = dict(zip(CPU_PARTS, (c / done * 1e6 for c in cpu_parts), strict=True))
        parts["other threads"] = client_cpu / done * 1e6 - sum(parts.values())
        result["client_cpu_parts_us_per_cs"] = parts
    if trace is not None:
        result["trace"] = trace
    return result


def _server_cpu(admin: Any) -> float:
    info = admin.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _breakdown(trace: dict[str, Any], done: int) -> dict[str, Any]:
    """Per script (or top-level command) of a traced cell, per critical section:
    how often it ran and the commands it ran inside."""
    out: dict[str, Any] = {}
    for group, n in sorted(trace["top"].items(), key=lambda kv: -kv[1]):
        inner = trace["inner"].get(group, {})
        # The harness's and the section's own commands are not the lock's; a
        # SUBSCRIBE once per process is not per critical section.
        if group.startswith(("admin ", "section ")) or max(n, sum(inner.values())) < done / 200:
            continue
        out[group] = {
            "calls_per_cs": n / done,
            "inner_per_cs": sum(inner.values()) / done,
            "inner_per_call": sum(inner.values()) / n,
            "inner": {
                c: v / done for c, v in sorted(inner.items(), key=lambda kv: (-kv[1], kv[0]))
            },
        }
    return out


def contended(server: PrivateRedis, impls: list[str], cfg: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {}
    names = None
    if cfg.breakdown:
        # Made once here so that every implementation's scripts are known
        # (some register theirs when their first handle is made).
        with server.client() as client:
            for key in impls:
                IMPLS[key].factory(client, "bench:names", cfg.ttl, cfg.wait)
        names = script_names()
    for workers in cfg.workers:
        combos = [(shape, key) for shape in cfg.shapes for key in impls]
        cells: dict[tuple[str, str], list[dict[str, Any]]] = {c: [] for c in combos}
        for r in range(cfg.rounds):
            # Shapes and implementations interleaved, the order rotated each round.
            for shape, key in rotated(combos, r + workers):
                log(f"  contended: {workers} workers, {shape}, round {r + 1}/{cfg.rounds}, {key}")
                cells[(shape, key)].append(contended_cell(server, key, workers, r, cfg, shape))
        traces: dict[tuple[str, str], dict[str, Any]] = {}
        if names is not None:
            for shape, key in combos:
                log(f"  traced (MONITOR): {workers} workers, {shape}, {key}")
                run = contended_cell(server, key, workers, 0, cfg, shape, names)
                traces[(shape, key)] = {
                    "critical_sections": run["critical_sections"],
                    "ops_per_s": run["ops_per_s"],
                    "commands_per_cs": run["commands_per_cs"],
                    "scripts": _breakdown(run["trace"], run["critical_sections"]),
                }
        for shape in cfg.shapes:
            per_impl = {}
            for key in impls:
                runs = cells[(shape, key)]
                waits = [w for run in runs for w in run["waits"]]
                rates = [run["ops_per_s"] for run in runs]
                done = sum(run["critical_sections"] for run in runs)
                calls: dict[str, int] = {}
                for run in runs:
                    for cmd, n in run["command_calls"].items():
                        calls[cmd] = calls.get(cmd, 0) + n
                per_impl[key] = {
                    "ops_per_s": statistics.median(rates),
                    "ops_per_s_rounds": rates,
                    "least_over_mean": statistics.median(run["least_over_mean"] for run in runs),
                    "least_over_mean_worst": min(run["least_over_mean"] for run in runs),
                    "max_over_min": statistics.median(run["max_over_min"] for run in runs),
                    # Critical sections of the least and the most served worker
                    # in a measured window, medians of rounds.
                    "least_served": statistics.median(min(run["counts"]) for run in runs),
                    "most_served": statistics.median(max(run["counts"]) for run in runs),
                    "wait_p50_ms": percentile(waits, 50) * 1000,
                    "wait_p99_ms": percentile(waits, 99) * 1000,
                    "wait_max_ms": max(waits) * 1000 if waits else math.nan,
                    "violations": sum(run["violations"] for run in runs),
                    "failed_acquires": sum(run["failed_acquires"] for run in runs),
                    "counts": [run["counts"] for run in runs],
                    "scripts_per_cs": statistics.median(run["scripts_per_cs"] for run in runs),
                    "publish_per_cs": statistics.median(run["publish_per_cs"] for run in runs),
                    # Pooled over rounds: every call / every critical section.
                    "commands_per_cs": sum(calls.values()) / done if done else math.nan,
                    "commands": {
                        c: n / done
                        for c, n in sorted(calls.items(), key=lambda kv: (-kv[1], kv[0]))
                    }
                    if done
                    else {},
                    "client_cpu_us_per_cs": statistics.median(
                        run["client_cpu_us_per_cs"] for run in runs
                    ),
                    "server_cpu_us_per_cs": statistics.median(
                        run["server_cpu_us_per_cs"] for run in runs
                    ),
                }
                if cfg.cpu_parts:
                    per_impl[key]["client_cpu_parts_us_per_cs"] = {
                        part: statistics.median(
                            run["client_cpu_parts_us_per_cs"][part] for run in runs
                        )
                        for part in (*CPU_PARTS, "other threads")
                    }
                if (shape, key) in traces:
                    per_impl[key]["traced"] = traces[(shape, key)]
            result[cell_key(workers, shape)] = per_impl
    return result


# =============================================================================
# profile of our uncontended path
# =============================================================================
def profile_ours(server: PrivateRedis, cfg: argparse.Namespace) -> str:
    client = server.client()
    op = _cycle(IMPLS["ours"].factory(client, "bench:profile", cfg.ttl, cfg.wait))
    _time_block(op, 200)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3000):
        op()
    prof.disable()
    client.close()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(22)
    return buf.getvalue()


# =============================================================================
# report
# =============================================================================
def check(label: str, ok: bool, detail: str) -> dict[str, Any]:
    return {"target": label, "pass": bool(ok), "detail": detail}


def targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    unc = data.get("uncontended", {})
    if "ours" in unc and "baseline" in unc:
        r = ratio(unc["ours"]["p50_us"], unc["baseline"]["p50_us"])
        out.append(check("uncontended p50 <= 1.15x baseline", r <= 1.15, f"{r:.2f}x"))
    if f"ours{FRESH}" in unc and f"baseline{FRESH}" in unc:
        base = unc[f"baseline{FRESH}"]["p50_us"]
        r = ratio(unc[f"ours{FRESH}"]["p50_us"], base)
        out.append(check("fresh handle, new names: p50 <= 1.15x baseline", r <= 1.15, f"{r:.2f}x"))
    ho = data.get("handoff", {})
    if "ours" in ho and "python_redis_lock" in ho:
        a, b = ho["ours"]["p50_ms"], ho["python_redis_lock"]["p50_ms"]
        out.append(check("handoff p50 <= python-redis-lock", a <= b, f"{a:.2f} vs {b:.2f} ms"))
    viol = 0
    for cell, per in data.get("contended", {}).items():
        if "ours" not in per:
            continue
        ours = per["ours"]
        viol += ours["violations"]
        workers, w = _where(cell)
        if workers < 8:
            continue
        peers = {k: v for k, v in per.items() if IMPLS[k].peer}
        if peers:
            best_key = max(peers, key=lambda k: peers[k]["ops_per_s"])
            best = peers[best_key]["ops_per_s"]
            out.append(
                check(
                    f"{w}: throughput >= best peer",
                    ours["ops_per_s"] >= best,
                    f"{ours['ops_per_s']:.0f} vs {best:.0f}/s ({best_key})",
                )
            )
        if "python_redis_lock" in per:
            prl = per["python_redis_lock"]
            r = ratio(ours["ops_per_s"], prl["ops_per_s"])
            out.append(check(f"{w}: throughput >= 1.5x python-redis-lock", r >= 1.5, f"{r:.2f}x"))
            out.append(
                check(
                    f"{w}: wait p99 <= python-redis-lock",
                    ours["wait_p99_ms"] <= prl["wait_p99_ms"],
                    f"{ours['wait_p99_ms']:.1f} vs {prl['wait_p99_ms']:.1f} ms",
                )
            )
        out.append(
            check(
                f"{w}: least-served >= 0.5 of mean",
                ours["least_over_mean"] >= 0.5,
                f"{ours['least_over_mean']:.2f}",
            )
        )
    if data.get("contended"):
        out.append(check("zero mutual-exclusion violations (ours)", viol == 0, str(viol)))
    out += barging_targets(data)
    return out


def _where(cell: str) -> tuple[int, str]:
    """Worker count of a contended cell, and how targets name it: "8 workers" for the
    classic shape, "8 workers, new/redis" for another."""
    workers, shape = split_cell_key(cell)
    return workers, f"{workers} workers" + ("" if shape == CLASSIC else f", {shape}")


def barging_targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The barging order (``fair=False``) against redis-py's ``Lock``, which
    also lets the releasing worker take the lock straight back."""
    out = []
    viol = 0
    for cell, per in data.get("contended", {}).items():
        if "ours_barging" not in per:
            continue
        ours = per["ours_barging"]
        viol += ours["violations"]
        workers, w = _where(cell)
        if workers < 8:
            continue
        if "redis_py" in per:
            rp = per["redis_py"]
            out.append(
                check(
                    f"{w}, fair=False: throughput > redis-py",
                    ours["ops_per_s"] > rp["ops_per_s"],
                    f"{ours['ops_per_s']:.0f} vs {rp['ops_per_s']:.0f}/s",
                )
            )
            out.append(
                check(
                    f"{w}, fair=False: wait p99 <= redis-py / 10",
                    ours["wait_p99_ms"] <= rp["wait_p99_ms"] / 10,
                    f"{ours['wait_p99_ms']:.1f} vs {rp['wait_p99_ms']:.1f} ms",
                )
            )
        out.append(
            check(
                f"{w}, fair=False: least-served >= 0.1 of mean",
                ours["least_over_mean_worst"] >= 0.1,
                f"{ours['least_over_mean_worst']:.2f} (worst round)",
            )
        )
    if any("ours_barging" in per for per in data.get("contended", {}).values()):
        out.append(check("zero mutual-exclusion violations (fair=False)", viol == 0, str(viol)))
    return out


_LABELS = {
    "PING": "PING (one round trip)",
    "semaphore": "django_redislock Semaphore",
    "decorator": "@redis_locked function, new names",
}


def label(key: str) -> str:
    if key.endswith(FRESH) and key[: -len(FRESH)] in IMPLS:
        return IMPLS[key[: -len(FRESH)]].label + ", new handle+name"
    return IMPLS[key].label if key in IMPLS else _LABELS.get(key, key)


def _served(v: dict[str, Any]) -> str:
    if "least_served" not in v:
        return "-"
    return f"{v['least_served']:.0f}/{v['most_served']:.0f}"


def _listing(counts: dict[str, float], digits: int = 2) -> str:
    return ", ".join(f"{c.upper()} {n:.{digits}f}" for c, n in counts.items() if n >= 0.005) or "-"


def _render_cpu_parts(data: dict[str, Any], tab: Any) -> list[str]:
    """With --cpu-parts: each contended cell's client CPU per critical section, by part."""
    rows = [
        [label(k), split_cell_key(cell)[0], split_cell_key(cell)[1]]
        + [fmt(v["client_cpu_parts_us_per_cs"][part], 0) for part in (*CPU_PARTS, "other threads")]
        + [fmt(v["client_cpu_us_per_cs"], 0)]
        for cell, per in data.get("contended", {}).items()
        for k, v in per.items()
        if "client_cpu_parts_us_per_cs" in v
    ]
    if not rows:
        return []
    return [
        "Client CPU per contended critical section, us, by part (medians of rounds; the "
        "worker's own thread: making the handle, acquiring with its wait, the section, "
        "releasing; then the worker's other threads; warm-up included)\n\n"
        + tab(
            ["implementation", "workers", "shape", *CPU_PARTS, "other threads", "total"],
            rows,
        )
    ]


def _render_commands(data: dict[str, Any], tab: Any) -> list[str]:
    """Server commands per contended critical section: every command of the
    measured cells (INFO commandstats, those run by scripts included), then,
    for traced cells, the same split by the script that ran them."""
    rows = []
    traced = []
    for cell, per in data.get("contended", {}).items():
        workers, shape = split_cell_key(cell)
        for k, v in per.items():
            if "commands" not in v:
                continue
            rows.append(
                [label(k), workers, shape, fmt(v["commands_per_cs"], 1), _listing(v["commands"])]
            )
            t = v.get("traced")
            if t:
                for group, g in t["scripts"].items():
                    traced.append(
                        [
                            label(k),
                            workers,
                            shape,
                            group,
                            fmt(g["calls_per_cs"], 2),
                            fmt(g["inner_per_call"], 1),
                            fmt(g["inner_per_cs"], 2),
                            _listing(g["inner"]),
                        ]
                    )
    parts = []
    if rows:
        parts.append(
            "Server commands per contended critical section (INFO commandstats, commands "
            "run inside scripts included; the section's own GET and SET and the harness's "
            "commands left out; warm-up included)\n\n"
            + tab(
                ["implementation", "workers", "shape", "cmds/CS", "commands per CS"],
                rows,
                text_last=True,
            )
        )
    if traced:
        parts.append(
            "The same, by script (a separate cell traced with MONITOR, which slows the "
            "server: counts per CS, not speed)\n\n"
            + tab(
                [
                    "implementation",
                    "workers",
                    "shape",
                    "script or command",
                    "calls/CS",
                    "inside/call",
                    "inside/CS",
                    "commands inside, per CS",
                ],
                traced,
                text_last=True,
            )
        )
    return parts


def render(data: dict[str, Any], rst: bool = False) -> str:
    tab = rst_table if rst else table
    parts = []
    unc = data.get("uncontended")
    if unc:
        ping = unc["PING"]["p50_us"]
        rts = data.get("round_trips", {})
        rows = []
        for key, v in unc.items():
            # Rows that make a handle per call compare with the baseline made per call.
            fresh = key.endswith(FRESH) or key == "decorator"
            base = unc.get(f"baseline{FRESH}" if fresh else "baseline")
            rt = rts.get(key, {})
            rows.append(
                [
                    label(key),
                    fmt(v["p50_us"]),
                    fmt(v["p99_us"]),
                    fmt(ratio(v["p50_us"], ping), 2),
                    fmt(ratio(v["p99_us"], ping), 2),
                    fmt(ratio(v["p50_us"], base["p50_us"]), 2) if base else "-",
                    fmt(ratio(v["p99_us"], base["p99_us"]), 2) if base else "-",
                    fmt(v.get("client_cpu_us")),
                    fmt(rt.get("round_trips"), 1),
                    fmt(rt.get("script_commands"), 1),
                    fmt(rt.get("server_us"), 1),
                ]
            )
        parts.append(
            "Uncontended acquire+release (one process; us = microseconds)\n\n"
            + tab(
                [
                    "implementation",
                    "p50 us",
                    "p99 us",
                    "p50/PING",
                    "p99/PING",
                    "p50/base",
                    "p99/base",
                    "client CPU us",
                    "round trips",
                    "in scripts",
                    "server us",
                ],
                rows,
            )
        )
    ho = data.get("handoff")
    if ho:
        rows = [
            [
                label(k),
                v["n"],
                fmt(v["p50_ms"], 2),
                fmt(v["p99_ms"], 2),
                fmt(v["max_ms"], 2),
                v["failed"],
            ]
            for k, v in ho.items()
        ]
        parts.append(
            "Release-to-waiter handoff (two processes; ms)\n\n"
            + tab(["implementation", "n", "p50 ms", "p99 ms", "max ms", "failed"], rows)
        )
    for cell, per in data.get("contended", {}).items():
        workers, shape = split_cell_key(cell)
        prl = per.get("python_redis_lock", {}).get("ops_per_s")
        rpy = per.get("redis_py", {}).get("ops_per_s")
        rows = [
            [
                label(k),
                fmt(v["ops_per_s"], 0),
                fmt(ratio(v["ops_per_s"], prl), 2) if prl else "-",
                fmt(ratio(v["ops_per_s"], rpy), 2) if rpy else "-",
                _served(v),
                fmt(v["least_over_mean"], 2),
                fmt(v["least_over_mean_worst"], 2),
                fmt(v["max_over_min"], 2),
                fmt(v["wait_p50_ms"], 2),
                fmt(v["wait_p99_ms"], 1),
                fmt(v["wait_max_ms"], 1),
                v["violations"],
                v["failed_acquires"],
                fmt(v.get("scripts_per_cs"), 2),
                fmt(v.get("publish_per_cs"), 2),
                fmt(v.get("commands_per_cs"), 1),
                fmt(v.get("client_cpu_us_per_cs"), 0),
                fmt(v.get("server_cpu_us_per_cs"), 0),
            ]
            for k, v in per.items()
        ]
        parts.append(
            f"Contended, {workers} worker processes on one lock; {shape_label(shape)} ({shape})\n\n"
            + tab(
                [
                    "implementation",
                    "CS/s",
                    "/PRL",
                    "/redis-py",
                    "least/most",
                    "least/mean",
                    "worst",
                    "max/min",
                    "wait p50 ms",
                    "p99 ms",
                    "max ms",
                    "violations",
                    "failed",
                    "scripts/CS",
                    "PUBLISH/CS",
                    "cmds/CS",
                    "client CPU us/CS",
                    "server CPU us/CS",
                ],
                rows,
            )
        )
    parts += _render_commands(data, tab)
    parts += _render_cpu_parts(data, tab)
    t = data.get("targets")
    if t:
        rows = [["PASS" if x["pass"] else "FAIL", x["target"], x["detail"]] for x in t]
        parts.append("Targets\n\n" + tab(["result", "target", "measured"], rows))
    return "\n\n".join(parts)


# =============================================================================
def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser("locks", __doc__)
    p.add_argument("--quick", action="store_true", help="short run, about a minute")
    p.add_argument(
        "--impls",
        default=",".join(k for k, impl in IMPLS.items() if impl.default),
        help="comma-separated subset of: " + ", ".join(IMPLS),
    )
    p.add_argument("--phases", default="uncontended,roundtrips,handoff,contended")
    p.add_argument("--workers", default="2,8,32", help="worker counts for the contended phase")
    p.add_argument("--rounds", type=int, help="contended rounds per worker count")
    p.add_argument("--duration", type=float, help="measured seconds per contended cell")
    p.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds before each")
    p.add_argument("--iters", type=int, help="uncontended iterations per impl per round")
    p.add_argument("--rounds-unc", type=int, help="uncontended rounds")
    p.add_argument("--handoff-samples", type=int, help="handoff samples per implementation")
    p.add_argument("--ttl", type=float, default=10.0, help="lease TTL for every impl (s)")
    p.add_argument("--wait", type=float, default=10.0, help="wait bound for every impl (s)")
    p.add_argument("--cs-us", type=float, default=0.0, help="busy work inside the lock (us)")
    p.add_argument(
        "--outside-us",
        type=float,
        default=0.0,
        help="busy work between release and the next acquire (us)",
    )
    p.add_argument(
        "--handle",
        default="reused",
        help="contended phase, comma-separated: reused (one handle per worker) and/or "
        "new (a new handle per acquisition, as the decorator makes per call)",
    )
    p.add_argument(
        "--section",
        default="shm",
        help="contended phase, comma-separated: shm (read-modify-write in shared memory) "
        "and/or redis (GET and SET of a counter on the same server, by a separate client); "
        "every handle/section pair runs, interleaved in the same rounds",
    )
    p.add_argument(
        "--breakdown",
        action="store_true",
        help="after each worker count's rounds, one more cell per shape and implementation "
        "traced with MONITOR: the commands each script runs, per critical section",
    )
    p.add_argument(
        "--cpu-parts",
        action="store_true",
        help="contended phase: split each worker's client CPU per critical section into "
        "making the handle, acquiring (waiting included), the section and releasing, in "
        "its own thread, and the rest of its threads",
    )
    p.add_argument(
        "--baseline-contended",
        action="store_true",
        help="also run the polling baseline in the contended phase",
    )
    p.add_argument("--tcp", action="store_true", help="Redis on loopback TCP, not a unix socket")
    p.add_argument("--profile", action="store_true", help="cProfile our uncontended path")
    p.add_argument("--rst", action="store_true", help="also print the tables as RST")
    p.add_argument("--no-save", action="store_true", help="do not write the JSON file")
    p.add_argument("--render", metavar="JSON", help="print the tables of a saved run and exit")
    cfg = p.parse_args(argv)
    q = cfg.quick
    cfg.rounds = cfg.rounds or (1 if q else 3)
    cfg.duration = cfg.duration or (2.0 if q else 5.0)
    cfg.iters = cfg.iters or (500 if q else 2000)
    cfg.rounds_unc = cfg.rounds_unc or (4 if q else 10)
    cfg.handoff_samples = cfg.handoff_samples or (20 if q else 100)
    cfg.rounds_handoff = 2 if q else 5
    cfg.warmup_iters = 200
    cfg.hold_min, cfg.hold_jitter = 0.010, 0.010
    cfg.workers = [int(x) for x in cfg.workers.split(",") if x]
    cfg.impls = [k.strip() for k in cfg.impls.split(",") if k.strip()]
    unknown = [k for k in cfg.impls if k not in IMPLS]
    if unknown:
        p.error(f"unknown implementation(s) {unknown}; choose from {list(IMPLS)}")
    for key in list(cfg.impls):
        reason = IMPLS[key].missing()
        if reason:
            log(f"skipping {IMPLS[key].label}: {reason}")
            cfg.impls.remove(key)
    cfg.phases = [x.strip() for x in cfg.phases.split(",") if x.strip()]
    handles = [x.strip() for x in cfg.handle.split(",") if x.strip()]
    sections = [x.strip() for x in cfg.section.split(",") if x.strip()]
    if not handles or set(handles) - set(HANDLES):
        p.error(f"--handle: choose from {list(HANDLES)}")
    if not sections or set(sections) - set(SECTIONS):
        p.error(f"--section: choose from {list(SECTIONS)}")
    cfg.shapes = [f"{h}/{x}" for x in sections for h in handles]
    return cfg


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    if cfg.render:
        saved = json.loads(Path(cfg.render).read_text())
        print(render(saved, rst=cfg.rst))
        return 0
    data: dict[str, Any] = {
        "command": "python -m benchmarks.locks " + " ".join(sys.argv[1:] if argv is None else argv),
        "config": dict(vars(cfg)),
        "load_before": loadavg(),
        "uptime_before": uptime_line(),
    }
    started = time.monotonic()
    server = PrivateRedis(tcp=cfg.tcp).start()
    try:
        data["machine"] = machine_facts(server.version())
        data["machine"]["transport"] = "tcp loopback" if cfg.tcp else "unix socket"
        if "uncontended" in cfg.phases:
            log("uncontended latency ...")
            data["uncontended"] = uncontended(server, cfg.impls, cfg)
        if "roundtrips" in cfg.phases:
            log("round trips per acquire+release ...")
            data["round_trips"] = round_trips(server, cfg.impls, cfg)
        if "handoff" in cfg.phases:
            log("handoff latency ...")
            data["handoff"] = handoff(server, cfg.impls, cfg)
        if "contended" in cfg.phases:
            log("contended throughput ...")
            impls = [
                k for k in cfg.impls if k not in ("baseline", "floor") or cfg.baseline_contended
            ]
            data["contended"] = contended(server, impls, cfg)
        if cfg.profile:
            data["profile"] = profile_ours(server, cfg)
    finally:
        server.stop()
    data["elapsed_s"] = round(time.monotonic() - started, 1)
    data["load_after"] = loadavg()
    data["uptime_after"] = uptime_line()
    data["targets"] = targets(data)
    m = data["machine"]
    print(f"{m['date_utc']}  {m['cpu']}, {m['cores']} cores, Python {m['python']}")
    print(
        f"Redis {m['redis_server']} ({m['transport']}), redis-py {m['redis_py']}, "
        f"hiredis {m['hiredis']} (in use: {m['hiredis_in_use']})"
    )
    print(
        f"load averages before {data['load_before']}, after {data['load_after']}; "
        f"run took {data['elapsed_s']} s"
    )
    print(f"ttl {cfg.ttl} s, wait {cfg.wait} s for every implementation\n")
    print(render(data))
    if cfg.rst:
        print("\n\n" + render(data, rst=True))
    if cfg.profile:
        print("\n" + data["profile"])
    if not cfg.no_save:
        for per in data.get("contended", {}).values():
            for v in per.values():
                v.pop("waits", None)
        path = write_results("locks", data)
        print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
