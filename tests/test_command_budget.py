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
does once, not per section), then all start again together, so the count is
what a running site pays per section, the first waiter of that burst and the
TTL raises of a busy name included.
"""

from __future__ import annotations

import multiprocessing
import traceback
from typing import Any

import pytest
import redis

from django_redislock.core import Lock

pytestmark = pytest.mark.filterwarnings("ignore:This process .* fork:DeprecationWarning")

ctx = multiprocessing.get_context("fork")

# The ceilings, lowered as the hot path is cut (docs/benchmarks.rst gives the figures).
# A contended section is 12 commands; the first waiter of a burst and the TTL
# raises of a busy name add about 0.05 here, and more where a loaded host lets
# the queue run empty more often.
CONTENDED_PER_SECTION = 12.2
UNCONTENDED_NEW_NAME_PER_PAIR = 12
UNCONTENDED_NAME_IN_USE_PER_PAIR = 12

# Connection set-up and the test's own commands: not the lock's work.
_NOT_THE_LOCKS = frozenset({"info", "config", "ping", "hello", "client", "select", "command"})

WORKERS = 4
SECTIONS = 60
WARM = 10


def _lock_commands(stats: dict[str, Any], section_commands: int = 0) -> dict[str, int]:
    counts: dict[str, int] = {}
    for stat, values in stats.items():
        command = stat.removeprefix("cmdstat_")
        if command.split("|")[0] in _NOT_THE_LOCKS:
            continue
        counts[command] = int(values["calls"])
    for command in ("get", "set"):
        counts[command] = counts.get(command, 0) - section_commands
    return {c: n for c, n in counts.items() if n}


def _worker(url: str, barriers: Any, errors: Any) -> None:
    try:
        client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
        plain = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
        client.ping()
        plain.ping()
        start, warmed, counted = barriers
        # All start together, warm up, wait while the parent resets the count
        # once every one is warm, then start together again.
        for before, after, sections in ((start, None, WARM), (warmed, counted, SECTIONS)):
            before.wait(30)
            if after is not None:
                after.wait(30)
            for _ in range(sections):
                lock = Lock(client, "budget", ttl=30, wait=60)
                if not lock.acquire():
                    errors.put("acquire timed out")
                    return
                value = int(plain.get("budget:counter") or 0)
                plain.set("budget:counter", value + 1)
                lock.release()
        client.close()
        plain.close()
    except BaseException:
        errors.put(traceback.format_exc())


def test_commands_per_contended_critical_section(redis_server: Any, r: redis.Redis) -> None:
    barriers = tuple(ctx.Barrier(WORKERS + 1) for _ in range(3))
    errors = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(redis_server.url, barriers, errors))
        for _ in range(WORKERS)
    ]
    for p in procs:
        p.start()
    start, warmed, counted = barriers
    start.wait(30)
    warmed.wait(60)
    r.config_resetstat()
    counted.wait(30)
    for p in procs:
        p.join(120)
    assert errors.empty(), errors.get()
    done = WORKERS * SECTIONS
    stats = r.info("commandstats")
    assert int(r.get("budget:counter") or 0) == WORKERS * (WARM + SECTIONS)
    commands = _lock_commands(stats, section_commands=done)
    # The sections were contended: most were handed on to a queued waiter.
    assert stats["cmdstat_publish"]["calls"] >= done // 2, commands
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
    commands = _lock_commands(r.info("commandstats"))
    per_pair = sum(commands.values()) / pairs
    ceiling = UNCONTENDED_NEW_NAME_PER_PAIR if new_name else UNCONTENDED_NAME_IN_USE_PER_PAIR
    assert per_pair <= ceiling, (per_pair, commands)
