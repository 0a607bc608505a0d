"""The library packs its commands as redis-py would, only faster (io/calls_base.py)."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio
from redis.exceptions import DataError

from django_redislock.core.io.calls_base import packed

BATCHES = [
    [("EVALSHA", "a" * 40, 3, b"k:1", b"k:2", b"k:3", "tok", 30000, b"", '{"p":1}')],
    [("EVALSHA", "b" * 40, 1, "ключ", "ünïcode", 1.5, -7), ("WAIT", 1, 100)],
    [("SET", b"x" * 70_000, b"y" * 70_000)],
]


@pytest.mark.parametrize("commands", BATCHES)
def test_the_bytes_are_redis_pys_own(commands: list[tuple[object, ...]]) -> None:
    conn = redis.Connection()
    assert b"".join(packed(conn, commands)) == b"".join(conn.pack_commands(commands))


def test_what_hiredis_does_not_take_is_left_to_redis_py() -> None:
    conn = redis.Connection()
    commands = [("SET", memoryview(b"key"), "value"), ("CONFIG GET", "maxmemory")]
    assert b"".join(packed(conn, commands)) == b"".join(conn.pack_commands(commands))
    with pytest.raises(DataError):
        packed(conn, [("SET", "key", None)])


def test_a_packed_batch_runs(r: redis.Redis) -> None:
    conn = r.connection_pool.make_connection()
    try:
        conn.connect()
        conn.send_packed_command(packed(conn, [("SET", "pk", "ü"), ("GET", "pk")]))
        assert conn.read_response() in (b"OK", "OK", True)
        assert conn.read_response() == "ü".encode()
    finally:
        conn.disconnect()


async def test_a_packed_batch_runs_on_asyncio(ar: redis.asyncio.Redis) -> None:
    # The asyncio connections pack with redis-py's own packer, unchanged.
    conn = ar.connection_pool.make_connection()
    try:
        await conn.connect()
        await conn.send_packed_command(packed(conn, [("SET", "apk", "ü"), ("GET", "apk")]))
        assert await conn.read_response() in (b"OK", "OK", True)
        assert await conn.read_response() == "ü".encode()
    finally:
        await conn.disconnect()
