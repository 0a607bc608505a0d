"""The levels of the throttling semaphores, read from Redis when a backend asks (a scrape).

Permits in use and requests queued are not counted per process: they are
read from Redis (one read-only script per global rule), so whichever process
answers a scrape, the value is the whole site's. A scrape must answer even
when Redis hangs: ``levels_within`` waits at most ``SCRAPE_TIMEOUT`` for the
read, not the socket timeout of lock calls.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from ..core import RedisUnavailable

__all__ = ["SCRAPE_TIMEOUT", "Level", "levels_within", "semaphore_levels"]

# How long a scrape waits for Redis to read the throttling gauges: a scrape
# while Redis hangs answers in this long (without them), not the socket
# timeout (2 s by default) of lock calls. One read is in flight at a time.
SCRAPE_TIMEOUT = 0.5


@dataclass(frozen=True)
class Level:
    """One throttling rule's semaphore, as Redis has it now."""

    name: str
    in_use: int
    limit: int
    waiting: int


def semaphore_levels() -> list[Level]:
    """Permits in use and requests waiting, for every global throttling rule.

    Rules come from ``REDISLOCK["THROTTLE"]`` and from ``concurrency_limited``
    views this process has imported. A per-client rule has one semaphore per
    client and is left out: listing them would take a SCAN per scrape. One
    read-only script per rule; raises ``RedisUnavailable``.
    """
    from ..connection import get_client
    from ..core import find_locks
    from ..locking.factories import keyspace
    from ..throttling.middleware import decorated_rules, semaphore_name
    from ..throttling.rules import current_rules

    rules = {rule.name: rule for rule in current_rules() if not rule.per_client}
    for name, rule in list(decorated_rules.items()):
        if not rule.per_client:
            rules.setdefault(name, rule)
    if not rules:
        return []
    by_semaphore = {semaphore_name(rule, None): rule for rule in rules.values()}
    # Counts only: no waiter is listed (a scrape must stay cheap).
    rows, _missing = find_locks(
        get_client(), keyspace(), by_semaphore, kinds=("semaphore",), waiters=0
    )
    found = {row.name: row for row in rows}
    levels = []
    for sem_name, rule in by_semaphore.items():
        row = found.get(sem_name)
        levels.append(
            Level(
                name=rule.name,
                in_use=len(row.holders) if row is not None else 0,
                limit=rule.limit,
                waiting=row.waiters if row is not None else 0,
            )
        )
    return levels


class _LevelReader:
    """``semaphore_levels`` within a bound, one read in flight at a time.

    The read runs on a thread of its own: a scrape waits for it at most
    ``timeout`` seconds, then answers without the gauges. A read still
    running (Redis hangs) is not joined by a second one: the next scrapes
    answer at once until it ends, which the client's socket timeout bounds.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._running: threading.Thread | None = None

    def read(self, timeout: float) -> list[Level]:
        done = threading.Event()
        found: list[Any] = []

        def run() -> None:
            try:
                found.append(semaphore_levels())
            except Exception as exc:  # reported to the scrape
                found.append(exc)
            finally:
                done.set()

        with self._mutex:
            if self._running is not None and self._running.is_alive():
                raise RedisUnavailable(
                    "the previous read of the throttling semaphores has not ended yet"
                )
            thread = threading.Thread(target=run, name="redislock-metrics-levels", daemon=True)
            self._running = thread
            thread.start()
        if not done.wait(timeout):
            raise RedisUnavailable(f"Redis did not answer within {timeout:g}s (SCRAPE_TIMEOUT)")
        if isinstance(found[0], Exception):
            raise found[0]
        return list(found[0])


_levels = _LevelReader()


def levels_within(timeout: float | None = None) -> list[Level]:
    """``semaphore_levels()``, or ``RedisUnavailable`` after ``timeout``
    seconds (default ``SCRAPE_TIMEOUT``): what a scrape reads."""
    return _levels.read(SCRAPE_TIMEOUT if timeout is None else timeout)
