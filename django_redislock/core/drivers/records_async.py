"""Read, replace and forget an idempotency key's record.

The record's fields are in ``records_base.py``. Written once, for asyncio;
``tools/gen_sync.py`` makes the sync functions (``records.py``) from it (edit
this source, never the generated file). Every call goes through the bounded
transport, directly or as a script, as every lock call does: bounded by the
client's socket timeout whatever its retry policy, never sent again after a
timeout, routed to the slot's node on a Cluster. A failure raises
``RedisUnavailable``.
"""

from __future__ import annotations

from ..clients import AsyncRedisClient
from ..engine.keys import IdempotencyKeys
from ..exceptions import RedisUnavailable
from ..io import calls_async
from .records_base import (
    FORGET,
    REPLACE,
    Record,
    not_forgotten,
    read_failed,
    record_reply,
    replace_args,
    request_of,
)

__all__ = ["forget_record_async", "read_record_async", "write_record_async"]


async def read_record_async(client: AsyncRedisClient, keys: IdempotencyKeys) -> tuple[Record, int]:
    """The record (empty if none) and the lease's PTTL (negative: no request runs)."""
    try:
        replies = await calls_async.call_async(client, request_of(keys), keys.record)
    except calls_async.CallFailed as failed:
        raise read_failed(client, failed.cause) from failed.cause
    read = record_reply(replies)
    if isinstance(read, Exception):
        raise read_failed(client, read) from read
    return read


async def write_record_async(
    client: AsyncRedisClient,
    keys: IdempotencyKeys,
    record: Record,
    ttl: float,
    holder: bytes | None = None,
) -> bool:
    """Replace the record, which expires after ``ttl`` seconds; with ``holder``,
    only if that attempt wrote it (False: it did not, and nothing was written)."""
    args = replace_args(record, ttl, holder)
    return bool(await calls_async.run_async(client, REPLACE, (keys.record,), args))


async def forget_record_async(
    client: AsyncRedisClient, keys: IdempotencyKeys, attempt: bytes
) -> None:
    """Delete the record if ``attempt`` wrote it: the key is free for a retry.
    A failure is logged, not raised: the record then expires by itself."""
    try:
        await calls_async.run_async(client, FORGET, (keys.record,), (attempt,))
    except RedisUnavailable as exc:
        not_forgotten(keys, exc)
