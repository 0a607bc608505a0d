# generated from pool_calls_async.py by tools/gen_sync.py; do not edit
"""One batch of commands on one connection of a pool: written once, a reply each.

Written for asyncio; the sync twin is generated from it by ``tools/gen_sync.py``.
See ``calls_base.py`` for the policy. A call cut short by anything but Redis (a
cancelled task; in sync code, a signal's ``KeyboardInterrupt`` or
``SystemExit``) closes its connection, whose reply would otherwise wait for
the next caller, and goes on as itself: it is not Redis failing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import giveback
from .breaker import Breaker, breaker_of
from .calls_base import CallFailed, Command, Pending, packed
from .calls_prims import checkout, disconnect
from .interrupts import CallTimeout

__all__ = ["call_on_pool", "exchange", "guarded"]


def exchange(conn: Any, commands: Sequence[Command]) -> list[Any]:
    """Write ``commands`` on ``conn`` and read one reply each (errors as values)."""
    try:
        conn.send_packed_command(packed(conn, commands), False)
    except Exception as exc:
        disconnect(conn)
        # A part of the batch may have gone out: one command cut short does
        # not run, but the first of several may be complete.
        raise CallFailed(exc, may_have_run=len(commands) > 1) from exc
    except BaseException:
        disconnect(conn)
        raise
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(conn.read_response(disconnect_on_error=False))
        except ResponseError as exc:
            replies.append(exc)
        except (TimeoutError, RedisTimeoutError, CallTimeout) as exc:
            failed = CallFailed(exc, may_have_run=True)
            failed.pending = Pending(conn, len(commands) - len(replies), None)
            raise failed from exc
        except Exception as exc:
            # The connection broke: the batch may have run, and the
            # connection may yet receive its reply.
            disconnect(conn)
            raise CallFailed(exc, may_have_run=True) from exc
        except BaseException:
            # Interrupted while waiting for the reply: the same, but the
            # interrupt goes on as itself. (The caller gives back what the
            # batch may have taken: docs/internals.rst, "Interrupts".)
            disconnect(conn)
            raise
    return replies


def call_on_pool(pool: Any, commands: Sequence[Command]) -> list[Any]:
    """``commands`` on a connection of ``pool``, unless its breaker is open
    (``breaker.py``: then ``CallFailed`` at once, nothing sent)."""
    return guarded(breaker_of(pool), lambda: _on_pool(pool, commands))


def guarded(breaker: Breaker, call: Callable[[], Any]) -> list[Any]:
    """``call()`` through ``breaker``: refused at once while it is open
    (``CallFailed``, nothing sent); how it ends tells the breaker."""
    try:
        probe = breaker.admit()
    except RedisError as exc:
        raise CallFailed(exc, may_have_run=False) from exc
    try:
        replies: list[Any] = call()
    except CallFailed as failed:
        breaker.failed(failed.cause, probe)
        raise
    except BaseException:
        breaker.abandoned(probe)
        raise
    breaker.answered(probe)
    return replies


def _on_pool(pool: Any, commands: Sequence[Command]) -> list[Any]:
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
            return exchange(conn, commands)
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
