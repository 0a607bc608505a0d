"""The record of a key in Redis: read, written and forgotten through the bounded transport.

Every call goes through ``core.io.transport`` (directly, or as a script through
``core.engine.scripts``), as every lock call does: bounded by the client's socket
timeout whatever its retry policy, never re-sent after a timeout, routed to
the slot's node on a Cluster. A failure raises ``RedisUnavailable``.

A record is a hash (``core/engine/keys.py``: ``P:I:{T}:<n>``) with the fields:

``fp``       the request's fingerprint (method, path, body)
``state``    ``running`` from just before the view runs, ``done`` once its response is stored
``a``        the id of the attempt that wrote it (a forget deletes, and a store
             replaces, only its own)
``t``        when that attempt started, ms since the epoch (for ``Retry-After``)
``status``, ``headers``, ``body``, ``omitted``   the stored response

A ``running`` record whose key no request holds (no lease) is an attempt
whose outcome is unknown: its process died, or it could not record how it
ended (``responses.answer``). It is never taken for a free key.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from ..core import (
    AnyRedisClient,
    AsyncRedisClient,
    IdempotencyKeys,
    RedisClient,
    RedisUnavailable,
    failures,
)
from ..core.engine import scripts
from ..core.io import transport

__all__ = ["Record", "forget", "forget_async", "read", "read_async", "write", "write_async"]

logger = logging.getLogger("django_redislock.idempotency")

Record = dict[bytes, bytes]

# Replaces the record in one step (DEL, HSET, PEXPIRE): a duplicate never
# reads a record half replaced.
_REPLACE = scripts.load("record_replace", prelude=None, repeatable=True)
# Deletes the record if field ``a`` is still this attempt's.
_FORGET = scripts.load("record_forget", prelude=None, repeatable=True)


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _as_record(reply: Any) -> Record:
    """HGETALL's reply: a flat list under RESP2, a map under RESP3."""
    if isinstance(reply, dict):
        return {_bytes(k): _bytes(v) for k, v in reply.items()}
    items = list(reply or ())
    return {_bytes(items[i]): _bytes(items[i + 1]) for i in range(0, len(items) - 1, 2)}


def _failed(client: AnyRedisClient, cause: BaseException) -> RedisUnavailable:
    return failures.unavailable("reading an idempotency record", cause, failures.address_of(client))


def _commands(keys: IdempotencyKeys) -> Sequence[transport.Command]:
    # One slot (the record has the lease's tag), one round trip, on a Cluster too.
    return [("HGETALL", keys.record), ("PTTL", keys.lease)]


def _parsed(client: AnyRedisClient, replies: list[Any]) -> tuple[Record, int]:
    for reply in replies:
        if isinstance(reply, Exception):
            raise _failed(client, reply) from reply
    record, pttl = replies
    return _as_record(record), int(pttl)


def read(client: RedisClient, keys: IdempotencyKeys) -> tuple[Record, int]:
    """The record (empty if none) and the lease's PTTL (negative: no request runs)."""
    try:
        replies = transport.call(client, _commands(keys), keys.record)
    except transport.CallFailed as failed:
        raise _failed(client, failed.cause) from failed.cause
    return _parsed(client, replies)


async def read_async(client: AsyncRedisClient, keys: IdempotencyKeys) -> tuple[Record, int]:
    """``read`` for a ``redis.asyncio`` client."""
    try:
        replies = await transport.call_async(client, _commands(keys), keys.record)
    except transport.CallFailed as failed:
        raise _failed(client, failed.cause) from failed.cause
    return _parsed(client, replies)


def _replace_args(record: Record, ttl: float, holder: bytes | None) -> tuple[Any, ...]:
    ttl_ms = max(1, math.ceil(ttl * 1000))
    return (ttl_ms, holder or b"", *(part for item in record.items() for part in item))


def write(
    client: RedisClient,
    keys: IdempotencyKeys,
    record: Record,
    ttl: float,
    holder: bytes | None = None,
) -> bool:
    """Replace the record, which expires after ``ttl`` seconds; with ``holder``,
    only if that attempt wrote it (False: it did not, and nothing was written)."""
    args = _replace_args(record, ttl, holder)
    return bool(scripts.run(client, _REPLACE, (keys.record,), args))


async def write_async(
    client: AsyncRedisClient,
    keys: IdempotencyKeys,
    record: Record,
    ttl: float,
    holder: bytes | None = None,
) -> bool:
    """``write`` for a ``redis.asyncio`` client."""
    args = _replace_args(record, ttl, holder)
    return bool(await scripts.run_async(client, _REPLACE, (keys.record,), args))


def _not_forgotten(keys: IdempotencyKeys, exc: RedisUnavailable) -> None:
    # The marker stays: the key answers "outcome unknown" until it expires.
    logger.warning(
        "could not free the idempotency key %s after a failed attempt (%s): a retry with "
        "it is answered 409, outcome unknown, until its record expires",
        keys.name,
        exc,
    )


def forget(client: RedisClient, keys: IdempotencyKeys, attempt: bytes) -> None:
    """Delete the record if ``attempt`` wrote it: the key is free for a retry."""
    try:
        scripts.run(client, _FORGET, (keys.record,), (attempt,))
    except RedisUnavailable as exc:
        _not_forgotten(keys, exc)


async def forget_async(client: AsyncRedisClient, keys: IdempotencyKeys, attempt: bytes) -> None:
    """``forget`` for a ``redis.asyncio`` client."""
    try:
        await scripts.run_async(client, _FORGET, (keys.record,), (attempt,))
    except RedisUnavailable as exc:
        _not_forgotten(keys, exc)
