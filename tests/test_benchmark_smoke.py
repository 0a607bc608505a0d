"""The harnesses in ``benchmarks/`` still run: each imports, and the work each
measures through the library's own API runs once, at a tiny size.

The harnesses are not part of the package, so nothing else would notice when
a name they use moves; their figures are what the docs quote."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchmarks.server_cost import MODEL

ROOT = Path(__file__).resolve().parents[1]
HARNESSES = sorted(
    path.stem for path in (ROOT / "benchmarks").glob("*.py") if path.stem != "__init__"
)


@pytest.mark.parametrize("name", HARNESSES)
def test_every_harness_imports(name: str) -> None:
    importlib.import_module(f"benchmarks.{name}")


@pytest.mark.parametrize("item", ["lock", "permit", "waiter", "record"])
def test_the_server_cost_items_run(r: Any, item: str) -> None:
    from benchmarks.server_cost import ITEMS, _item_ops

    assert item in ITEMS
    _item_ops(r, item, 2)


@pytest.mark.parametrize("work", [work for _, work in MODEL], ids=[label for label, _ in MODEL])
def test_the_server_cost_model_runs(r: Any, work: Callable[[Any, int], None]) -> None:
    """Each whole operation ``server_cost --model`` measures, which
    docs/benchmarks.rst quotes."""
    work(r, 2)


def test_the_least_pair_takes_and_gives_back_a_fenced_lease(r: Any) -> None:
    """The model of the fewest commands a pair can make does what a pair does:
    the lease is written with a TTL, the token and the fence; the release
    deletes it, and the state keeps the fence, written down as ended, with a
    TTL of its own."""
    from benchmarks.server_cost import _ARGS, _LEAST_ACQUIRE, _LEAST_RELEASE
    from django_redislock.core.engine.keys import KeySpace

    keys = KeySpace("cost").lock(f"least-smoke:{id(r)}")
    three = (keys.lease, keys.queue, keys.state)
    args = [_ARGS[0], _ARGS[1], _ARGS[3], _ARGS[6], "1000|-|1"]
    fence = r.eval(_LEAST_ACQUIRE, 3, *three, *args)
    assert r.get(keys.lease) == f"{_ARGS[0]}|{fence.decode()}|{_ARGS[3]}".encode()
    assert 0 < r.pttl(keys.lease) <= _ARGS[1]
    assert r.eval(_LEAST_RELEASE, 3, *three, _ARGS[0], fence) == 1
    assert not r.exists(keys.lease)
    assert r.hmget(keys.state, "f", "e") == [fence, fence]
    assert 0 < r.pttl(keys.state) <= _ARGS[6]


def test_the_capacity_record_sizing_runs(r: Any) -> None:
    from benchmarks.capacity import idempotency_records

    assert idempotency_records(r, 2, 16) > 0


@pytest.mark.parametrize("key", ["fifo_floor", "fifo_floor_heavy", "lean_client"])
def test_the_first_come_floor_hands_the_lock_on_in_order(
    r: Any, redis_server: Any, key: str
) -> None:
    """The contended runs' first-come reference is a lock in that order: a
    waiter in another process is handed the lease on release, with the next
    fence, and gets it without asking again; so are its copy that does the
    library's server work too and the library's scripts run by its client."""
    import multiprocessing

    from benchmarks.impls import IMPLS

    make = IMPLS[key].factory
    name = f"bench-smoke:{id(r)}"
    held = make(r, name, 10.0, 0.0)
    lease, queue, _ = keys = held._keys  # type: ignore[attr-defined]
    r.delete(*keys)
    assert held.acquire()
    first = held.fence  # type: ignore[attr-defined]
    context = multiprocessing.get_context("fork")
    answer = context.Queue()

    def waiter() -> None:
        client = redis_server.client(socket_timeout=5, socket_connect_timeout=5)
        handle = make(client, name, 10.0, 10.0)
        answer.put((handle.acquire(), handle.fence))
        handle.release()

    child = context.Process(target=waiter)
    child.start()
    try:
        deadline = time.monotonic() + 10
        while not r.llen(queue):  # wait for the child to queue
            assert time.monotonic() < deadline, "the waiter never queued"
            r.blpop([f"{name}:never"], timeout=0.01)  # a bounded pause on the server's clock
        held.release()
        acquired, fence = answer.get(timeout=10)
        assert acquired
        assert fence == first + 1 if key.startswith("fifo") else fence > first
    finally:
        child.join(10)
        r.delete(*keys)
    assert child.exitcode == 0
    assert not r.exists(lease)


def test_a_contended_cell_splits_the_client_cpu_by_part(redis_server: Any) -> None:
    from benchmarks import locks

    cfg = locks.parse(["--cpu-parts", "--warmup", "0.1", "--duration", "0.3", "--wait", "5"])
    result = locks.contended_cell(redis_server, "ours", 2, 0, cfg, shape="new/redis")
    assert result["critical_sections"] > 0
    assert result["violations"] == 0
    parts = result["client_cpu_parts_us_per_cs"]
    assert set(parts) == {*locks.CPU_PARTS, "other threads"}
    assert parts["acquire"] > 0
    cell = {**result, "client_cpu_parts_us_per_cs": parts, "client_cpu_us_per_cs": 1.0}
    table = locks._render_cpu_parts(
        {"contended": {locks.cell_key(2, "new/redis"): {"ours": cell}}}, locks.table
    )
    assert "acquire" in table[0]


@pytest.mark.parametrize("key", ["ours", "fifo_floor", "fifo_floor_heavy", None])
def test_the_contended_server_cost_runs(r: Any, key: str | None) -> None:
    from benchmarks.server_cost import _sections

    r.delete("cost:counter", "cost:contended")
    try:
        _sections(r, key, 2, 3)
        assert int(r.get("cost:counter")) <= 6
    finally:
        r.delete(
            "cost:counter", *(f"cost:contended:{part}" for part in ("lease", "queue", "fence"))
        )


@pytest.mark.parametrize(
    ("what", "contended"),
    [
        ("ours", False),
        ("ours", True),
        ("decorator", False),
        ("call:library", False),
        ("call:redis_py", False),
    ],
)
def test_the_client_cost_worker_runs(redis_server: Any, what: str, contended: bool) -> None:
    # What client_cost counts under callgrind, run once without it: a process
    # of its own, as the harness runs it (the decorator sets Django up there).
    import subprocess

    from benchmarks.client_cost import _child_variables, _command

    subprocess.run(
        _command(what, 3, redis_server.url, contended),
        env=_child_variables(None),
        cwd=redis_server.dir,
        check=True,
        timeout=120,
    )


def test_the_server_cost_parts_are_read_from_callgrind_s_report() -> None:
    """``server_cost --parts`` reads the total and the inclusive counts of
    the script functions from ``callgrind_annotate --inclusive=yes``: a
    function's first line counts (not a recursive call's, named ``'2``), a
    function the server does not name counts 0, and the split adds up to
    the total."""
    from benchmarks.server_cost import PARTS, counts_of, script_parts

    report = """\
--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
1,000,000 (100.0%)  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir                  file:function
--------------------------------------------------------------------------------
1,000,000 (100.0%)  ???:aeMain [/usr/bin/redis-server]
  700,000 (70.00%)  ???:evalGenericCommand [/usr/bin/redis-server]
  500,000 (50.00%)  ???:lua_pcall [/usr/bin/redis-server]
  200,000 (20.00%)  ???:scriptCall [/usr/bin/redis-server]
  150,000 (15.00%)  ???:call'2 [/usr/bin/redis-server]
"""
    counts = counts_of(report)
    assert counts == {
        "total": 1_000_000,
        "evalGenericCommand": 700_000,
        "lua_pcall": 500_000,
        "scriptCall": 200_000,
    }
    split = [int(v.replace(",", "")) for v in script_parts(counts)]
    assert split == [200_000, 300_000, 200_000, 300_000]
    assert sum(split) == counts["total"]
    unnamed = counts_of(report.replace("scriptCall", "scriptRun"))
    assert unnamed["scriptCall"] == 0 and set(unnamed) == {"total", *PARTS}
    assert script_parts({"total": 5, **dict.fromkeys(PARTS, 0)}) == ["-"] * 4
    with pytest.raises(RuntimeError, match="PROGRAM TOTALS"):
        counts_of("no totals here")


def test_the_client_cost_footprint_counts_the_functions_of_an_operation(redis_server: Any) -> None:
    """``client_cost --footprint``'s function count runs the worker under
    cProfile (no valgrind needed): an uncontended pair of this library's
    calls some dozens of functions in every operation."""
    from benchmarks.client_cost import _child_variables, _functions

    called, own = _functions("ours", 4, redis_server.url, False, _child_variables(None))
    assert 20 < called < 1000
    assert 0 < own < called


def test_the_client_cost_reads_every_event_callgrind_counted() -> None:
    """Instructions alone, or with the simulated caches' events, by the
    names callgrind gives them; a file without totals is an error."""
    from types import SimpleNamespace

    from benchmarks.client_cost import called_in_half, totals_of

    assert totals_of(b"version: 1\nevents: Ir\nsummary: 1234\n") == {"Ir": 1234}
    cached = b"events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw\nfl=x\ntotals: 9 8 7 6 5 4 3 2 1\n"
    assert totals_of(cached) == {
        "Ir": 9,
        "Dr": 8,
        "Dw": 7,
        "I1mr": 6,
        "D1mr": 5,
        "D1mw": 4,
        "ILmr": 3,
        "DLmr": 2,
        "DLmw": 1,
    }
    with pytest.raises(RuntimeError, match="no totals"):
        totals_of(b"events: Ir\n")
    # pstats rows: (primitive calls, calls, ...); half of 10 operations is 5.
    stats = SimpleNamespace(
        stats={
            ("/x/redis/a.py", 1, "a"): (5, 5),
            ("/x/redis/b.py", 1, "b"): (4, 4),
            ("/x/django_redislock/c.py", 1, "c"): (30, 30),
        }
    )
    assert called_in_half(stats, 10) == 2
    assert called_in_half(stats, 10, "/django_redislock/") == 1
