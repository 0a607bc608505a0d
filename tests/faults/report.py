"""Run the fault scenarios and rewrite ``docs/reliability.rst`` with their figures.

    python -m tests.faults.report            # quick run, about two minutes
    python -m tests.faults.report --long     # at least a million contended acquisitions
    python -m tests.faults.report --seed 7   # replay a run

Only private redis-server processes are used (started and stopped here).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.servers import server_label

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reliability.rst"

QUICK = {
    "contended_seconds": 30,
    "contended_quota": 10**9,
    "repeats": 3,
    "renewal": 2,
    "cancel_limit": 40,
    "freezes": 5,
    "model_steps": 20_000,
}
LONG = {
    "contended_seconds": 4 * 3600,
    "contended_quota": 1_000_000,
    "repeats": 20,
    "renewal": 6,
    "cancel_limit": 120,
    "freezes": 20,
    "model_steps": 200_000,
}


# What the tests cover: the page's claims and the tests that back them.
TESTS_TABLE = [
    ".. list-table::",
    "   :header-rows: 1",
    "   :widths: 40 60",
    "",
    "   * - Claim",
    "     - Tests",
    "   * - The quick scenarios above, with their targets",
    "     - ``tests/faults``",
    "   * - The paused holder's stale token is refused by ``fenced_update``",
    "     - ``tests/faults`` ``test_paused_holder_fence_rejected_by_fenced_update``",
    "   * - A gunicorn worker SIGKILLed mid-request gives its permit back when the",
    "       permit's TTL runs out",
    "     - ``tests/test_throttle_servers.py``",
    "   * - Several names: the loss of one is reported, Redis down leaves none held,",
    "       no deadlock nor overlap, a cancelled call leaves nothing held",
    "     - ``tests/test_multi_lock.py``",
    "   * - Read-write locks under the same faults",
    "     - ``tests/test_rwlock_faults.py``",
    "   * - Read-write locks: random interleavings checked in Redis after every step",
    "     - ``tests/test_rwlock_model.py``",
    "   * - Barging: exclusion, fences and the bound on a waiter's wait, at every step",
    "     - ``tests/test_barging.py``, ``tests/test_barging_random.py``",
    "   * - A release whose reply is lost: no ``LockLost`` for a release that did run",
    "     - ``tests/faults`` ``test_flaky_connection``; ``tests/test_lock.py``",
    "       ``test_a_repeated_release_reports_success_never_a_new_holders_lease``",
    "   * - Every interleaving the model tried",
    "     - ``tests/test_model.py``",
    "   * - What the model found, each with a regression test",
    "     - ``tests/test_edges.py``, ``tests/test_semaphore_edges.py``",
    "   * - The library reports a lost lease",
    "     - ``tests/test_docs_claims.py``",
]


def run(params: dict[str, Any], seed: int, log: Any) -> dict[str, Any]:
    from . import scenarios as s
    from .harness import ServerPool

    rng = random.Random(seed)
    figures: dict[str, Any] = {}
    steps: list[tuple[str, Any]] = [
        (
            "contended",
            lambda p: s.contended_run(
                p, seed=seed, seconds=params["contended_seconds"], quota=params["contended_quota"]
            ),
        ),
        ("killed", lambda p: s.holder_killed(p, rng, params["repeats"])),
        ("paused", lambda p: s.holder_paused(p, rng, params["repeats"] * 2)),
        ("late", lambda p: s.late_reply(p, rng, params["repeats"])),
        ("stalled", lambda p: s.stalled(p, rng)),
        ("restart_plain", lambda p: s.restarted(p, persistence=False)),
        ("restart_aof", lambda p: s.restarted(p, persistence=True)),
        ("renewal", lambda p: s.renewal_blackholed(p, rng, params["renewal"])),
        (
            "renewal_async",
            lambda p: s.renewal_blackholed(p, rng, params["renewal"], use_async=True),
        ),
        ("flaky", lambda p: s.flaky_connection(p, rng, params["repeats"])),
        ("cancel", lambda p: s.async_cancellation(p, limit=params["cancel_limit"])),
        ("fork", s.fork_while_holding),
        ("eviction", s.eviction),
        ("names", s.hostile_names),
        ("permits", lambda p: s.permits(p, rng)),
        ("permit_cancel", s.permit_cancellation),
        ("request", s.request_time),
        ("frozen", lambda p: s.frozen_redis(p, rng, freezes=params["freezes"])),
    ]
    steps.append(("model", lambda _p: model_run(params["model_steps"], seed)))
    for name, step in steps:
        started = time.monotonic()
        with ServerPool() as pool:
            try:
                figures[name] = step(pool)
            except Exception as exc:  # a failed scenario is a figure too
                figures[name] = {"failed": f"{type(exc).__name__}: {exc}"}
        log(
            f"{name}: {time.monotonic() - started:.1f}s "
            f"{json.dumps(figures[name], default=str)[:300]}"
        )
    return figures


def model_run(steps: int, seed: int) -> dict[str, Any]:
    """Run the model-based test (``tests/test_model.py``) for ``steps`` steps."""
    env = {
        **os.environ,
        "REDISLOCK_MODEL_STEPS": str(steps),
        "REDISLOCK_MODEL_SEED": str(seed % 2**31),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:randomly", "tests/test_model.py"],
        env=env,
        capture_output=True,
        text=True,
        timeout=max(600, steps // 20),
    )
    summary = next(
        (
            line
            for line in done.stdout.splitlines()
            if line.startswith("[model] ") and " steps " in line
        ),
        "",
    )
    counts: dict[str, str] = {}
    for part in summary.split(":", 1)[-1].split(","):
        label, _, number = part.strip().rpartition(" ")
        if number.isdigit():
            counts[label] = number
    return {
        "passed": done.returncode == 0,
        "steps": int(counts.get("steps", 0)),
        "counts": counts,
        "failure": "" if done.returncode == 0 else done.stdout[-2000:],
    }


def _table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    line = "  ".join("=" * w for w in widths)
    out = [line, "  ".join(c.ljust(w) for c, w in zip(rows[0], widths, strict=True)).rstrip(), line]
    for row in rows[1:]:
        out.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    out.append(line)
    return "\n".join(out)


def _codes(statuses: dict[str, list[int]], what: str) -> str:
    """The distinct status codes of every request of one kind, e.g. ``503``."""
    codes = sorted({c for k, v in statuses.items() if f" {what} " in f" {k} " for c in v})
    return "/".join(map(str, codes)) or "?"


def _yn(value: object) -> str:
    return "yes" if value else "no"


def _ok(cond: bool) -> str:
    return "met" if cond else "**missed**"


FROZEN_KINDS = ("acquire", "acquire-wait", "release")


def _frozen_calls(fz: dict[str, Any]) -> str:
    labels = {
        "acquire": "acquire trying once",
        "acquire-wait": "waiting acquire",
        "release": "release",
    }
    return "; ".join(
        f"{labels[kind]}: {fz[kind]['calls']:,} calls, {fz[kind]['over_bound']} over "
        f"{fz[kind]['bound']:.2f} s, longest {fz[kind]['longest']:.2f} s"
        for kind in FROZEN_KINDS
        if kind in fz
    )


def render(f: dict[str, Any], *, mode: str, seed: int, took: float) -> str:
    c, k, p, st, rq = f["contended"], f["killed"], f["paused"], f["stalled"], f["request"]
    plain, aof, ren, fl = f["restart_plain"], f["restart_aof"], f["renewal"], f["flaky"]
    ev, nm, pm, pc, cx = f["eviction"], f["names"], f["permits"], f["permit_cancel"], f["cancel"]
    fz = f.get("frozen", {})
    model = f.get("model", {})
    fz_calls = sum(fz.get(kind, {}).get("calls", 0) for kind in FROZEN_KINDS)
    fz_over = sum(fz.get(kind, {}).get("over_bound", 0) for kind in FROZEN_KINDS)
    failed = [name for name, v in f.items() if isinstance(v, dict) and "failed" in v]
    stale_attempted = p.get("attempted", 0) + int(plain.get("second_got_in", False))
    stale_rejected = p.get("rejected", 0) + int(plain.get("first_stale_write") is False)
    violations = c.get("occupancy", 0) + c.get("lost_updates", 0) + c.get("fence_order", 0)
    longest = max(
        st.get("longest", 0) / st.get("promised", 1),
        rq.get("longest", 0) / rq.get("promised", 1),
    )
    hangs = st.get("hangs", 0) + rq.get("hangs", 0)
    leaked = pm.get("leaked", 0) + cx["free"]["leaked"] + cx["contended"]["leaked"]
    bad_inputs = nm.get("names", 0) + nm.get("bad_arguments", 0)
    kill_runs = k.get("runs", [])
    renewals = list(ren.get("runs", [])) + list(f["renewal_async"].get("runs", []))
    before = sum(r["pttl_when_flagged"] > 0 for r in renewals)
    rows = [
        ("Figure", "Measured", "Target", "Status"),
        (
            "Contended acquisitions",
            f"{c.get('acquisitions', 0):,}",
            "1,000,000 (long run)",
            _ok(c.get("acquisitions", 0) >= 1_000_000) if mode == "long" else "quick run",
        ),
        (
            "Violations: occupancy / lost updates / fence order",
            f"{c.get('occupancy')} / {c.get('lost_updates')} / {c.get('fence_order')}",
            "0 / 0 / 0",
            _ok(violations == 0),
        ),
        (
            "Stale fenced writes rejected",
            f"{stale_rejected} of {stale_attempted}",
            "100 %",
            _ok(stale_rejected == stale_attempted > 0),
        ),
        (
            "Dead holder's lock free, after the lease Redis had left",
            f"+{1000 * k.get('max_late', 0):.1f} ms (worst of {len(kill_runs)})",
            "about a round trip",
            _ok(k.get("max_late", 1) < 0.25),
        ),
        (
            "Dead holder's lock free, as a share of its TTL",
            f"{100 * k.get('max_free_over_ttl', 0):.0f} % (worst)",
            "at most 100 %",
            _ok(k.get("max_free_over_ttl", 2) <= 1.05),
        ),
        (
            "Longest call against its promised bound",
            f"{100 * longest:.0f} % of bound, {st.get('calls', 0) + rq.get('calls', 0)} calls",
            "under 100 %",
            _ok(longest < 1),
        ),
        ("Hangs", str(hangs), "0", _ok(hangs == 0)),
        (
            "Renewal cut off: loss reported while Redis still had the key",
            f"{before} of {len(renewals)}",
            "100 %",
            _ok(before == len(renewals) > 0),
        ),
        (
            "Permits over the limit / leaked",
            f"{pm.get('over_limit')} / {leaked}",
            "0 / 0",
            _ok(pm.get("over_limit") == 0 and leaked == 0),
        ),
        (
            "Async cancellation points tried (lock), leaks",
            f"{cx['free']['tried'] + cx['contended']['tried']}, "
            f"{cx['free']['leaked'] + cx['contended']['leaked']}",
            "0 leaks",
            _ok(cx["free"]["leaked"] + cx["contended"]["leaked"] == 0),
        ),
        (
            "Async cancellation points tried (semaphore), leaks",
            f"{pc.get('tried')}, {pc.get('leaked')}",
            "0 leaks",
            _ok(pc.get("leaked") == 0),
        ),
        (
            "Redis frozen past the socket timeout: calls over their bound",
            f"{fz_over} of {fz_calls:,}",
            "0",
            _ok(fz_calls > 0 and fz_over == 0),
        ),
        (
            "Redis frozen: leases granted to nobody after it resumed",
            f"{fz.get('orphans')}, longest {fz.get('orphan_longest', 0):.2f} s",
            f"none past {fz.get('orphan_margin', 0):.1f} s",
            _ok(fz_calls > 0 and fz.get("orphan_longest", 1e9) <= fz.get("orphan_margin", 0)),
        ),
        (
            "Bad inputs tried (hostile names + bad arguments)",
            str(bad_inputs),
            "all mapped safely or refused",
            _ok(not nm.get("problems") and nm.get("refused") == nm.get("bad_arguments")),
        ),
    ]
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rq_codes = rq.get("statuses", {})
    parts = [
        "Reliability",
        "===========",
        "",
        "What the lock does on the worst day, measured on one machine by a suite that",
        "breaks things on purpose: private ``redis-server`` processes it pauses (SIGSTOP),",
        "kills (SIGKILL) and restarts, a TCP proxy between client and Redis that adds",
        "latency, blackholes connections, swallows replies, splits frames and resets",
        "connections, and holder processes it pauses and kills. Mutual exclusion is",
        "judged by oracles that do not trust the lock: an occupancy counter and a",
        "read-modify-write counter in shared memory (a lost update is a violation),",
        "the order of fencing tokens, a fenced SQL table, a ledger of lock tokens (a",
        "lease whose holder has given up on it is granted to nobody), and an audit of",
        "the keyspace after every scenario (no library key without a TTL, no foreign",
        "key touched).",
        "",
        "Regenerating this page",
        "----------------------",
        "",
        "From a checkout, inside any test environment of ``tox -l`` (it has what the",
        "suite needs)::",
        "",
        "    tox exec -e py313-django61-redis8 -- python -m tests.faults.report",
        "    tox exec -e py313-django61-redis8 -- python -m tests.faults.report --long",
        "    tox exec -e py313-django61-redis8 -- python -m tests.faults.report --seed N",
        "",
        "The first is the quick, CI-sized run; ``--long`` makes one million contended",
        "acquisitions; ``--seed N`` replays the randomised timings.",
        "",
        "The quick scenarios also run in the test suite (``pytest tests/faults``); every",
        "scenario prints its seed, and ``REDISLOCK_FAULT_SEED=N`` replays it there.",
        "",
        # The server the scenarios ran on (REDISLOCK_SERVER_BIN, else redis-server).
        f"This page: **{mode} run**, seed {seed}, {when}, {took:.0f} s; "
        f"{server_label()}, Python {platform.python_version()}, {os.cpu_count()} CPU cores "
        "shared with other work.",
        "",
    ]
    if failed:
        parts += [f".. warning:: scenarios that failed in this run: {', '.join(failed)}", ""]
    parts += [
        "Figures",
        "-------",
        "",
        _table(rows),
        "",
        f"The contended run: {c.get('processes')} processes, {c.get('locks')} locks, "
        f"{c.get('seconds', 0):.0f} s, {c.get('rate', 0):,.0f} acquisitions/s, with Redis's "
        f"script cache flushed {c.get('script_flushes')} times mid-run (every acquire, "
        "release and extend then meets ``NOSCRIPT`` and falls back to ``EVAL``). "
        f"Busy results: {c.get('busy')}; errors: {c.get('errors')}.",
        "",
        "Scenarios",
        "---------",
        "",
        "Holder SIGKILLed",
        f"  A holder process is killed at a random point of its lease while another waits "
        f"in the queue ({len(kill_runs)} runs, TTL 0.4 to 1.2 s). The waiter gets the lock "
        "when Redis expires the dead lease, at most "
        f"{1000 * k.get('max_late', 0):.1f} ms after the lease time Redis had left at the kill.",
        "",
        "Holder paused past its lease",
        f"  The holder process is SIGSTOPped until its lease expires ({p.get('attempted')} "
        "runs); a new holder takes the lock and writes; the old one is resumed and writes "
        "with its fence: ``UPDATE ... WHERE fence <= ?`` rejected "
        f"{p.get('rejected')} of {p.get('attempted')}. Its release raised ``LockLost`` "
        f"{p.get('stale_release_lost')} times and left the new holder's lease intact "
        f"{p.get('new_lease_intact')} times. The same stale token is refused by "
        "``django_redislock.fencing.fenced_update`` (``StaleFence``).",
        "",
        "Late reply",
        f"  The acquire's reply arrives after the lease could have ended but before the "
        f"socket timeout (proxy latency longer than the TTL, or Redis SIGSTOPped with the "
        f"request in flight, for less than the socket timeout): "
        f"{f['late'].get('not_acquired')} of {f['late'].get('tried')} counted as not acquired, "
        f"{f['late'].get('left_behind')} leases left behind (the late grant is handed back). "
        "A freeze longer than the socket timeout is the next scenario.",
        "",
        "Redis frozen past the socket timeout",
        f"  {fz.get('processes')} processes contend for {fz.get('locks')} locks with the "
        f"library's own clients (socket timeout {fz.get('socket_timeout')} s; half the "
        f"acquires try once, half wait up to {fz.get('wait')} s; TTL {fz.get('ttl')} s) "
        f"while Redis is SIGSTOPped {len(fz.get('frozen_for', []))} times, for "
        + ", ".join(f"{x:.2f}" for x in fz.get("frozen_for", []))
        + " s, then SIGCONTed. "
        f"{fz.get('acquisitions', 0):,} acquisitions; violations (occupancy / lost updates "
        f"/ fence order): {fz.get('occupancy')} / {fz.get('lost_updates')} / "
        f"{fz.get('fence_order')}; {fz.get('unavailable', 0):,} calls raised "
        "``RedisUnavailable`` (most of them at once, while the circuit breaker was "
        "open). Bound of a call: the socket timeout plus 0.25 s (plus the wait, for a "
        "waiting acquire): " + _frozen_calls(fz) + ". Leases left granted to "
        "nobody (their attempt had ended) after Redis resumed: "
        f"{fz.get('orphans')}, the longest seen for {fz.get('orphan_longest', 0):.2f} s "
        f"(allowed: {fz.get('orphan_margin')} s). Slowest calls: "
        + "; ".join(
            f"{c['kind']} {c['took']:.2f} s, started {abs(c['since_freeze']):.3f} s "
            f"{'after' if c['since_freeze'] >= 0 else 'before'} a freeze began"
            for c in fz.get("slowest", [])[:3]
            if c.get("since_freeze") is not None
        )
        + ".",
        "",
        "Redis stalled, blackholed, reset, killed",
        f"  Acquire, waiting acquire, extend, owned and release, against each: all "
        f"{st.get('calls')} calls raised ``RedisUnavailable``; longest "
        f"{st.get('longest', 0):.2f} s against a bound of {st.get('promised', 0):.2f} s "
        "(the worst case over every way a connection can fail: a broken connection is "
        "retried once, so two attempts of connect + socket timeout 0.3 s, plus the "
        "backoff; a timeout is never retried).",
        "",
        "Redis down at request time",
        "  Requests through the test client and the async test client while Redis is "
        "frozen (SIGSTOP) or dead: a view under ``redis_locked`` answers "
        + _codes(rq_codes, "/locked/")
        + " (fail closed; "
        + _codes(rq_codes, "/locked-open/")
        + " with ``fail_open=True``), and the "
        "throttling middleware lets the request through: "
        + _codes(rq_codes, "throttle-open")
        + " ("
        + _codes(rq_codes, "throttle-closed")
        + " with ``THROTTLE_FAIL_OPEN`` False). Longest request "
        f"{rq.get('longest', 0):.2f} s against {rq.get('promised', 0):.2f} s (one "
        "bounded call); never a 500. A gunicorn worker "
        "SIGKILLed mid-request under the throttling middleware gives its permit back "
        "when the permit's TTL runs out.",
        "",
        "Redis restarted",
        f"  With ``appendfsync always`` the lease survives a SIGKILL of Redis: extend "
        f"{aof.get('extend')}, release {aof.get('release')}, a second holder got in: "
        f"{aof.get('second_got_in')}. Without persistence see the non-guarantees below.",
        "",
        "Renewal cut off",
        "  A renewing holder (``renew=True``, ``Lock`` and ``AsyncLock``) whose connection "
        "is blackholed reports the loss itself (``on_lost``) while Redis still has the "
        f"key: {before} of {len(renewals)} runs; "
        + "; ".join(
            f"TTL {r['ttl']:.2f} s, reported {r['flagged_after']:.2f} s after the cut with "
            f"{r['pttl_when_flagged']} ms of the key left"
            for r in renewals[:4]
        )
        + ". A renewal that fails is retried only while an attempt as slow as the "
        "slowest since Redis last answered can end inside the lease with as much again "
        "to spare, and a tenth of the lease (at least 50 ms) besides for a thread that "
        "runs late; otherwise the loss is reported at once.",
        "",
        "Connection faults",
        f"  Frames split into 1 to 7 byte pieces ({fl.get('split_ok')} runs), the pooled "
        f"connection reset under a holder ({fl.get('reset_ok')}), the acquire's reply "
        f"swallowed ({len(fl.get('dropped_acquire_library', []))} with the library's "
        f"client, {len(fl.get('dropped_acquire_retrying', []))} with a client that "
        "retries timeouts): each time the lock behaved. The library's client reports "
        "``RedisUnavailable`` and gives the lease back (leases left behind: "
        f"{fl.get('left_behind')}); a retrying client's second run of the acquire finds "
        "the lease under its own token and keeps it.",
        "",
        "Async cancellation",
        f"  ``AsyncLock.acquire`` cancelled after 0, 1, 2, ... event-loop iterations, free "
        f"({cx['free']['tried']} points) and queued behind a holder "
        f"({cx['contended']['tried']}): leases or queue entries left: "
        f"{cx['free']['leaked'] + cx['contended']['leaked']}.",
        "",
        "Fork while holding",
        "  The child sees ``held`` " + str(f["fork"].get("held")) + ", ``owned()`` "
        f"{f['fork'].get('owned')}, release {f['fork'].get('release')}, extend "
        f"{f['fork'].get('extend')}; the parent still owns the lease: "
        f"{f['fork'].get('parent_still_owns')}.",
        "",
        "Hostile names",
        f"  {nm.get('names')} names (glob characters, braces, CR LF, NUL, lone surrogates, "
        "RESP fragments, 100,000 characters, ...) held at once: each maps to its own keys "
        "under the prefix, in one hash slot, and no other client can take them; "
        f"{nm.get('refused')} of {nm.get('bad_arguments')} bad arguments refused at "
        "construction with an error naming the argument.",
        "",
        "Semaphore permits",
        f"  {pm.get('acquisitions')} contended acquisitions by threads, never more than the "
        f"limit inside ({pm.get('over_limit')} over); a SIGKILLed holder's permit came back "
        f"after {pm.get('killed_permit_back_after', 0):.2f} s (TTL "
        f"{pm.get('killed_permit_ttl', 0):.2f} s); permits left: {pm.get('leaked')}. "
        f"``AsyncSemaphore.acquire`` cancelled at each await, free and queued: "
        f"{pc.get('leaked')} of {pc.get('tried')} cancellations left a permit or a queued "
        "waiter behind for a while (until its wait ran out).",
        "",
        "Eviction",
        "  ``maxmemory-policy`` other than ``noeviction`` is logged as a warning by "
        f"``django_redislock.connection`` (allkeys-lru: {ev.get('allkeys-lru')}, "
        f"volatile-ttl: {ev.get('volatile-ttl')}, noeviction: {ev.get('noeviction')}).",
        "",
        "Other kinds of lock",
        "-------------------",
        "",
        "The figures above are for locks on one name, in the default order, and for "
        "semaphores. The other kinds meet the same faults in the test suite, not in this "
        "report:",
        "",
        "Several names (``MultiLock``)",
        "  Each name is an ordinary lease with its own fence, so everything above holds "
        "name by name. The loss of one name is reported (``LockLost``, ``lost``) and the "
        "others are given back; Redis down leaves none held; callers that list the names "
        "in opposite orders under load never deadlock nor overlap; a cancelled acquire or"
        " release leaves nothing held.",
        "",
        "Read-write locks",
        "  A late reply is not an acquisition, lost replies leave nothing and report no "
        "false loss, every call against a frozen Redis ends within its bound, and a "
        "holder of a Redis restarted empty learns its loss, for readers and writers alike"
        "; random interleavings are checked in Redis "
        "after every step. Only a writer has a fence: a "
        "reader whose lease ran out is not kept out of the data by anything.",
        "",
        "Barging (``fair=False``)",
        "  The same exclusion and fences as the default order (every grant gets a new, "
        "larger token), with fair and barging handles mixed on one name; random "
        "interleavings check mutual exclusion and the bound on a waiter's wait at every "
        "step.",
        "",
        "What we do not promise, shown",
        "-----------------------------",
        "",
        "Mutual exclusion holds while the lease is valid on a Redis that keeps its keys.",
        "Each of these breaks that premise; the scenario shows what happens and what",
        "still protects the data.",
        "",
        "Redis restarted without persistence",
        f"  The lease is gone. A second holder got in ({_yn(plain.get('second_got_in'))}) "
        "while the first still believed it held (``held`` was "
        f"{plain.get('first_believed_held')}). The new fence is larger "
        f"({_yn(plain.get('fence_increased'))}: fences follow the server clock, not a "
        "counter that restarts with Redis). After the new holder wrote, the old holder's "
        f"fenced write was refused ({_yn(plain.get('first_stale_write') is False)}). It "
        f"learnt of the loss at extend ({plain.get('extend')}) and at release "
        f"({plain.get('release')}). Between the restart and its next extend, the old "
        "holder's *unfenced* work overlapped the new holder's.",
        "",
        "Eviction",
        "  With ``volatile-ttl`` and memory full, the lease (the key with the shortest TTL) "
        f"was evicted after {ev.get('evicted_lease', {}).get('writes')} writes of other "
        f"keys; a second holder got in: {ev.get('evicted_lease', {}).get('second_got_in')}, "
        "while the first believed it held: "
        f"{ev.get('evicted_lease', {}).get('first_believed_held')}. Use ``noeviction``, or "
        "a Redis of its own for locks.",
        "",
        "A holder that stops past its lease",
        "  A GC pause, a SIGSTOP or a swapped-out process outlives any TTL. The next "
        "holder gets in, as it should. Only a fenced write keeps the old holder out of "
        "the data, and only once the newer holder has written (or claimed the row): a "
        "stale write that reaches the resource first is accepted.",
        "",
        "A release whose reply is lost",
        "  The library's own clients retry once on a broken connection and never on a "
        "timeout (the call may have run): with the release's reply swallowed, the caller "
        "got ``RedisUnavailable`` "
        f"({fl.get('dropped_release_library', []).count('unavailable')} of "
        f"{len(fl.get('dropped_release_library', []))} runs) although the release ran. "
        "A client of the user's own that retries timeouts (redis-py's default policy "
        "does) gets the same: lock scripts never go through a client's retries, and "
        "the give-back that follows is safe to repeat "
        f"({fl.get('dropped_release_retrying', []).count('unavailable')} of "
        f"{len(fl.get('dropped_release_retrying', []))} runs unavailable, "
        f"{fl.get('dropped_release_retrying', []).count('released')} released). "
        "A release retried all the same is told the truth: the state remembers the "
        "leases lost, not the ones released, however often the name changed hands in "
        'between (:doc:`internals`, "Repeatable release"). ``LockLost`` reported for '
        "a release that did run: "
        + str(
            fl.get("dropped_release_library", []).count("LockLost")
            + fl.get("dropped_release_retrying", []).count("LockLost")
        )
        + ".",
        "",
        "Every interleaving the model tried",
        "  The model-based test drives handles on a few names and a semaphore through "
        "random interleavings of acquire, waiting (paused at each step of its wait loop), "
        "release, extend, renewal, expiry, force-clear, lost replies, Redis frozen and "
        "restarted empty, and checks after every step: no two handles believe they hold a "
        "name and none believes it holds one Redis says it does not, fences only grow, "
        "every key has a TTL, every call ends within its bound, no false ``LockLost``, no "
        "more permits than the limit and nothing held once a run ends. This run: "
        + (
            f"{model.get('steps', 0):,} steps, "
            + ("no invariant broken" if model.get("passed") else "**an invariant broke**")
            + "."
        )
        + " Written while the engine was reworked, it found a lock known to be lost "
        "still reported as held, a semaphore release retried after a lost reply "
        "reported as ``LockLost``, and an extend to a shorter TTL whose reply was lost "
        "leaving the handle counting on its old, longer lease; each has a regression "
        "test. CI runs 10,000 "
        "steps; ``REDISLOCK_MODEL_STEPS=N`` runs more.",
        "",
        "A holder that ignores the loss",
        "  The library reports a lost lease (``on_lost``, ``lock_lost``, ``held`` turning "
        "False, ``LockLost`` at the next extend or release) "
        "but cannot stop the holder's code. Work that "
        "carries on after the report overlaps the next holder's; fence "
        "the writes that matter.",
        "",
        "What the tests cover",
        "--------------------",
        "",
        # One row a claim above, with the tests that back it (kept beside the prose).
        "\n".join(TESTS_TABLE),
        "",
    ]
    return "\n".join(_wrap(part) for part in parts)


def _wrap(line: str) -> str:
    """Wrap a long paragraph line, keeping its indentation (tables are left alone)."""
    if "\n" in line or len(line) <= 88:
        return line
    indent = line[: len(line) - len(line.lstrip())]
    return textwrap.fill(
        line.strip(),
        88,
        initial_indent=indent,
        subsequent_indent=indent,
        break_on_hyphens=False,
        break_long_words=False,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", action="store_true", help="one million contended acquisitions")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--output", default=str(DOC))
    parser.add_argument("--figures", help="also save the raw figures as JSON to this file")
    parser.add_argument(
        "--render",
        metavar="FIGURES_JSON",
        help="only rewrite the page from figures saved by --figures",
    )
    args = parser.parse_args(argv)
    # Stopped with SIGTERM: unwind, so every server and process started here is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    # The scenarios make the library log losses on purpose; keep them off stderr
    # (handlers added by a scenario still see them).
    logging.getLogger("django_redislock").addHandler(logging.NullHandler())
    import django

    django.setup()
    if args.render:
        saved = json.loads(Path(args.render).read_text())
        text = render(saved["figures"], mode=saved["mode"], seed=saved["seed"], took=saved["took"])
        Path(args.output).write_text(text)
        print(f"[faults] wrote {args.output}")
        return 0
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    mode = "long" if args.long else "quick"
    print(f"[faults] {mode} run, seed={seed}", flush=True)
    started = time.monotonic()
    figures = run(LONG if args.long else QUICK, seed, lambda m: print(f"[faults] {m}", flush=True))
    took = time.monotonic() - started
    if args.figures:
        Path(args.figures).write_text(
            json.dumps({"mode": mode, "seed": seed, "took": took, "figures": figures}, default=str)
        )
    text = render(figures, mode=mode, seed=seed, took=took)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"[faults] wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
