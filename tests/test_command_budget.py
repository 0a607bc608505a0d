"""The hot path's command budget (DESIGN.md, invariant 16): how many commands the
server runs per contended critical section and per uncontended acquire+release,
counted from ``INFO commandstats`` (calls, those run inside scripts included), a
count and not a time, so that no change to a script or to the client can add
work to every caller unnoticed.

The contended figure is taken as ``python -m benchmarks.locks`` takes it: forked
workers, a new handle per acquisition (what the decorator makes per call), a
GET and a SET on the same Redis inside the section (left out of the count), and
every other command the server ran, connection set-up aside, divided by the
sections served. Each worker first serves a few sections of its own (its
scripts cached on the server, its wake-up channel subscribed: what a process
does once, not per section), then all start again together.

The count must not depend on how the host schedules the workers. Left to
run freely, a worker descheduled between its release and its next acquire
lets the queue run empty: Redis deletes an empty list, so the next waiter
makes the queue anew and gives it a TTL (one command more), or finds the lock
free; how often that happens is the host's load, not the library's work. So
each holder, inside its section, waits until every other worker with sections
left is queued (``LLEN`` on the queue, counted and taken off like the GET and
SET): every section but the first and the last few of each burst is the
steady state, a hand-off to a queued waiter with others behind it. Each
worker's first acquisition of a burst waits longer than the rest, so that
the state's mark covers the waits of the whole burst and no TTL is raised as
time goes by (a raise, once a second at most, is the other thing a slow host
would add).
"""

from __future__ import annotations

import multiprocessing
import time
import traceback
from typing import Any

import pytest
import redis

from django_redislock.core import Lock

pytestmark = pytest.mark.filterwarnings("ignore:This process .* fork:DeprecationWarning")

ctx = multiprocessing.get_context("fork")

# The ceilings, lowered as the hot path is cut (docs/benchmarks.rst gives the figures).
# A contended section is 12 commands; the start and the end of the counted
# burst (its first holder finds the lock free, its first waiter makes the
# queue, its last release finds nobody queued) add about 0.05 here.
CONTENDED_PER_SECTION = 12.1
UNCONTENDED_NEW_NAME_PER_PAIR = 12
UNCONTENDED_NAME_IN_USE_PER_PAIR = 12

# Connection set-up and the test's own commands: not the lock's work.
_NOT_THE_LOCKS = frozenset({"info", "config", "ping", "hello", "client", "select", "command"})

WORKERS = 4
SECTIONS = 60
WARM = 10
# A burst's first acquisition waits this long (ms), its others WAIT: the
# mark the first waiter sets covers the later ones' waits for FIRST_WAIT -
# WAIT, far longer than the burst takes.
FIRST_WAIT = 600_000
WAIT = 60_000
# How long a holder waits for the others to queue before it reports them missing (s).
QUEUED_WITHIN = 30.0


def _lock_commands(stats: dict[str, Any], taken_off: dict[str, int]) -> dict[str, int]:
    """The commands the server ran, less connection set-up and ``taken_off``
    (the test's own)."""
    counts: dict[str, int] = {}
    for stat, values in stats.items():
        command = stat.removeprefix("cmdstat_")
        if command.split("|")[0] in _NOT_THE_LOCKS:
            continue
        counts[command] = int(values["calls"])
    for command, calls in taken_off.items():
        counts[command] = counts.get(command, 0) - calls
    return {c: n for c, n in counts.items() if n}


def _worker(url: str, barriers: Any, left: Any, polls: Any, broken: Any, errors: Any) -> None:
    try:
        client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
        plain = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
        client.ping()
        plain.ping()
        start, warmed, counted = barriers
        # All start together, warm up, wait while the parent resets the count
        # once every one is warm, then start together again.
        for phase, (before, after, sections) in enumerate(
            ((start, None, WARM), (warmed, counted, SECTIONS))
        ):
            before.wait(30)
            if after is not None:
                after.wait(30)
            for i in range(sections):
                lock = Lock(client, "budget", ttl=30, wait=(FIRST_WAIT if i == 0 else WAIT) / 1000)
                if not lock.acquire():
                    errors.put("acquire timed out")
                    broken.set()
                    return
                # Every other worker with sections left queued behind this one.
                if i == sections - 1:
                    with left[phase].get_lock():
                        left[phase].value -= 1
                queued_by = time.monotonic() + QUEUED_WITHIN
                while not broken.is_set():
                    with polls.get_lock():
                        polls.value += 1
                    if plain.llen(lock.keys.queue) >= left[phase].value - (i < sections - 1):
                        break
                    if time.monotonic() > queued_by:
                        errors.put(f"the others did not queue within {QUEUED_WITHIN} s")
                        broken.set()
                value = int(plain.get("budget:counter") or 0)
                plain.set("budget:counter", value + 1)
                lock.release()
        client.close()
        plain.close()
    except BaseException:
        errors.put(traceback.format_exc())
        broken.set()  # the others stop waiting for this one to queue


def test_commands_per_contended_critical_section(redis_server: Any, r: redis.Redis) -> None:
    barriers = tuple(ctx.Barrier(WORKERS + 1) for _ in range(3))
    left = (ctx.Value("i", WORKERS), ctx.Value("i", WORKERS))  # workers with sections left
    polls = ctx.Value("i", 0)
    broken = ctx.Event()
    errors = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(redis_server.url, barriers, left, polls, broken, errors))
        for _ in range(WORKERS)
    ]
    for p in procs:
        p.start()
    start, warmed, counted = barriers
    start.wait(30)
    warmed.wait(60)
    r.config_resetstat()
    polls.value = 0
    counted.wait(30)
    for p in procs:
        p.join(120)
    assert errors.empty(), errors.get()
    done = WORKERS * SECTIONS
    stats = r.info("commandstats")
    assert int(r.get("budget:counter") or 0) == WORKERS * (WARM + SECTIONS)
    commands = _lock_commands(stats, {"get": done, "set": done, "llen": polls.value})
    # The sections were contended: all but the first were handed on to a
    # queued waiter.
    assert stats["cmdstat_publish"]["calls"] == done - 1, commands
    per_section = sum(commands.values()) / done
    print(f"commands per contended section: {per_section:.3f} {commands}")
    assert per_section <= CONTENDED_PER_SECTION, (per_section, commands)


@pytest.mark.parametrize("new_name", [True, False], ids=["new-name", "name-in-use"])
def test_commands_per_uncontended_acquire_and_release(r: redis.Redis, new_name: bool) -> None:
    client = redis.Redis(connection_pool=r.connection_pool)
    warm = Lock(client, "budget-warm", ttl=30, wait=1)
    assert warm.acquire()  # both scripts loaded, a connection made
    warm.release()
    pairs = 20
    r.config_resetstat()
    for i in range(pairs):
        lock = Lock(client, f"budget-{i}" if new_name else "budget", ttl=30, wait=1)
        assert lock.acquire()
        lock.release()
    commands = _lock_commands(r.info("commandstats"), {})
    per_pair = sum(commands.values()) / pairs
    ceiling = UNCONTENDED_NEW_NAME_PER_PAIR if new_name else UNCONTENDED_NAME_IN_USE_PER_PAIR
    assert per_pair <= ceiling, (per_pair, commands)
