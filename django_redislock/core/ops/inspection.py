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
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from .. import failures
from ..engine import scripts
from ..engine.keys import KeySpace, decode_name
from ..exceptions import RedisUnavailable
from ..topology import is_cluster

__all__ = [
    "BUSIEST",
    "KINDS",
    "HeldLock",
    "Holder",
    "TemplateSummary",
    "find",
    "holder_id",
    "list_locks",
    "matches",
    "scan_keys",
    "summarize",
]

logger = logging.getLogger("django_redislock.inspect")

KINDS = ("lock", "semaphore", "rwlock")
_KIND_CODE = {"lock": b"L", "semaphore": b"S", "rwlock": b"RW"}

INSPECT_LOCK = scripts.load("inspect_lock", prelude="shared")
INSPECT_HOLDERS = scripts.load("inspect_holders", prelude="shared")

# Keys asked for per SCAN call: large enough to walk a big keyspace in few
# round trips, small enough that each call stays short on the server.
SCAN_COUNT = 500

_HEX16 = re.compile(rb"^[0-9a-f]{16}$")


def holder_id(token: str) -> str:
    """What names one acquisition to people and forms, in place of its token.

    A token is per acquisition (a lease, permit or turn taken, or handed on
    to a task's worker), so its digest tells "the holder that was shown" from
    a holder that came since, whatever the kind; the token itself, which
    releases the lease, is never shown. 64 bits, as many as a token has.
    """
    return hashlib.blake2b(token.encode("latin-1"), digest_size=8).hexdigest()


@dataclass(frozen=True)
class Holder:
    """Who holds a lock or one permit of a semaphore."""

    host: str
    pid: int | None
    thread: str
    label: str
    # Seconds since the lease or permit was taken, by the server's clock.
    held_for: float
    # Seconds until it expires unless renewed; None when it has no expiry.
    lease_left: float | None
    token: str = field(repr=False, compare=False, default="")
    # The template it was taken under (``metric_name``); None for an ad-hoc
    # lock, and for an owner written before templates were stored.
    template: str | None = None
    # A read-write lock's holder: "read" or "write"; None for other kinds.
    # (Not in ``as_dict``: a row's ``fence`` is set exactly when a writer holds.)
    mode: str | None = None

    @property
    def ident(self) -> str:
        """``holder_id`` of its token: safe to put in a page or a form."""
        return holder_id(self.token)

    def as_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "pid": self.pid,
            "thread": self.thread,
            "label": self.label,
            "held_for": self.held_for,
            "lease_left": self.lease_left,
        }


@dataclass(frozen=True)
class HeldLock:
    """One held lock, one semaphore with at least one live permit, or one
    read-write lock with a writer or at least one reader.

    For a semaphore, the owner fields and ``held_for`` are those of the
    longest-held permit and ``lease_left`` is the soonest expiry; every permit
    is in ``holders``. A read-write lock reads the same, with its readers (or
    its one writer) as holders; its ``fence`` is the writer's while a writer
    holds it, and None while readers do.
    """

    name: str
    kind: str
    host: str
    pid: int | None
    thread: str
    label: str
    fence: int | None
    held_for: float
    lease_left: float | None
    waiters: int
    holders: tuple[Holder, ...]
    limit: int | None
    key: bytes = field(repr=False, compare=False, default=b"")
    # See Holder.template; a semaphore's is that of its longest-held permit
    # that has one.
    template: str | None = None

    @property
    def token(self) -> str:
        """The lock's current token (locks only); never shown to people."""
        return self.holders[0].token if self.kind == "lock" and self.holders else ""

    def only(self, idents: Iterable[str]) -> HeldLock | None:
        """This row with only the holders whose ``ident`` is in ``idents``
        (None when none is): what an operator was shown of it, still held."""
        wanted = set(idents)
        kept = [h for h in self.holders if h.ident in wanted]
        if len(kept) == len(self.holders):
            return self
        # A lock's one holder and a writer are all or nothing: only a
        # semaphore's permits and a read-write lock's readers get here.
        return _row_of_holders(
            self.name,
            self.kind,
            self.key,
            kept,
            self.waiters,
            fence=self.fence,
            limit=self.limit,
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form; the keys are the same for every kind, always."""
        return {
            "name": self.name,
            "kind": self.kind,
            "host": self.host,
            "pid": self.pid,
            "thread": self.thread,
            "label": self.label,
            "fence": self.fence,
            "held_for": self.held_for,
            "lease_left": self.lease_left,
            "waiters": self.waiters,
            "holders": len(self.holders),
            "limit": self.limit,
            "permits": [h.as_dict() for h in self.holders],
        }


def matches(name: str, pattern: str | None, *, literal: bool = False) -> bool:
    """Whether ``name`` is selected by ``pattern`` (None selects everything)."""
    if pattern is None:
        return True
    if literal:
        return name == pattern
    return fnmatchcase(name, pattern)


# -- scanning -------------------------------------------------------------------
def scan_keys(client: Any, match: bytes) -> Iterator[bytes]:
    """Every key matching ``match``, on every primary of a Cluster.

    A key may be yielded twice (SCAN's guarantee is "at least once" while the
    keyspace changes); callers de-duplicate.
    """
    try:
        if is_cluster(client):
            for node in client.get_primaries():
                cursor = 0
                while True:
                    cursors, keys = client.scan(
                        cursor=cursor, match=match, count=SCAN_COUNT, target_nodes=node
                    )
                    yield from keys
                    cursor = next(iter(cursors.values()), 0) if cursors else 0
                    if not cursor:
                        break
        else:
            cursor = 0
            while True:
                cursor, keys = client.scan(cursor=cursor, match=match, count=SCAN_COUNT)
                yield from keys
                if not cursor:
                    break
    except RedisUnavailable:
        raise
    except Exception as exc:
        raise failures.unavailable("scanning for locks", exc, failures.address_of(client)) from exc


def _name_from_key(keyspace: KeySpace, key: bytes, code: bytes) -> tuple[str, str | None]:
    """(suffix kind, readable name or None) of a key that looks like ours."""
    head = keyspace.prefix.encode() + b":" + code + b":{"
    if not key.startswith(head):
        return "", None
    rest = key[len(head) :]
    tag, sep, suffix = rest.partition(b"}:")
    if not sep or not _HEX16.match(tag) or not suffix:
        return "", None
    if suffix[:1] == b"=":
        return "=", decode_name(suffix[1:])
    return suffix[:1].decode("latin-1"), None


def _key_of(keyspace: KeySpace, kind: str, name: str) -> bytes:
    if kind == "rwlock":
        return keyspace.rwlock(name).lease
    keys = keyspace.lock(name) if kind == "lock" else keyspace.semaphore(name)
    return keys.lease


def _own_name(keyspace: KeySpace, kind: str, key: bytes, stored: bytes) -> str | None:
    """The name whose keys include exactly ``key``, or None (not our key)."""
    candidates: list[str] = []
    if stored:
        candidates.append(decode_name(stored))
    _form, from_key = _name_from_key(keyspace, key, _KIND_CODE[kind])
    if from_key is not None:
        candidates.append(from_key)
    for name in candidates:
        try:
            if _key_of(keyspace, kind, name) == key:
                return name
        except (TypeError, ValueError):
            continue
    return None


def _owner(raw: bytes) -> tuple[str, int | None, str, str, str | None]:
    try:
        data = json.loads(raw.decode("utf-8", "surrogatepass")) if raw else {}
    except (ValueError, UnicodeDecodeError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    pid = data.get("pid")
    template = data.get("t")
    return (
        str(data.get("host", "")),
        pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        str(data.get("thread", "")),
        str(data.get("label", "")),
        template if isinstance(template, str) and template else None,
    )


def _int(raw: Any) -> int | None:
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


def _seconds(ms: int | None) -> float:
    return max(0, ms or 0) / 1000


def _siblings(keyspace: KeySpace, kind: str, key: bytes) -> tuple[bytes, bytes, bytes]:
    """The keys the inspect script of ``kind`` reads, from the lease/holders key.

    They share its ``{tag}:<n>`` suffix, hence its Cluster slot.
    """
    p = keyspace.prefix.encode()
    if kind == "rwlock":
        suffix = key[len(p) + 4 :]
        return key, p + b":RQ:" + suffix, p + b":RH:" + suffix
    suffix = key[len(p) + 3 :]
    if kind == "lock":
        return key, p + b":Q:" + suffix, p + b":H:" + suffix
    return key, p + b":SQ:" + suffix, p + b":SH:" + suffix


# The inspect script of each kind, and its arguments.
_SCRIPTS = {
    "lock": (INSPECT_LOCK, ()),
    "semaphore": (INSPECT_HOLDERS, (b"l", b"")),
    "rwlock": (INSPECT_HOLDERS, (b"f", b"m:")),
}

# Keys read per pipeline on a single server: one round trip for many locks.
READ_BATCH = 200


def _read_replies(client: Any, keyspace: KeySpace, kind: str, keys: list[bytes]) -> list[Any]:
    """The inspect script's reply for each key, in order."""
    script, args = _SCRIPTS[kind]
    if is_cluster(client) or len(keys) < 2:
        # A Cluster pipeline would split by node anyway; keep it simple there.
        return [scripts.run(client, script, _siblings(keyspace, kind, k), args) for k in keys]
    try:
        client.script_load(script.source)
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.evalsha(script.sha, 3, *_siblings(keyspace, kind, key), *args)
        replies = pipe.execute(raise_on_error=False)
    except Exception as exc:
        raise failures.unavailable("reading locks", exc, failures.address_of(client)) from exc
    for i, reply in enumerate(replies):
        if isinstance(reply, Exception):
            # NOSCRIPT after a SCRIPT FLUSH mid-way, or a real error: retry
            # alone, where run() falls back to EVAL or raises RedisUnavailable.
            replies[i] = scripts.run(client, script, _siblings(keyspace, kind, keys[i]), args)
    return list(replies)


def _parse_lock(keyspace: KeySpace, key: bytes, reply: Any) -> HeldLock | None:
    if not reply:
        return None
    token, fence, stored, owner, pttl, waiting, now = reply
    own = _own_name(keyspace, "lock", key, stored)
    if own is None:
        logger.debug("skipping %r: not a key of this library", key)
        return None
    host, pid, thread, label, template = _owner(owner)
    fence_us = _int(fence)
    # A fence is the server's microsecond clock at the grant (a little more
    # only if that clock had fallen behind the previous fence).
    held_for = _seconds(now - fence_us // 1000) if fence_us is not None else 0.0
    lease_left = None if int(pttl) < 0 else _seconds(int(pttl))
    holder = Holder(
        host, pid, thread, label, held_for, lease_left, token.decode("latin-1"), template
    )
    return HeldLock(
        name=own,
        kind="lock",
        host=host,
        pid=pid,
        thread=thread,
        label=label,
        fence=fence_us,
        held_for=held_for,
        lease_left=lease_left,
        waiters=int(waiting),
        holders=(holder,),
        limit=1,
        key=key,
        template=template,
    )


def _timed_holder(
    now: int, token: bytes, expiry: Any, owner: bytes, acquired: Any, mode: str | None = None
) -> Holder:
    """One holder of a semaphore or read-write lock: a member of its holders
    set (score: its expiry) with owner and acquisition time in its state."""
    host, pid, thread, label, template = _owner(owner)
    acquired_ms = _int(acquired)
    expiry_ms = _int(float(expiry))
    return Holder(
        host,
        pid,
        thread,
        label,
        _seconds(now - acquired_ms) if acquired_ms is not None else 0.0,
        None if expiry_ms is None else _seconds(expiry_ms - now),
        token.decode("latin-1"),
        template,
        mode,
    )


def _row_of_holders(
    own: str,
    kind: str,
    key: bytes,
    holders: list[Holder],
    waiting: Any,
    *,
    fence: int | None,
    limit: int | None,
) -> HeldLock | None:
    if not holders:
        return None
    # The longest-held speaks for the row: the likeliest to be stuck.
    holders.sort(key=lambda h: -h.held_for)
    first = holders[0]
    lefts = [h.lease_left for h in holders if h.lease_left is not None]
    return HeldLock(
        name=own,
        kind=kind,
        host=first.host,
        pid=first.pid,
        thread=first.thread,
        label=first.label,
        fence=fence,
        held_for=first.held_for,
        lease_left=min(lefts) if lefts else None,
        waiters=int(waiting),
        holders=tuple(holders),
        limit=limit,
        key=key,
        # Holders from before templates were stored have none: the first that has one.
        template=next((h.template for h in holders if h.template is not None), None),
    )


def _parse_semaphore(keyspace: KeySpace, key: bytes, reply: Any) -> HeldLock | None:
    if not reply:
        return None
    stored, limit, waiting, now = reply[:4]
    own = _own_name(keyspace, "semaphore", key, stored)
    if own is None:
        logger.debug("skipping %r: not a key of this library", key)
        return None
    rest = reply[4:]
    holders = [_timed_holder(now, *rest[i : i + 4]) for i in range(0, len(rest), 4)]
    return _row_of_holders(own, "semaphore", key, holders, waiting, fence=None, limit=_int(limit))


def _parse_rwlock(keyspace: KeySpace, key: bytes, reply: Any) -> HeldLock | None:
    if not reply:
        return None
    stored, fence, waiting, now = reply[:4]
    own = _own_name(keyspace, "rwlock", key, stored)
    if own is None:
        logger.debug("skipping %r: not a key of this library", key)
        return None
    rest = reply[4:]
    holders = []
    for i in range(0, len(rest), 5):
        token, expiry, owner, acquired, mode = rest[i : i + 5]
        holders.append(
            _timed_holder(now, token, expiry, owner, acquired, "write" if mode == b"w" else "read")
        )
    writing = any(h.mode == "write" for h in holders)
    return _row_of_holders(
        own, "rwlock", key, holders, waiting, fence=_int(fence) if writing else None, limit=None
    )


_PARSERS = {"lock": _parse_lock, "semaphore": _parse_semaphore, "rwlock": _parse_rwlock}


def _read_many(
    client: Any, keyspace: KeySpace, kind: str, keys: list[bytes]
) -> list[HeldLock | None]:
    parse = _PARSERS[kind]
    replies = _read_replies(client, keyspace, kind, keys)
    return [parse(keyspace, key, reply) for key, reply in zip(keys, replies, strict=True)]


def _check_kinds(kinds: Iterable[str]) -> tuple[str, ...]:
    chosen = tuple(kinds)
    unknown = [k for k in chosen if k not in KINDS]
    if unknown or not chosen:
        raise ValueError(f"kinds must be among {KINDS!r}; got {chosen!r}")
    return chosen


def list_locks(
    client: Any,
    keyspace: KeySpace,
    pattern: str | None = None,
    literal: bool = False,
    *,
    kinds: Iterable[str] = KINDS,
) -> list[HeldLock]:
    """Every held lock, semaphore with live permits and held read-write lock, by name.

    ``pattern`` filters the readable names (a glob, or an exact name with
    ``literal=True``). Raises ``RedisUnavailable`` when Redis cannot be read.
    """
    rows: list[HeldLock] = []

    def read(kind: str, batch: list[bytes]) -> None:
        for row in _read_many(client, keyspace, kind, batch):
            if row is not None and matches(row.name, pattern, literal=literal):
                rows.append(row)

    for kind in _check_kinds(kinds):
        seen: set[bytes] = set()
        batch: list[bytes] = []
        for key in scan_keys(client, keyspace.scan_pattern(_KIND_CODE[kind])):
            if key in seen:
                continue
            seen.add(key)
            form, from_key = _name_from_key(keyspace, key, _KIND_CODE[kind])
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
    rows.sort(key=lambda row: (row.name, row.kind))
    return rows


def find(
    client: Any, keyspace: KeySpace, names: Iterable[str], *, kinds: Iterable[str] = KINDS
) -> tuple[list[HeldLock], list[str]]:
    """Rows for exactly these names (no SCAN), and the names held as no kind."""
    chosen = _check_kinds(kinds)
    rows: list[HeldLock] = []
    missing: list[str] = []
    for name in dict.fromkeys(names):
        found = False
        for kind in chosen:
            (row,) = _read_many(client, keyspace, kind, [_key_of(keyspace, kind, name)])
            # The key is computed from the name; the stored name must agree.
            if row is not None and row.name == name:
                rows.append(row)
                found = True
        if not found:
            missing.append(name)
    return rows, missing


# -- per-template summary ---------------------------------------------------------
# Names shown per template: the ones an operator looks at first.
BUSIEST = 3


@dataclass(frozen=True)
class TemplateSummary:
    """The held locks (or semaphores) of one template, of one kind, together.

    ``template`` is None for ad-hoc locks (no ``metric_name``) and for owners
    written before templates were stored.
    """

    template: str | None
    kind: str
    # Names held, and leases or permits held under them (equal for locks).
    held: int
    holders: int
    # Seconds the longest-held lease or permit among them has been held.
    longest_held: float
    # Callers queued behind them, in total.
    waiters: int
    # The busiest names: most waiters first, then the longest held.
    busiest: tuple[HeldLock, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "template": self.template,
            "kind": self.kind,
            "held": self.held,
            "holders": self.holders,
            "longest_held": self.longest_held,
            "waiters": self.waiters,
            "busiest": [
                {"name": row.name, "waiters": row.waiters, "held_for": row.held_for}
                for row in self.busiest
            ],
        }


def _busier(row: HeldLock) -> tuple[int, float, str]:
    return (-row.waiters, -row.held_for, row.name)


def summarize(rows: Iterable[HeldLock], *, busiest: int = BUSIEST) -> list[TemplateSummary]:
    """One summary per (template, kind) of ``rows``, the most contended first.

    Reads nothing from Redis: the waiters and ages are those ``list_locks``
    read, in the same pipelined scripts as the rows. Ordered by waiters, then
    by names held, then by template (ad-hoc last among equals).
    """
    if isinstance(busiest, bool) or not isinstance(busiest, int) or busiest < 0:
        raise ValueError(f"busiest must be a whole number, 0 or more; got {busiest!r}")
    groups: dict[tuple[str | None, str], list[HeldLock]] = {}
    for row in rows:
        groups.setdefault((row.template, row.kind), []).append(row)
    out = [
        TemplateSummary(
            template=template,
            kind=kind,
            held=len(members),
            holders=sum(len(row.holders) for row in members),
            longest_held=max(row.held_for for row in members),
            waiters=sum(row.waiters for row in members),
            busiest=tuple(sorted(members, key=_busier)[:busiest]),
        )
        for (template, kind), members in groups.items()
    ]
    # By counts only: an order that shifts with the clock between two
    # refreshes of a page would make a quiet page look busy.
    out.sort(key=lambda s: (-s.waiters, -s.held, s.template is None, s.template or "", s.kind))
    return out
