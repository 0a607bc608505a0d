"""Oracles that judge mutual exclusion without trusting the lock under test.

* ``SharedOracles``: counters in shared memory, updated by every holder in every
  process: an occupancy counter (two holders inside at once is a violation), a
  read-modify-write counter (a lost update is a violation) and the last fencing
  token seen per lock (a token that does not increase is a violation). Their
  own atomicity comes from a process-shared semaphore, not from Redis.
* ``FenceTable``: a one-row SQLite table written only with
  ``UPDATE ... WHERE fence <= ?``, the storage-side guard fencing tokens exist for
  (the check ``fenced_update`` makes: a holder may write its row again).
* ``KeyspaceAudit``: after a scenario, no library key is left without a TTL and
  no key outside the library's prefix was touched.
* ``TokenLedger``: which process issued each lock token and when that process
  stopped holding or waiting with it, so that a lease found in Redis can be
  judged: held by a live attempt, or granted to nobody.
* ``FreezeTiming``: every call's duration against the bound promised for it.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

import redis

__all__ = ["FenceTable", "FreezeTiming", "KeyspaceAudit", "SharedOracles", "TokenLedger"]


class SharedOracles:
    """Per-lock counters in shared memory (``multiprocessing`` RawArrays)."""

    OCCUPANCY, FENCE_ORDER = 0, 1

    def __init__(self, ctx: Any, locks: int) -> None:
        self.locks = locks
        self.mutex = ctx.Lock()
        self.inside = ctx.RawArray("q", locks)
        self.counter = ctx.RawArray("q", locks)
        self.last_fence = ctx.RawArray("q", locks)
        self.entries = ctx.RawArray("q", locks)
        self.violations = ctx.RawArray("q", 2)

    def enter(self, i: int, fence: int) -> None:
        with self.mutex:
            self.inside[i] += 1
            if self.inside[i] > 1:
                self.violations[self.OCCUPANCY] += 1
            if fence <= self.last_fence[i]:
                self.violations[self.FENCE_ORDER] += 1
            else:
                self.last_fence[i] = fence

    def increment(self, i: int, dwell: float) -> None:
        # Deliberately not atomic: only the lock keeps two of these apart.
        value = self.counter[i]
        if dwell:
            time.sleep(dwell)
        else:
            time.sleep(0)  # yield the CPU between the read and the write
        self.counter[i] = value + 1

    def leave(self, i: int) -> None:
        with self.mutex:
            self.inside[i] -= 1
            self.entries[i] += 1

    def summary(self) -> dict[str, int]:
        entries = sum(self.entries)
        return {
            "acquisitions": entries,
            "occupancy": self.violations[self.OCCUPANCY],
            "fence_order": self.violations[self.FENCE_ORDER],
            "lost_updates": entries - sum(self.counter),
        }


class TokenLedger:
    """Tokens of the form ``<process slot: 4 hex><attempt: 28 hex>``, and when
    each stopped being live, in shared memory.

    A token is live from the moment its process starts an acquire with it until
    that acquire returns without the lease, or the release of its lease returns.
    A lease whose token died before Redis was read is granted to nobody. Death
    times are ``time.monotonic()`` (one clock for every process on the host);
    each process keeps its last ``ring`` deaths.
    """

    def __init__(self, ctx: Any, processes: int, ring: int = 4096) -> None:
        self.ring = ring
        self.issued = ctx.RawArray("q", processes)
        self.ring_seq = ctx.RawArray("q", processes * ring)
        self.ring_died = ctx.RawArray("d", processes * ring)

    def issue(self, slot: int) -> str:
        self.issued[slot] += 1
        return f"{slot:04x}{self.issued[slot]:028x}"

    @staticmethod
    def parse(token: bytes | str) -> tuple[int, int] | None:
        text = token.decode() if isinstance(token, bytes) else token
        if len(text) != 32:
            return None
        try:
            return int(text[:4], 16), int(text[4:], 16)
        except ValueError:
            return None

    def retire(self, slot: int, token: str) -> None:
        parsed = self.parse(token)
        if parsed is None:
            return
        index = slot * self.ring + parsed[1] % self.ring
        # The time first: a reader that sees the sequence number sees its time.
        self.ring_died[index] = time.monotonic()
        self.ring_seq[index] = parsed[1]

    def died_at(self, token: bytes | str) -> float | None:
        """When ``token`` stopped being live; None while it is live (or unknown)."""
        parsed = self.parse(token)
        if parsed is None or parsed[0] >= len(self.issued):
            return None
        slot, seq = parsed
        index = slot * self.ring + seq % self.ring
        seen = self.ring_seq[index]
        if seen == seq:
            return float(self.ring_died[index])
        if seen > seq:
            return 0.0  # retired so long ago that its entry was reused
        return None


class FreezeTiming:
    """Per process and kind of call: calls, longest, and calls over their bound;
    and each process's slowest calls (kind, duration, start), for diagnosis."""

    KINDS = ("acquire", "acquire-wait", "release")
    COUNTS = ("busy", "unavailable", "lost")
    SLOWEST = 4  # kept per process

    def __init__(self, ctx: Any, processes: int) -> None:
        n = processes * len(self.KINDS)
        self.calls = ctx.RawArray("q", n)
        self.over = ctx.RawArray("q", n)
        self.longest = ctx.RawArray("d", n)
        self.bound = ctx.RawArray("d", n)
        self.counts = ctx.RawArray("q", processes * len(self.COUNTS))
        # (kind index, seconds taken, monotonic start) per kept call.
        self.slow = ctx.RawArray("d", processes * self.SLOWEST * 3)
        self.processes = processes

    def record(self, slot: int, kind: str, took: float, bound: float) -> None:
        k = self.KINDS.index(kind)
        i = slot * len(self.KINDS) + k
        base = slot * self.SLOWEST * 3
        fastest = min(range(self.SLOWEST), key=lambda j: self.slow[base + 3 * j + 1])
        if took > self.slow[base + 3 * fastest + 1]:
            at = base + 3 * fastest
            self.slow[at : at + 3] = [float(k), took, time.monotonic() - took]
        self.calls[i] += 1
        self.bound[i] = bound
        if took > self.longest[i]:
            self.longest[i] = took
        if took > bound:
            self.over[i] += 1

    def count(self, slot: int, what: str) -> None:
        self.counts[slot * len(self.COUNTS) + self.COUNTS.index(what)] += 1

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, kind in enumerate(self.KINDS):
            idx = [p * len(self.KINDS) + k for p in range(self.processes)]
            out[kind] = {
                "calls": sum(self.calls[i] for i in idx),
                "over_bound": sum(self.over[i] for i in idx),
                "longest": max(self.longest[i] for i in idx),
                "bound": max(self.bound[i] for i in idx),
            }
        kept = [tuple(self.slow[j : j + 3]) for j in range(0, len(self.slow), 3)]
        out["slowest"] = [
            {"kind": self.KINDS[int(k)], "took": took, "started": started}
            for k, took, started in sorted(kept, key=lambda c: -c[1])
            if took > 0
        ][:10]
        for c, what in enumerate(self.COUNTS):
            out[what] = sum(self.counts[p * len(self.COUNTS) + c] for p in range(self.processes))
        return out


class FenceTable:
    """A resource guarded by fencing tokens, in a SQLite file any process can open."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=5.0, isolation_level=None)

    def create(self) -> FenceTable:
        # closing(): a sqlite3 connection used as a context manager commits but
        # stays open (Python 3.13 warns about it when it is collected).
        with contextlib.closing(self._connect()) as db:
            db.execute("DROP TABLE IF EXISTS resource")
            db.execute("CREATE TABLE resource (id INTEGER PRIMARY KEY, fence INTEGER, value TEXT)")
            db.execute("INSERT INTO resource VALUES (1, 0, '')")
        return self

    def write(self, fence: int, value: str) -> bool:
        """The fenced write: it applies only if no newer holder wrote first."""
        db = self._connect()
        try:
            cur = db.execute(
                "UPDATE resource SET fence = ?, value = ? WHERE id = 1 AND fence <= ?",
                (fence, value, fence),
            )
            return cur.rowcount == 1
        finally:
            db.close()

    def read(self) -> tuple[int, str]:
        db = self._connect()
        try:
            fence, value = db.execute("SELECT fence, value FROM resource WHERE id = 1").fetchone()
            return int(fence), str(value)
        finally:
            db.close()


# Keys a careless SCAN pattern, prefix match or script would hit: near-misses of
# the library's own layout, glob characters, and a key in another database.
_FOREIGN: dict[bytes, bytes] = {
    b"foreign:plain": b"keep me",
    b"redislockx:L:{0000000000000000}:=a": b"near miss of the prefix",
    b"redislock": b"the prefix alone",
    b"other:L:{0000000000000000}:=job": b"another prefix, same layout",
    b"redislock*": b"glob in the name",
    b"{redislock}:L:x": b"hash tag around the prefix",
}


@dataclass
class KeyspaceAudit:
    """Plant foreign keys before a scenario; ``check()`` lists what went wrong."""

    prefix: bytes = b"redislock"

    def plant(self, client: redis.Redis) -> None:
        pipe = client.pipeline()
        for key, value in _FOREIGN.items():
            pipe.set(key, value)
        pipe.hset(b"foreign:hash", mapping={b"t": b"not a token", b"f": b"7"})
        pipe.rpush(b"foreign:list", b"a", b"b")
        pipe.execute()
        client.execute_command("SELECT", 0)

    def check(self, client: redis.Redis, *, foreign: bool = True) -> list[str]:
        problems: list[str] = []
        mine = self.prefix + b":"
        for key in client.scan_iter(count=1000):
            if key.startswith(mine):
                ttl = client.pttl(key)
                if ttl == -1:
                    problems.append(f"library key without TTL: {key!r}")
            elif foreign and key not in _FOREIGN and key not in (b"foreign:hash", b"foreign:list"):
                problems.append(f"unexpected key outside the prefix: {key!r}")
        if foreign:
            for key, value in _FOREIGN.items():
                if client.get(key) != value or client.pttl(key) != -1:
                    problems.append(f"foreign key touched: {key!r}")
            if client.hgetall(b"foreign:hash") != {b"t": b"not a token", b"f": b"7"}:
                problems.append("foreign key touched: b'foreign:hash'")
            if client.lrange(b"foreign:list", 0, -1) != [b"a", b"b"]:
                problems.append("foreign key touched: b'foreign:list'")
        return problems

    def lock_keys(self, client: redis.Redis) -> list[bytes]:
        return sorted(client.scan_iter(match=self.prefix + b":*", count=1000))
