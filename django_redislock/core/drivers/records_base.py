"""An idempotency key's record in Redis: its fields and replies, for both drivers.

A record is a hash (``engine/keys.py``: ``P:I:{T}:<n>``, in the slot of the
key's lease) with the fields:

``fp``       the request's fingerprint (method, path, body)
``state``    ``running`` from just before the view runs, ``done`` once its response is stored
``a``        the id of the attempt that wrote it (a forget deletes, and a store
             replaces, only its own)
``t``        when that attempt started, ms since the epoch (for ``Retry-After``)
``status``, ``headers``, ``body``, ``omitted``   the stored response

A ``running`` record whose key no request holds (no lease) is an attempt
whose outcome is unknown: its process died, or it could not record how it
ended. It is never taken for a free key. What a record means for a request
is the Django layer's (``idempotency/``); reading, replacing and forgetting it
are the core's (``records_async.py`` and its generated twin ``records.py``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from .. import failures
from ..clients import AnyRedisClient
from ..engine import scripts
from ..engine.keys import IdempotencyKeys
from ..exceptions import RedisUnavailable

__all__ = [
    "FORGET",
    "REPLACE",
    "Record",
    "not_forgotten",
    "read_failed",
    "record_reply",
    "replace_args",
    "request_of",
]

logger = logging.getLogger("django_redislock.idempotency")

Record = dict[bytes, bytes]

# Replaces the record in one step (DEL, HSET, PEXPIRE): a duplicate never
# reads a record half replaced.
REPLACE = scripts.load("record_replace", prelude=None, repeatable=True)
# Deletes the record if field ``a`` is still this attempt's.
FORGET = scripts.load("record_forget", prelude=None, repeatable=True)


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _as_record(reply: Any) -> Record:
    """HGETALL's reply: a flat list under RESP2, a map under RESP3."""
    if isinstance(reply, dict):
        return {_bytes(k): _bytes(v) for k, v in reply.items()}
    items = list(reply or ())
    return {_bytes(items[i]): _bytes(items[i + 1]) for i in range(0, len(items) - 1, 2)}


def request_of(keys: IdempotencyKeys) -> Sequence[tuple[Any, ...]]:
    """The record and its lease's PTTL: one slot (the record has the lease's
    tag), so one round trip, on a Cluster too."""
    return [("HGETALL", keys.record), ("PTTL", keys.lease)]


def record_reply(replies: list[Any]) -> tuple[Record, int] | Exception:
    """``request_of``'s replies as (record, PTTL), or the error one of them is."""
    for reply in replies:
        if isinstance(reply, Exception):
            return reply
    record, pttl = replies
    return _as_record(record), int(pttl)


def read_failed(client: AnyRedisClient, cause: BaseException) -> RedisUnavailable:
    """The ``RedisUnavailable`` of a read that ``cause`` failed."""
    return failures.unavailable("reading an idempotency record", cause, failures.address_of(client))


def replace_args(record: Record, ttl: float, holder: bytes | None) -> tuple[Any, ...]:
    """``record_replace.lua``'s arguments."""
    ttl_ms = max(1, math.ceil(ttl * 1000))
    return (ttl_ms, holder or b"", *(part for item in record.items() for part in item))


def not_forgotten(keys: IdempotencyKeys, exc: RedisUnavailable) -> None:
    # The marker stays: the key answers "outcome unknown" until it expires.
    logger.warning(
        "could not free the idempotency key %s after a failed attempt (%s): a retry with "
        "it is answered 409, outcome unknown, until its record expires",
        keys.name,
        exc,
    )
