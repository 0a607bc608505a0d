"""Reading held locks: one small read-only script per key, and its reply as a row.

Each key found is read by a small read-only script (one consistent snapshot
per lock, with the server's clock), pipelined on a single server, and kept
only if the name stored in it maps back to exactly that key.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from .. import failures
from ..clients import RedisClient
from ..engine import scripts
from ..engine.keys import KeySpace
from ..topology import is_cluster
from .rows import HeldLock, Holder, row_of_holders
from .scan import own_name

__all__ = ["READ_BATCH", "read_many"]

logger = logging.getLogger("django_redislock.inspect")

INSPECT_LOCK = scripts.load("inspect_lock", prelude="shared")
INSPECT_HOLDERS = scripts.load("inspect_holders", prelude="shared")


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


def _read_replies(
    client: RedisClient, keyspace: KeySpace, kind: str, keys: list[bytes]
) -> list[Any]:
    """The inspect script's reply for each key, in order."""
    script, args = _SCRIPTS[kind]
    if is_cluster(client) or len(keys) < 2:
        # A Cluster pipeline would split by node anyway; keep it simple there.
        return [scripts.run(client, script, _siblings(keyspace, kind, k), args) for k in keys]
    try:
        # Annotated ``str`` by redis-py, which sends bytes as they are.
        client.script_load(script.source)  # type: ignore[arg-type]
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


def _parse_lock(own: str, key: bytes, reply: Any) -> HeldLock | None:
    token, fence, _stored, owner, pttl, waiting, now = reply
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
        read_at=int(now) / 1000,
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


def _parse_semaphore(own: str, key: bytes, reply: Any) -> HeldLock | None:
    _stored, limit, waiting, now = reply[:4]
    rest = reply[4:]
    holders = [_timed_holder(now, *rest[i : i + 4]) for i in range(0, len(rest), 4)]
    return row_of_holders(
        own,
        "semaphore",
        key,
        holders,
        waiting,
        fence=None,
        limit=_int(limit),
        read_at=int(now) / 1000,
    )


def _parse_rwlock(own: str, key: bytes, reply: Any) -> HeldLock | None:
    _stored, fence, waiting, now = reply[:4]
    rest = reply[4:]
    holders = []
    for i in range(0, len(rest), 5):
        token, expiry, owner, acquired, mode = rest[i : i + 5]
        holders.append(
            _timed_holder(now, token, expiry, owner, acquired, "write" if mode == b"w" else "read")
        )
    writing = any(h.mode == "write" for h in holders)
    return row_of_holders(
        own,
        "rwlock",
        key,
        holders,
        waiting,
        fence=_int(fence) if writing else None,
        limit=None,
        read_at=int(now) / 1000,
    )


_PARSERS = {"lock": _parse_lock, "semaphore": _parse_semaphore, "rwlock": _parse_rwlock}
# Where in each kind's reply the name stored with it is.
_STORED_AT = {"lock": 2, "semaphore": 0, "rwlock": 0}


def _parse(keyspace: KeySpace, kind: str, key: bytes, reply: Any) -> HeldLock | None:
    """The row of ``key`` from its inspect script's reply, or None (not held,
    or not a key of this library)."""
    if not reply:
        return None
    own = own_name(keyspace, kind, key, reply[_STORED_AT[kind]])
    if own is None:
        logger.debug("skipping %r: not a key of this library", key)
        return None
    return _PARSERS[kind](own, key, reply)


def read_many(
    client: RedisClient, keyspace: KeySpace, kind: str, keys: list[bytes]
) -> list[HeldLock | None]:
    replies = _read_replies(client, keyspace, kind, keys)
    return [_parse(keyspace, kind, key, reply) for key, reply in zip(keys, replies, strict=True)]
