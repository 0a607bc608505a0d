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
from ..io import calls
from ..topology import is_cluster
from .rows import HeldLock, Holder, Waiter, row_of_holders
from .scan import own_name

__all__ = ["READ_BATCH", "WAITERS_SHOWN", "read_many"]

logger = logging.getLogger("django_redislock.inspect")

INSPECT_LOCK = scripts.load("inspect_lock", prelude="shared")
INSPECT_HOLDERS = scripts.load("inspect_holders", prelude="shared")


def _owner_data(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw.decode("utf-8", "surrogatepass")) if raw else {}
    except (ValueError, UnicodeDecodeError):
        data = {}
    return data if isinstance(data, dict) else {}


def _owner(raw: bytes) -> tuple[str, int | None, str, str, str | None]:
    data = _owner_data(raw)
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


# The inspect script of each kind, and its arguments (the number of waiters
# to list follows).
_SCRIPTS: dict[str, tuple[scripts.Script, tuple[bytes, ...]]] = {
    "lock": (INSPECT_LOCK, ()),
    "semaphore": (INSPECT_HOLDERS, (b"l", b"")),
    "rwlock": (INSPECT_HOLDERS, (b"f", b"m:")),
}

# Waiters listed per name, oldest first, unless asked otherwise; the rest are
# counted. The queue is walked on the server to count its live waiters, but
# only these cross the wire, so a name with 10,000 waiters stays cheap to show.
WAITERS_SHOWN = 10

# Keys read per pipeline on a single server: one round trip for many locks.
READ_BATCH = 200


def _read_replies(
    client: RedisClient, keyspace: KeySpace, kind: str, keys: list[bytes], waiters: int
) -> list[Any]:
    """The inspect script's reply for each key, in order."""
    script, kind_args = _SCRIPTS[kind]
    args = (*kind_args, str(max(0, int(waiters))).encode())
    if is_cluster(client) or len(keys) < 2:
        # A Cluster pipeline would split by node anyway; keep it simple there.
        return [calls.run(client, script, _siblings(keyspace, kind, k), args) for k in keys]
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
            replies[i] = calls.run(client, script, _siblings(keyspace, kind, keys[i]), args)
    return list(replies)


def _waiter(now: int, token: bytes, deadline_text: bytes, owner: bytes) -> Waiter:
    deadline = _int(deadline_text) or now
    host, pid, thread, label, _template = _owner(owner)
    asked = _owner_data(owner).get("w")
    # Each attempt writes its deadline anew as the server's now plus what is
    # left of the call's wait, so the deadline less the whole wait (the
    # owner's "w") is when the call began to wait, on the server's clock.
    waited = (
        _seconds(now - (deadline - asked))
        if isinstance(asked, int) and not isinstance(asked, bool)
        else None
    )
    return Waiter(
        token.decode("latin-1"), host, pid, thread, label, waited, _seconds(deadline - now)
    )


def _lock_waiter(now: int, token: bytes, entry: bytes) -> Waiter:
    """A lock's waiter, from its entry <deadline>|<channel>|<ttl>|<round>|<owner>."""
    parts = entry.split(b"|", 4)
    return _waiter(now, token, parts[0], parts[4] if len(parts) == 5 else b"")


def _holders_waiter(now: int, token: bytes, entry: bytes) -> Waiter:
    """A semaphore's or read-write lock's waiter, from its entry
    <deadline>|<mode and channel>|<owner> (no owner when written by an
    earlier version)."""
    parts = entry.split(b"|", 2)
    return _waiter(now, token, parts[0], parts[2] if len(parts) == 3 else b"")


def _waiters(now: int, listed: Any, parse: Any) -> tuple[Waiter, ...]:
    listed = list(listed or ())
    return tuple(parse(now, listed[i], listed[i + 1]) for i in range(0, len(listed) - 1, 2))


def _renewed_ago(now: int, token: bytes, renewed: bytes) -> float | None:
    """A lease's ``x`` (<token>:<server us>) as seconds ago, when it is this
    token's: a lease handed on in place may keep the previous holder's."""
    mine, _, micros = (renewed or b"").partition(b":")
    us = _int(micros)
    if mine != token or us is None:
        return None
    return _seconds(now - us // 1000)


def _parse_lock(own: str, key: bytes, reply: Any) -> HeldLock | None:
    token, fence, _stored, owner, pttl, waiting, now = reply[:7]
    renewed, listed = (reply[7], reply[8]) if len(reply) > 8 else (b"", [])
    host, pid, thread, label, template = _owner(owner)
    fence_us = _int(fence)
    # A fence is the server's microsecond clock at the grant (a little more
    # only if that clock had fallen behind the previous fence).
    held_for = _seconds(now - fence_us // 1000) if fence_us is not None else 0.0
    lease_left = None if int(pttl) < 0 else _seconds(int(pttl))
    holder = Holder(
        host,
        pid,
        thread,
        label,
        held_for,
        lease_left,
        token.decode("latin-1"),
        template,
        renew=_owner_data(owner).get("r") == 1,
        renewed_ago=_renewed_ago(now, token, renewed),
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
        waiting=_waiters(now, listed, _lock_waiter),
    )


def _timed_holder(
    now: int,
    token: bytes,
    expiry: Any,
    owner: bytes,
    acquired: Any,
    renewed: Any,
    mode: str | None = None,
) -> Holder:
    """One holder of a semaphore or read-write lock: a member of its holders
    set (score: its expiry) with owner and acquisition time in its state."""
    host, pid, thread, label, template = _owner(owner)
    acquired_ms = _int(acquired)
    renewed_ms = _int(renewed)
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
        renew=_owner_data(owner).get("r") == 1,
        renewed_ago=None if renewed_ms is None else _seconds(now - renewed_ms),
    )


def _parse_semaphore(own: str, key: bytes, reply: Any) -> HeldLock | None:
    _stored, limit, waiting, now, listed = reply[:5]
    rest = reply[5:]
    holders = [_timed_holder(now, *rest[i : i + 5]) for i in range(0, len(rest), 5)]
    return row_of_holders(
        own,
        "semaphore",
        key,
        holders,
        waiting,
        fence=None,
        limit=_int(limit),
        read_at=int(now) / 1000,
        listed=_waiters(now, listed, _holders_waiter),
    )


def _parse_rwlock(own: str, key: bytes, reply: Any) -> HeldLock | None:
    _stored, fence, waiting, now, listed = reply[:5]
    rest = reply[5:]
    holders = []
    for i in range(0, len(rest), 6):
        token, expiry, owner, acquired, renewed, mode = rest[i : i + 6]
        holders.append(
            _timed_holder(
                now, token, expiry, owner, acquired, renewed, "write" if mode == b"w" else "read"
            )
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
        listed=_waiters(now, listed, _holders_waiter),
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
    client: RedisClient,
    keyspace: KeySpace,
    kind: str,
    keys: list[bytes],
    *,
    waiters: int = WAITERS_SHOWN,
) -> list[HeldLock | None]:
    """Rows of these keys (None: not held), each with its first ``waiters``
    waiters listed."""
    replies = _read_replies(client, keyspace, kind, keys, waiters)
    return [_parse(keyspace, kind, key, reply) for key, reply in zip(keys, replies, strict=True)]
