"""List held locks, semaphores and read-write locks, for operators (``force.py`` releases them).

Keys are found by SCAN (never KEYS, which blocks Redis), on every primary of a
Redis Cluster, matching only this library's prefix and key kind. Each key found
is read by a small read-only script (one consistent snapshot per lock, with the
server's clock) and kept only if the name stored in it maps back to exactly that
key: a key that merely looks like ours is never reported, let alone deleted.

Names are filtered in Python on the stored readable name, not on the key (long
names appear in keys as a digest). Patterns are shell globs (``fnmatch``:
``*``, ``?``, ``[abc]``, ``[!abc]``; ``[*]`` matches a literal star), or plain
strings compared exactly with ``literal=True``.

``summarize`` groups the rows by template (the decorator's key template, a
throttling rule's name: what the lock handle had as ``metric_name``, stored
with each lease and permit), never by the name alone, which may carry an id
per call.

The steps have modules of their own: ``scan`` finds the keys, ``reading``
reads them into rows (``rows``), ``summary`` groups rows per template.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..clients import RedisClient
from ..engine.keys import KeySpace
from .reading import READ_BATCH, WAITERS_SHOWN, read_many
from .rows import HeldLock, Holder, Waiter, holder_id, matches, natural_key
from .scan import KIND_CODE, KINDS, key_of, name_from_key, scan_keys
from .summary import BUSIEST, TemplateSummary, summarize

__all__ = [
    "BUSIEST",
    "KINDS",
    "HeldLock",
    "Holder",
    "WAITERS_SHOWN",
    "TemplateSummary",
    "Waiter",
    "find",
    "holder_id",
    "list_locks",
    "matches",
    "natural_key",
    "scan_keys",
    "summarize",
]


def _check_kinds(kinds: Iterable[str]) -> tuple[str, ...]:
    chosen = tuple(kinds)
    unknown = [k for k in chosen if k not in KINDS]
    if unknown or not chosen:
        raise ValueError(f"kinds must be among {KINDS!r}; got {chosen!r}")
    return chosen


def list_locks(
    client: RedisClient,
    keyspace: KeySpace,
    pattern: str | None = None,
    literal: bool = False,
    *,
    kinds: Iterable[str] = KINDS,
    waiters: int = WAITERS_SHOWN,
) -> list[HeldLock]:
    """Every held lock, semaphore with live permits and held read-write lock, by name.

    ``pattern`` filters the readable names (a glob, or an exact name with
    ``literal=True``); each row lists its first ``waiters`` waiters, oldest
    first, and counts them all. Raises ``RedisUnavailable`` when Redis
    cannot be read.
    """
    rows: list[HeldLock] = []

    def read(kind: str, batch: list[bytes]) -> None:
        for row in read_many(client, keyspace, kind, batch, waiters=waiters):
            if row is not None and matches(row.name, pattern, literal=literal):
                rows.append(row)

    for kind in _check_kinds(kinds):
        seen: set[bytes] = set()
        batch: list[bytes] = []
        for key in scan_keys(client, keyspace.scan_pattern(KIND_CODE[kind])):
            if key in seen:
                continue
            seen.add(key)
            form, from_key = name_from_key(keyspace, key, KIND_CODE[kind])
            if form == "":
                continue
            # Short names are in the key: skip non-matching ones unread.
            if from_key is not None and not matches(from_key, pattern, literal=literal):
                continue
            batch.append(key)
            if len(batch) >= READ_BATCH:
                read(kind, batch)
                batch = []
        if batch:
            read(kind, batch)
    # Names carry ids: ``cart:2`` before ``cart:10``, as a person counts.
    rows.sort(key=lambda row: (natural_key(row.name), row.kind))
    return rows


def find(
    client: RedisClient,
    keyspace: KeySpace,
    names: Iterable[str],
    *,
    kinds: Iterable[str] = KINDS,
    waiters: int = WAITERS_SHOWN,
) -> tuple[list[HeldLock], list[str]]:
    """Rows for exactly these names (no SCAN), and the names held as no kind."""
    chosen = _check_kinds(kinds)
    rows: list[HeldLock] = []
    missing: list[str] = []
    for name in dict.fromkeys(names):
        found = False
        for kind in chosen:
            (row,) = read_many(
                client, keyspace, kind, [key_of(keyspace, kind, name)], waiters=waiters
            )
            # The key is computed from the name; the stored name must agree.
            if row is not None and row.name == name:
                rows.append(row)
                found = True
        if not found:
            missing.append(name)
    return rows, missing
