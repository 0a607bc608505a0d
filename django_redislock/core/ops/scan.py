"""Finding this library's keys: SCAN on every primary, and the name each key belongs to.

Keys are found by SCAN (never KEYS, which blocks Redis), on every primary of a
Redis Cluster, matching only this library's prefix and key kind. A key is
ours only if a name maps back to exactly that key: a key that merely looks
like ours is never reported, let alone deleted.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from .. import failures
from ..clients import RedisClient
from ..engine.keys import KeySpace, decode_name
from ..exceptions import RedisUnavailable
from ..topology import is_cluster

__all__ = ["KINDS", "KIND_CODE", "key_of", "name_from_key", "own_name", "scan_keys"]

KINDS = ("lock", "semaphore", "rwlock")
KIND_CODE = {"lock": b"L", "semaphore": b"S", "rwlock": b"RW"}

# Keys asked for per SCAN call: large enough to walk a big keyspace in few
# round trips, small enough that each call stays short on the server.
SCAN_COUNT = 500

_HEX16 = re.compile(rb"^[0-9a-f]{16}$")


def scan_keys(client: RedisClient, match: bytes) -> Iterator[bytes]:
    """Every key matching ``match``, on every primary of a Cluster.

    A key may be yielded twice (SCAN's guarantee is "at least once" while the
    keyspace changes); callers de-duplicate.
    """
    try:
        if is_cluster(client):
            # A RedisCluster: its SCAN returns a cursor per node (redis-py
            # annotates the single server's reply).
            cluster: Any = client
            for node in cluster.get_primaries():
                cursor = 0
                while True:
                    cursors, keys = cluster.scan(
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


def name_from_key(keyspace: KeySpace, key: bytes, code: bytes) -> tuple[str, str | None]:
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


def key_of(keyspace: KeySpace, kind: str, name: str) -> bytes:
    if kind == "rwlock":
        return keyspace.rwlock(name).lease
    keys = keyspace.lock(name) if kind == "lock" else keyspace.semaphore(name)
    return keys.lease


def own_name(keyspace: KeySpace, kind: str, key: bytes, stored: bytes) -> str | None:
    """The name whose keys include exactly ``key``, or None (not our key)."""
    candidates: list[str] = []
    if stored:
        candidates.append(decode_name(stored))
    _form, from_key = name_from_key(keyspace, key, KIND_CODE[kind])
    if from_key is not None:
        candidates.append(from_key)
    for name in candidates:
        try:
            if key_of(keyspace, kind, name) == key:
                return name
        except (TypeError, ValueError):
            continue
    return None
