"""One batch of commands on one connection of a pool: written once, a reply each.

* the batch is sent again once only when the connection failed before any of
  it was written (connecting, or a pooled connection found dead);
* after a timeout nothing is sent again, and the connection is not closed:
  the batch is still in Redis's buffer and may run when Redis resumes. The
  connection goes to ``giveback``, which reads the late replies and frees the
  connection; a give-back asked for that call goes on after them, so it runs
  after the late script, not before it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import giveback
from .checkout import checkout, checkout_async, connect_bound, disconnect_async, fresh
from .giveback import Pending

__all__ = ["CallFailed", "Command", "call_on_node_async", "call_on_pool", "call_on_pool_async"]

Command = tuple[Any, ...]


class CallFailed(Exception):
    """A batch did not complete. ``may_have_run``: some of it may have run.

    ``pending`` is set when the batch was written but its replies are late: the
    connection now belongs to ``giveback``, which reads them.
    """

    def __init__(self, cause: BaseException, *, may_have_run: bool) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.may_have_run = may_have_run
        self.pending: Pending | None = None


def _exchange(conn: Any, commands: Sequence[Command]) -> list[Any]:
    """Write ``commands`` on ``conn`` and read one reply each (errors as values)."""
    try:
        conn.send_packed_command(conn.pack_commands(commands), check_health=False)
    except BaseException as exc:
        conn.disconnect()
        # A part of the batch may have gone out: one command cut short does
        # not run, but the first of several may be complete.
        raise CallFailed(exc, may_have_run=len(commands) > 1) from exc
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(conn.read_response(disconnect_on_error=False))
        except ResponseError as exc:
            replies.append(exc)
        except (TimeoutError, RedisTimeoutError) as exc:
            failed = CallFailed(exc, may_have_run=True)
            failed.pending = Pending(conn, len(commands) - len(replies), None, False)
            raise failed from exc
        except BaseException as exc:
            conn.disconnect()
            raise CallFailed(exc, may_have_run=True) from exc
    return replies


def call_on_pool(pool: Any, commands: Sequence[Command]) -> list[Any]:
    from redis.exceptions import MaxConnectionsError

    for attempt in (1, 2):
        try:
            conn = checkout(pool)
        except MaxConnectionsError as exc:
            # The pool is at its cap: a plain command fails the same way.
            raise CallFailed(exc, may_have_run=False) from exc
        except RedisConnectionError as exc:
            # Nothing was written: one more try covers a pooled connection
            # that died with a restarted Redis.
            if attempt == 2:
                raise CallFailed(exc, may_have_run=False) from exc
            continue
        except RedisError as exc:
            raise CallFailed(exc, may_have_run=False) from exc
        try:
            return _exchange(conn, commands)
        except CallFailed as failed:
            if failed.pending is not None:
                failed.pending.release = lambda c=conn: pool.release(c)
                giveback.drain(failed.pending)
                conn = None
            raise
        finally:
            if conn is not None:
                pool.release(conn)
    raise AssertionError("unreachable")  # pragma: no cover


# -- asyncio ---------------------------------------------------------------------


async def _exchange_async(conn: Any, commands: Sequence[Command]) -> list[Any]:
    try:
        await conn.send_packed_command(conn.pack_commands(commands), False)
    except BaseException as exc:
        await disconnect_async(conn)
        raise CallFailed(exc, may_have_run=len(commands) > 1) from exc
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(await conn.read_response(disconnect_on_error=False))
        except ResponseError as exc:
            replies.append(exc)
        except (RedisTimeoutError, asyncio.TimeoutError) as exc:
            failed = CallFailed(exc, may_have_run=True)
            failed.pending = Pending(conn, len(commands) - len(replies), None, True)
            raise failed from exc
        except BaseException as exc:
            # Cancelled mid-read, or the connection broke: the batch may
            # have run and the connection holds an unread reply.
            await disconnect_async(conn)
            raise CallFailed(exc, may_have_run=True) from exc
    return replies


async def call_on_pool_async(pool: Any, commands: Sequence[Command]) -> list[Any]:
    from redis.exceptions import MaxConnectionsError

    for attempt in (1, 2):
        try:
            conn = await checkout_async(pool)
        except MaxConnectionsError as exc:
            raise CallFailed(exc, may_have_run=False) from exc
        except RedisConnectionError as exc:
            if attempt == 2:
                raise CallFailed(exc, may_have_run=False) from exc
            continue
        except RedisError as exc:
            raise CallFailed(exc, may_have_run=False) from exc
        try:
            return await _exchange_async(conn, commands)
        except CallFailed as failed:
            if failed.pending is not None:
                failed.pending.release = lambda c=conn: pool.release(c)
                giveback.drain(failed.pending)
                conn = None
            raise
        finally:
            if conn is not None:
                await pool.release(conn)
    raise AssertionError("unreachable")  # pragma: no cover


def _node_release(node: Any, conn: Any) -> Any:
    if hasattr(node, "release"):
        node.release(conn)
    else:  # redis-py 5.0
        node._free.append(conn)


async def call_on_node_async(node: Any, commands: Sequence[Command]) -> list[Any]:
    from redis.exceptions import MaxConnectionsError

    try:
        conn = node.acquire_connection()
    except MaxConnectionsError as exc:
        raise CallFailed(exc, may_have_run=False) from exc
    try:
        try:
            await fresh(conn, connect_bound(node.connection_kwargs))
        except RedisError as exc:
            raise CallFailed(exc, may_have_run=False) from exc
        return await _exchange_async(conn, commands)
    except CallFailed as failed:
        if failed.pending is not None:
            failed.pending.release = lambda: _node_release(node, conn)
            giveback.drain(failed.pending)
            conn = None
        raise
    finally:
        if conn is not None:
            _node_release(node, conn)
