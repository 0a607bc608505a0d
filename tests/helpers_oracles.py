"""Checks that do not trust the lock: keyspace audits and shared-memory oracles."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import redis

if TYPE_CHECKING:
    from tests.drive import Drive

SENTINEL_KEY = b"foreign:sentinel"
SENTINEL_VALUE = b"untouched"


def plant_sentinel(client: redis.Redis) -> None:
    """A key outside the library's prefix, with no TTL, that must survive everything."""
    client.set(SENTINEL_KEY, SENTINEL_VALUE)


def audit_keyspace(client: redis.Redis, prefix: str = "redislock") -> list[bytes]:
    """Assert every key under ``prefix`` has a TTL and the sentinel is intact.

    Returns the keys found under the prefix, for further checks.
    """
    found = []
    for key in client.scan_iter(match=prefix.encode() + b":*", count=1000):
        ttl = client.pttl(key)
        # -2: expired between SCAN and PTTL, which is fine; -1 is a key without TTL.
        assert ttl != -1, f"key {key!r} has no TTL"
        if ttl != -2:
            found.append(key)
    assert client.get(SENTINEL_KEY) == SENTINEL_VALUE, "a key outside the prefix was touched"
    assert client.pttl(SENTINEL_KEY) == -1, "the foreign key got a TTL"
    return found


def lock_keys_present(client: redis.Redis, prefix: str = "redislock") -> dict[bytes, list[bytes]]:
    """Keys under the prefix grouped by kind: b"L" lease, b"Q" queue, b"H" state."""
    grouped: dict[bytes, list[bytes]] = {}
    for key in client.scan_iter(match=prefix.encode() + b":*", count=1000):
        kind = key[len(prefix) + 1 :].split(b":", 1)[0]
        grouped.setdefault(kind, []).append(key)
    return grouped


def exit_codes_of_forks(target: Callable[..., None], argses: list[tuple], timeout: float) -> list:
    """Fork a process per argument tuple, started together; their exit codes once all ended."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=target, args=args) for args in argses]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    return [p.exitcode for p in procs]


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.005) -> Any:
    """Poll ``predicate`` until it is truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {predicate!r}")
        time.sleep(interval)


class Occupancy:
    """Counts who is inside a critical section, independently of the lock under test.

    Works for threads and for forked processes (shared memory, own mutex).
    ``violations`` counts every time more than one was inside at once.
    ``unsafe`` is a read-pause-write counter: lost updates show as a shortfall.
    """

    def __init__(self, ctx: Any = None) -> None:
        if ctx is None:
            import multiprocessing

            ctx = multiprocessing.get_context("fork")
        self._mutex = ctx.Lock()
        self.inside = ctx.Value("i", 0, lock=False)
        self.violations = ctx.Value("i", 0, lock=False)
        self.entries = ctx.Value("i", 0, lock=False)
        self.unsafe = ctx.Value("q", 0, lock=False)

    def _enter(self) -> None:
        with self._mutex:
            self.inside.value += 1
            self.entries.value += 1
            if self.inside.value != 1:
                self.violations.value += 1

    def _leave(self) -> None:
        with self._mutex:
            self.inside.value -= 1

    @contextmanager
    def section(self, pause: float = 0.0005) -> Iterator[None]:
        self._enter()
        try:
            value = self.unsafe.value
            time.sleep(pause)
            self.unsafe.value = value + 1
            yield
        finally:
            self._leave()

    async def visit(self, drive: Drive, pause: float = 0.0005) -> None:
        """``section`` for a scenario on either driver: a task pauses without blocking the loop."""
        self._enter()
        try:
            value = self.unsafe.value
            await drive.sleep(pause)
            self.unsafe.value = value + 1
        finally:
            self._leave()


@contextmanager
def signal_sent(signal: Any) -> Iterator[list[dict[str, Any]]]:
    """The keyword arguments ``signal`` is sent with while the block runs."""
    sent: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        sent.append(kwargs)

    signal.connect(receiver)
    try:
        yield sent
    finally:
        signal.disconnect(receiver)


def lock_waiters(client: Any, keys: Any) -> dict[bytes, bytes]:
    """A lock's queued waiters, token -> entry (``<deadline>|<channel>|...``), oldest
    first: the first-come order keeps the entry in the queue's element
    (``<token>|<since>|<entry>``), the barging order in the state, by token."""
    waiters: dict[bytes, bytes] = {}
    for element in client.lrange(keys.queue, 0, -1):
        token, bar, rest = element.partition(b"|")
        if bar:
            waiters[token] = rest.partition(b"|")[2]
        else:
            entry = client.hget(keys.state, element)
            if entry is not None:
                waiters[element] = entry
    return waiters
