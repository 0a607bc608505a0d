"""The record of a key in Redis: read, written and forgotten through the bounded transport.

Every call goes through ``core.io.transport`` (directly, or as a script through
``core.engine.scripts``), as every lock call does: bounded by the client's socket
timeout whatever its retry policy, never re-sent after a timeout, routed to
the slot's node on a Cluster. A failure raises ``RedisUnavailable``.

A record is a hash (``core/engine/keys.py``: ``P:I:{T}:<n>``) with the fields:

``fp``       the request's fingerprint (method, path, body)
``state``    ``running`` while the first request runs, ``done`` once stored
``a``        the id of the attempt that wrote it (a forget deletes only its own)
``t``        when that attempt started, ms since the epoch (for ``Retry-After``)
``status``, ``headers``, ``body``, ``omitted``   the stored response
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from ..core import failures
from ..core.clients import AnyRedisClient, AsyncRedisClient, RedisClient
from ..core.engine import scripts
from ..core.engine.keys import IdempotencyKeys
from ..core.exceptions import RedisUnavailable
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


def _replace_args(record: Record, ttl: float) -> tuple[Any, ...]:
    ttl_ms = max(1, math.ceil(ttl * 1000))
    return (ttl_ms, *(part for item in record.items() for part in item))


def write(client: RedisClient, keys: IdempotencyKeys, record: Record, ttl: float) -> None:
    """Replace the record, which expires after ``ttl`` seconds."""
    scripts.run(client, _REPLACE, (keys.record,), _replace_args(record, ttl))


async def write_async(
    client: AsyncRedisClient, keys: IdempotencyKeys, record: Record, ttl: float
) -> None:
    """``write`` for a ``redis.asyncio`` client."""
    await scripts.run_async(client, _REPLACE, (keys.record,), _replace_args(record, ttl))


def forget(client: RedisClient, keys: IdempotencyKeys, attempt: bytes) -> None:
    """Delete the record if ``attempt`` wrote it: the key is free for a retry."""
    try:
        scripts.run(client, _FORGET, (keys.record,), (attempt,))
    except RedisUnavailable as exc:  # the marker says "not completed": harmless
        logger.debug("could not remove the in-progress marker %r: %s", keys.record, exc)


async def forget_async(client: AsyncRedisClient, keys: IdempotencyKeys, attempt: bytes) -> None:
    """``forget`` for a ``redis.asyncio`` client."""
    try:
        await scripts.run_async(client, _FORGET, (keys.record,), (attempt,))
    except RedisUnavailable as exc:
        logger.debug("could not remove the in-progress marker %r: %s", keys.record, exc)
