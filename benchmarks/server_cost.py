"""What an uncontended acquire+release costs the Redis server, in instructions.

Usage::

    python -m benchmarks.server_cost              # every implementation, ~2 min
    python -m benchmarks.server_cost --ops 500 --impls ours,baseline

Wall-clock figures on a shared machine move by several percent from one run
to the next; instruction counts do not. For each implementation this starts a
private ``redis-server`` under ``valgrind --tool=callgrind`` (on a unix socket,
stopped by its PID), runs N acquire+release pairs through the implementation's
own client code, then does the same with 2N pairs on a fresh server: the
difference divided by N is what one pair costs the server, with start-up,
connection and shutdown cancelled out. Only instructions run while serving
clients are counted (reading and running commands, writing replies): the
server's timer runs a number of times that depends on how long the run takes,
not on what it does. A PING is measured the same way as a unit. Needs
``valgrind`` (Debian/Ubuntu: ``apt install valgrind``).

``--model`` measures what a script's parts cost the server (the call
itself, its keys and arguments, each ``redis.call`` inside, ``TIME``) beside
a plain ``SET ... NX PX``, this library's own acquire and release, redis-py's
pair, and the fewest commands a pair can make that keep this library's
guarantees: where the instructions of an uncontended pair go, and how many
of them the guarantees need.

``--contended W`` measures, the same way, what one critical section costs
the server when W processes take turns on one lock (a new handle each
section, a ``GET`` and a ``SET`` inside, as ``benchmarks.locks --handle new
--section redis`` runs them), with a row for the section alone: where the
server's work of a hand-off goes, as a count that a busy machine does not
move.

``--parts`` splits each pair's or section's count by what its scripts do:
calling them (arguments made Lua values, the script found, its reply), the
Lua code's own work (string and number operations, and each ``redis.call``'s
arguments and reply converted), the commands its ``redis.call`` lines run,
and the rest (reading requests, commands sent outside scripts, writing
replies): the inclusive counts of the server's ``evalGenericCommand``,
``lua_pcall`` and ``scriptCall``, by the same difference of two runs.

``--items`` measures, the same way, what each thing ``python -m
benchmarks.capacity`` sizes costs the server to make and end, with this
library's own client: a lock (new handle, new name), a semaphore permit, a
waiter that queues behind a held lock and gives up (its two scripts), and an
idempotency record written and read back (empty body).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from .common import PrivateRedis, fmt, parser, show
from .impls import IMPLS

_TOTALS = re.compile(r"([\d,]+)\s+(?:\([\d.]+%\)\s+)?PROGRAM TOTALS")


class CallgrindRedis(PrivateRedis):
    """A private redis-server run under callgrind; ``stop_and_count_parts()`` counts."""

    def __init__(self) -> None:
        super().__init__()
        self.out = self.dir / "callgrind.out"

    def start(self, timeout: float = 60.0) -> CallgrindRedis:
        valgrind = _require("valgrind")
        self.wrapper = [
            valgrind,
            "--tool=callgrind",
            f"--callgrind-out-file={self.out}",
            # Count what serving the clients costs (reading and running their
            # commands, writing the replies), not the timer (serverCron), whose
            # share grows with the wall-clock length of the run: on a busy
            # machine it made the counts move by several thousand per pair.
            "--toggle-collect=readQueryFromClient",
            "--toggle-collect=beforeSleep",
        ]
        super().start(timeout)
        return self

    def stop_and_count_parts(self) -> dict[str, int]:
        """The total, and the inclusive count of each function in ``PARTS``."""
        proc = self.proc
        if proc is not None:
            self.proc = None
            proc.terminate()
            proc.wait(60)
        report = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", str(self.out)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        shutil.rmtree(self.dir, ignore_errors=True)
        return counts_of(report)


# Functions of the server whose inclusive counts split a script's cost
# (--parts): the whole run of EVAL/EVALSHA; inside it, the Lua code's run;
# inside that, the commands its redis.call()s run.
PARTS = ("evalGenericCommand", "lua_pcall", "scriptCall")
_FUNCTION = re.compile(r"^\s*([\d,]+)\s+\([\d.]+%\)\s+\S*?:(\w+) \[", re.MULTILINE)


def counts_of(report: str) -> dict[str, int]:
    """``total`` and each of ``PARTS`` from ``callgrind_annotate --inclusive=yes``
    output; a function the server does not name (another build) counts 0."""
    match = _TOTALS.search(report)
    if match is None:
        raise RuntimeError("callgrind_annotate printed no PROGRAM TOTALS")
    counts = {"total": int(match.group(1).replace(",", ""))}
    for found in _FUNCTION.finditer(report):
        name = found.group(2)
        if name in PARTS and name not in counts:
            counts[name] = int(found.group(1).replace(",", ""))
    return {"total": counts["total"], **{name: counts.get(name, 0) for name in PARTS}}


def _require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise SystemExit(f"{binary} is not on PATH; this benchmark needs it")
    return path


def _counted_parts(work: Callable[[Any], None]) -> dict[str, int]:
    """Instructions a fresh callgrind server spent serving ``work(client)``:
    the total, and the inclusive count of each of ``PARTS``."""
    server = CallgrindRedis().start()
    try:
        client = server.client(socket_timeout=60.0)
        work(client)
        client.close()
    except BaseException:
        server.stop()
        raise
    return server.stop_and_count_parts()


def _per_op(work: Callable[[Any, int], None], ops: int) -> float:
    """What one of ``work(client, n)``'s n operations costs: start-up and shutdown cancel out."""
    return _per_op_parts(work, ops)["total"]


def _per_op_parts(work: Callable[[Any, int], None], ops: int) -> dict[str, float]:
    """``_per_op``, with what each of ``PARTS`` costs per operation beside the total."""
    once = _counted_parts(lambda c: work(c, ops))
    twice = _counted_parts(lambda c: work(c, 2 * ops))
    return {name: (twice[name] - once[name]) / ops for name in once}


def _pairs(client: Any, key: str, pairs: int, fresh: bool) -> None:
    if key == "PING":
        for _ in range(pairs):
            client.ping()
        return
    factory = IMPLS[key].factory
    handle = factory(client, f"cost:{key}", 30.0, 1.0)
    for i in range(pairs):
        if fresh:  # a new handle on a name never used before, as a decorator does
            handle = factory(client, f"cost:{key}:{i}", 30.0, 1.0)
        if not handle.acquire():
            raise RuntimeError(f"{key}: an uncontended acquire failed")
        handle.release()


def per_pair(key: str, ops: int, fresh: bool = False) -> float:
    return per_pair_parts(key, ops, fresh)["total"]


def per_pair_parts(key: str, ops: int, fresh: bool = False) -> dict[str, float]:
    return _per_op_parts(lambda client, n: _pairs(client, key, n, fresh), ops)


def _queue_of(handle: Any) -> bytes | str | None:
    """The key of the list ``handle``'s waiters queue in, first come first
    served, when it has one (a barging lock's sections mostly stay with the
    process that released: its waiters are not its steady state)."""
    keys = getattr(handle, "keys", None)  # this library's
    if keys is not None:
        return keys.queue if getattr(handle, "fair", True) else None  # type: ignore[no-any-return]
    keys = getattr(handle, "_keys", None)  # the first-come floor's
    return keys[1] if isinstance(keys, tuple) else None


def _sections(client: Any, key: str | None, workers: int, each: int) -> int:
    """``workers`` forked processes, ``each`` critical sections each, on one
    lock: a new handle per section (as a decorator makes one per call), a
    ``GET`` and a ``SET`` on the same server inside. ``key`` None: the
    sections alone, with no lock (what the section itself costs).

    A lock whose waiters queue in a list, first come first served (this
    library's default order, the first-come floor) is measured in its steady
    state, whatever the host's load: each holder waits, inside its section,
    until every other worker with sections left is queued (``LLEN``), so
    that every section but the first and the last few hands the lock to a
    queued waiter with others behind it. Left
    to run freely, a worker descheduled between its release and its next
    acquire lets the queue run empty, and how often that happens (a path
    that costs more) is the host's doing: the count moved by up to 8 % from
    run to run. What still moves it, by 1 to 4 %, is the server's event loop:
    how many turns it takes per section depends on how the clients'
    requests arrive. Returns the ``LLEN`` calls made, which the caller takes
    off."""
    import multiprocessing

    pool = client.connection_pool
    context = multiprocessing.get_context("fork")
    start = context.Barrier(workers)
    left = context.Value("i", workers)  # workers with sections left
    polls = context.Value("i", 0)

    def worker() -> None:
        import time

        import redis

        def connected() -> redis.Redis:
            # The parent's server and settings, on connections of this process.
            kwargs = {**pool.connection_kwargs, "socket_timeout": 60.0}
            return redis.Redis(
                connection_pool=redis.ConnectionPool(
                    connection_class=pool.connection_class, **kwargs
                )
            )

        mine, section = connected(), connected()
        factory = IMPLS[key].factory if key is not None else None
        # Made, never taken: whether this lock's waiters queue in a list.
        queue = _queue_of(factory(mine, "cost:contended", 60.0, 60.0)) if factory else None
        start.wait(60)
        for i in range(each):
            # A queueing lock's first wait is long: the mark its queueing sets
            # covers the others' waits for the whole run, so no TTL is raised
            # as the (slow, under callgrind) run goes on.
            wait = 600.0 if i == 0 and queue is not None else 60.0
            handle = factory(mine, "cost:contended", 60.0, wait) if factory is not None else None
            if handle is not None and not handle.acquire():
                raise SystemExit(f"{key}: a contended acquire gave up")
            if i == each - 1:
                with left.get_lock():
                    left.value -= 1
            others_by = time.monotonic() + 60
            while queue is not None:
                with polls.get_lock():
                    polls.value += 1
                if section.llen(queue) >= left.value - (i < each - 1):
                    break
                if time.monotonic() > others_by:
                    raise SystemExit(f"{key}: the other workers did not queue in 60 s")
            section.set("cost:counter", int(section.get("cost:counter") or 0) + 1)
            if handle is not None:
                handle.release()
        raise SystemExit(0)

    processes = [context.Process(target=worker) for _ in range(workers)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(600)
    if any(process.exitcode != 0 for process in processes):
        raise RuntimeError(f"{key}: a contended worker failed")
    if key is not None and int(client.get("cost:counter") or 0) != workers * each:
        raise RuntimeError(f"{key}: sections were lost (the lock let two in)")
    return int(polls.value)


def _llens(client: Any, n: int) -> None:
    client.rpush("cost:list", "a", "b")
    for _ in range(n):
        client.llen("cost:list")


def per_section(key: str | None, ops: int, workers: int) -> float:
    """What one contended critical section costs the server, its ``GET`` and
    ``SET`` included: ``workers`` processes doing about ``ops`` sections in
    all, then twice as many, the difference over the sections added, less
    what the steady state's ``LLEN`` calls cost (``_sections``)."""
    return per_section_parts(key, ops, workers)["total"]


def per_section_parts(key: str | None, ops: int, workers: int) -> dict[str, float]:
    """``per_section``, with what each of ``PARTS`` costs per section beside
    the total (the ``LLEN`` calls run outside scripts: only the total has
    them taken off)."""
    each = max(1, ops // workers)
    polls: dict[int, int] = {}

    def work(sections: int) -> Callable[[Any], None]:
        def run(client: Any) -> None:
            polls[sections] = _sections(client, key, workers, sections // workers)

        return run

    once = _counted_parts(work(each * workers))
    twice = _counted_parts(work(2 * each * workers))
    extra_polls = polls[2 * each * workers] - polls[each * workers]
    llen = _per_op(_llens, 200) if extra_polls else 0.0
    sections = each * workers
    parts = {name: (twice[name] - once[name]) / sections for name in once}
    parts["total"] -= llen * extra_polls / sections
    return parts


def _item_ops(client: Any, item: str, n: int) -> None:
    from django_redislock.core import Lock, read_record, write_record
    from django_redislock.core.drivers.semaphore import Semaphore
    from django_redislock.core.engine.keys import KeySpace

    if item == "lock":
        for i in range(n):
            lock = Lock(client, f"cost:item:{i}", ttl=30, wait=0)
            lock.acquire()
            lock.release()
    elif item == "permit":
        for _ in range(n):
            permit = Semaphore(client, "cost:permits", 10, ttl=30, wait=0)
            permit.acquire()
            permit.release()
    elif item == "waiter":
        from django_redislock.core.engine.wakeup_message import NO_CHANNEL

        holder = Lock(client, "cost:queue", ttl=600, wait=0)
        holder.acquire()
        for i in range(n):
            # The acquire script that queues a waiter, then its give-back, as
            # the wait loop sends them (no notifier: only the server's work).
            waiter = Lock(client, "cost:queue", ttl=30, wait=60)
            token = f"waiter-{i}"
            if waiter._attempt(token, 30_000, "{}", 60_000, NO_CHANNEL)[0]:
                raise RuntimeError("a waiter took a held lock")
            waiter._cancel(token)
    elif item == "record":
        space = KeySpace("redislock")
        for i in range(n):
            keys = space.idempotency("user:42", f"key-{i:08d}")
            done = {b"fp": b"f" * 64, b"state": b"done", b"status": b"201", b"body": b""}
            write_record(client, keys, done, ttl=600)
            read_record(client, keys)
    else:
        raise ValueError(item)


ITEMS = {
    "lock": "a lock: acquire+release, new handle and name",
    "permit": "a semaphore permit: acquire+release",
    "waiter": "a waiter: queue behind a held lock, then give up",
    "record": "an idempotency record: write, read back",
}


def _script(source: str, keys: list[str], args: list[Any]) -> Callable[[Any, int], None]:
    def work(client: Any, n: int) -> None:
        sha = client.script_load(source)
        for _ in range(n):
            client.evalsha(sha, len(keys), *keys, *args)

    return work


def _acquires(client: Any, n: int) -> None:
    from django_redislock.core import Lock

    for i in range(n):
        Lock(client, f"cost:model:{i}", ttl=30, wait=0).acquire()


# A lock acquire's arguments as the library sends them: three keys, eight values.
_KEYS = ["cost:L:{t}:=n", "cost:Q:{t}:=n", "cost:H:{t}:=n"]
_ARGS = ["0123456789abcdef", 30000, "", '{"p":1,"h":"host","w":"MainThread"}', 1000]
_ARGS += ["p:cost:N:0123456789abcdef", 40000, 1]

# What the server's work on a lock is made of (``--model``): whole
# operations, each measured like a pair ...
MODEL: list[tuple[str, Callable[[Any, int], None]]] = [
    ("SET key value NX PX, a new key (redis-py's acquire)", lambda c, n: _set_nx(c, n)),
    ("EVALSHA of 'return 1', no keys or arguments", _script("return 1", [], [])),
    ("the same with an acquire's 3 keys and 8 arguments", _script("return 1", _KEYS, _ARGS)),
    ("the acquire's six calls and nothing else, new names", lambda c, n: _six(c, n)),
    ("this library's acquire, new handle and name", _acquires),
    ("this library's acquire+release, new handle and name", lambda c, n: _item_ops(c, "lock", n)),
    (
        "redis-py's acquire+release, new handle and name",
        lambda c, n: _pairs(c, "redis_py", n, True),
    ),
    ("the least pair that keeps the guarantees, new names", lambda c, n: _least(c, n)),
]

# ... and one command inside a script: a script making it five times, less
# one making it none, over five (the key holds a small hash with a TTL).
INSIDE = {
    "HGET of one field": "redis.call('HGET', KEYS[1], 'f')",
    "HMGET of three fields": "redis.call('HMGET', KEYS[1], 'f', 'g', 'h')",
    "HSET of one field": "redis.call('HSET', KEYS[1], 'f', '1')",
    "HSET of three fields": "redis.call('HSET', KEYS[1], 'f', '1', 'g', '2', 'h', '3')",
    "PEXPIRE": "redis.call('PEXPIRE', KEYS[1], 30000)",
    "TIME": "redis.call('TIME')",
    "DEL of a key, then HSET making it again": (
        "redis.call('DEL', KEYS[1]) redis.call('HSET', KEYS[1], 'f', '1')"
    ),
}


# The commands an uncontended acquire of a new name makes (lua/acquire.lua,
# before its helpers), with none of its decisions: what its work costs the
# server before any logic of the library's.
_SIX = """
redis.call('HMGET', KEYS[3], 'q', 'f', 'd', 'e', 'h')
local clock = redis.call('TIME')
local f = clock[1] .. clock[2]
redis.call('HSET', KEYS[1], 't', ARGV[1], 'f', f, 'o', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[3], 'f', f, 'h', f)
redis.call('PEXPIRE', KEYS[3], ARGV[7])
return f
"""


def _six(client: Any, n: int) -> None:
    from django_redislock.core.engine.keys import KeySpace

    space = KeySpace("cost")
    sha = client.script_load(_SIX)
    for i in range(n):
        keys = space.lock(f"six:{i}")
        client.evalsha(sha, 3, keys.lease, keys.queue, keys.state, *_ARGS)


# The fewest commands an uncontended pair can make and keep what the docs
# promise, with none of the library's decisions around them and the lease a
# string (one SET with its expiry, where a hash needs an HSET and a PEXPIRE):
# the state read for the queue's mark, the last fence and the memory of
# losses (first come, first served; fences that never go down; a repeatable
# release); TIME, for a fence that outlives the state; the lease with its
# token, fence and owner; the state's fence written and its TTL set (every
# key has one). The release reads the lease and the mark, deletes the lease
# and writes down that it ended without a loss. What the pair costs the
# server when nothing is spent on anything else: the floor of this design.
_LEAST_ACQUIRE = """
redis.call('HMGET', KEYS[3], 'q', 'f', 'e', 'h')
local clock = redis.call('TIME')
local f = clock[1] .. clock[2]
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. f .. '|' .. ARGV[3], 'NX', 'PX', ARGV[2])
redis.call('HSET', KEYS[3], 'f', f, 'h', f)
redis.call('PEXPIRE', KEYS[3], ARGV[4])
return f
"""
_LEAST_RELEASE = """
local lease = redis.call('GET', KEYS[1])
redis.call('HGET', KEYS[3], 'q')
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[3], 'e', ARGV[2])
return 1
"""


def _least(client: Any, n: int) -> None:
    from django_redislock.core.engine.keys import KeySpace

    space = KeySpace("cost")
    take, give = client.script_load(_LEAST_ACQUIRE), client.script_load(_LEAST_RELEASE)
    # Token, ttl, owner and state ttl; the wait, channel and attempt a waiter
    # needs in one more argument, as one text.
    args = [_ARGS[0], _ARGS[1], _ARGS[3], _ARGS[6], "1000|p:cost:N:0123456789abcdef|1"]
    for i in range(n):
        keys = space.lock(f"least:{i}")
        fence = client.evalsha(take, 3, keys.lease, keys.queue, keys.state, *args)
        client.evalsha(give, 3, keys.lease, keys.queue, keys.state, _ARGS[0], fence)


def _set_nx(client: Any, n: int) -> None:
    for i in range(n):
        client.set(f"cost:set:{i}", "0123456789abcdef", nx=True, px=30000)


def _inside(call: str, ops: int) -> float:
    setup = "redis.call('HSET', KEYS[1], 'f', '1', 'g', '2', 'h', '3') "
    setup += "redis.call('PEXPIRE', KEYS[1], 60000) "
    five = _per_op(_script(setup + f"for i = 1, 5 do {call} end return 1", _KEYS[:1], []), ops)
    none = _per_op(_script(setup + "return 1", _KEYS[:1], []), ops)
    return (five - none) / 5


def model(cfg: argparse.Namespace) -> int:
    ping = per_pair("PING", cfg.ops)
    rows: list[list[Any]] = [["PING (one round trip)", f"{ping:,.0f}", "1.0"]]
    for label, work in MODEL:
        print(f"  {label} ...", file=sys.stderr, flush=True)
        value = _per_op(work, cfg.ops)
        rows.append([label, f"{value:,.0f}", fmt(value / ping, 1)])
    for label, call in INSIDE.items():
        print(f"  {label} ...", file=sys.stderr, flush=True)
        value = _inside(call, cfg.ops)
        rows.append([f"inside a script: {label}", f"{value:,.0f}", fmt(value / ping, 1)])
    return _report("What a script costs the server (callgrind, per operation)", rows, cfg.rst)


def _report(title: str, rows: list[list[Any]], rst: bool) -> int:
    """Print ``rows`` of (what, instructions, x PING) under ``title``."""
    headers = ["what", "server instructions", "x PING"]
    print(f"{title}\n")
    show(headers, rows, rst)
    return 0


def per_item(item: str, ops: int) -> float:
    return _per_op(lambda client, n: _item_ops(client, item, n), ops)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser("server_cost", __doc__)
    p.add_argument("--ops", type=int, default=1000, help="N, pairs in the shorter run")
    p.add_argument(
        "--impls",
        default=",".join(k for k, impl in IMPLS.items() if impl.default),
        help="comma-separated implementations",
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="a new handle on a new name for every pair (the keys are created each time)",
    )
    p.add_argument("--rst", action="store_true", help="also print the table as reStructuredText")
    p.add_argument(
        "--items", action="store_true", help="what a lock, permit, waiter and record cost"
    )
    p.add_argument(
        "--contended",
        type=int,
        metavar="W",
        default=0,
        help="per contended critical section instead, W processes on one lock",
    )
    p.add_argument(
        "--parts",
        action="store_true",
        help="split each pair's or section's count by what the scripts do",
    )
    p.add_argument(
        "--model",
        action="store_true",
        help="what a script's parts cost: its call, its arguments, each redis.call",
    )
    return p.parse_args(argv)


def items(cfg: argparse.Namespace) -> int:
    ping = per_pair("PING", cfg.ops)
    rows: list[list[Any]] = [["PING (one round trip)", f"{ping:,.0f}", "1.0"]]
    for item, label in ITEMS.items():
        print(f"  {item} ...", file=sys.stderr, flush=True)
        value = per_item(item, cfg.ops)
        rows.append([label, f"{value:,.0f}", fmt(value / ping, 1)])
    return _report("Server instructions per item (callgrind)", rows, cfg.rst)


def contended(cfg: argparse.Namespace, keys: list[str]) -> int:
    print("  the section alone ...", file=sys.stderr, flush=True)
    alone = per_section(None, cfg.ops, cfg.contended)
    rows: list[list[Any]] = [["GET and SET, no lock (the section)", f"{alone:,.0f}", "-", "-"]]
    results: dict[str, float] = {}
    split: dict[str, dict[str, float]] = {}
    for key in keys:
        print(f"  {key} ...", file=sys.stderr, flush=True)
        split[key] = per_section_parts(key, cfg.ops, cfg.contended)
        results[key] = split[key]["total"]
    base = results.get("python_redis_lock")
    for key, value in results.items():
        rows.append(
            [
                IMPLS[key].label,
                f"{value:,.0f}",
                f"{value - alone:,.0f}",
                fmt((value - alone) / (base - alone), 2) if base else "-",
            ]
        )
    headers = ["implementation", "per section", "less the section", "x python-redis-lock"]
    print(
        "Server instructions per contended critical section (callgrind; "
        f"{cfg.contended} processes on one lock, a new handle each section)\n"
    )
    show(headers, rows, cfg.rst)
    if cfg.parts:
        print("\nWhere they go, per section (inclusive counts of the server's functions)\n")
        show(PART_HEADERS, [[IMPLS[key].label, *script_parts(split[key])] for key in keys], cfg.rst)
    return 0


PART_HEADERS = [
    "implementation",
    "calling scripts",
    "Lua's own work",
    "commands in scripts",
    "the rest",
]


def script_parts(counts: dict[str, float]) -> list[str]:
    """A section's instructions by part: calling its scripts (the arguments
    made Lua values, the script found, its reply made a reply), the Lua
    code's own work (its string and number operations, and making each
    ``redis.call``'s arguments and reply), the commands its ``redis.call``s
    run, and the rest (reading requests, commands sent outside scripts, the
    section's ``GET`` and ``SET`` among them, writing replies)."""
    run, lua, commands = (counts[name] for name in PARTS)
    if not run:
        return ["-"] * 4  # a server that names none of them
    return [f"{v:,.0f}" for v in (run - lua, lua - commands, commands, counts["total"] - run)]


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    if cfg.items:
        return items(cfg)
    if cfg.model:
        return model(cfg)
    keys = [k for k in cfg.impls.split(",") if k]
    unknown = [k for k in keys if k not in IMPLS]
    if unknown:
        raise SystemExit(f"unknown implementation(s) {unknown}; choose from {list(IMPLS)}")
    keys = [k for k in keys if IMPLS[k].missing() is None]
    if cfg.contended:
        return contended(cfg, keys)
    results: dict[str, float] = {"PING": per_pair("PING", cfg.ops)}
    split: dict[str, dict[str, float]] = {}
    for key in keys:
        print(f"  {key} ...", file=sys.stderr, flush=True)
        split[key] = per_pair_parts(key, cfg.ops, cfg.fresh)
        results[key] = split[key]["total"]
    base = results.get("baseline")
    rows: list[list[Any]] = []
    for key, value in results.items():
        label = "PING (one round trip)" if key == "PING" else IMPLS[key].label
        rows.append(
            [
                label,
                f"{value:,.0f}",
                fmt(value / results["PING"], 1),
                fmt(value / base, 2) if base else "-",
            ]
        )
    headers = ["implementation", "instructions", "x PING", "x baseline"]
    names = "a new handle and name each pair" if cfg.fresh else "one handle, one name"
    print(f"Server instructions per uncontended acquire+release (callgrind; {names})\n")
    show(headers, rows, cfg.rst)
    if cfg.parts:
        print("\nWhere they go, per pair (inclusive counts of the server's functions)\n")
        show(PART_HEADERS, [[IMPLS[key].label, *script_parts(split[key])] for key in keys], cfg.rst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
