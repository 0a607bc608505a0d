"""Taking a connection of the caller's own pool, and connecting it once, without retries.

Lock calls stay within the pool's ``max_connections`` with everything else the
client does: at the cap a lock call fails as a plain command does. The pool's
connections may retry a connect (redis-py 8's default policy retries timeouts,
with back-off), so the library does not let ``get_connection`` connect them: it
takes a connection as the pool's checkout does, then connects it itself, once,
with the connection's retry policy set aside and restored (the connection is
the caller's alone meanwhile). The asyncio pools have a public method for the
first step (``get_available_connection``); the sync ones do the same under
their lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import select
import socket
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..process import this_process

try:  # redis-py 8's connection metrics (opt-in), which its own checkouts keep
    from redis.observability import attributes as _metric_names
    from redis.observability import recorder as _metrics
except ImportError:  # pragma: no cover - redis-py before 8
    _metric_names = _metrics = None  # type: ignore[assignment]

__all__ = [
    "checkout",
    "checkout_async",
    "connect_bound",
    "connected",
    "disconnect",
    "disconnect_async",
]

# The warnings of this module are those of the bounded calls it serves.
logger = logging.getLogger("django_redislock.transport")


def _is_timeout_error(error: Any) -> bool:
    if not isinstance(error, type):
        return False
    timeouts = (RedisTimeoutError, TimeoutError, socket.timeout)
    # A class above TimeoutError (RedisError, Exception) catches timeouts too.
    return issubclass(error, timeouts) or any(issubclass(t, error) for t in timeouts)


def _connect_may_linger(kwargs: dict[str, Any]) -> bool:
    """Whether connections made from ``kwargs`` may retry a connect that timed out,
    or retry more than once: their pool cannot be used for a bounded call."""
    if kwargs.get("retry_on_timeout"):
        return True
    extra = list(kwargs.get("retry_on_error") or ())
    retry = kwargs.get("retry")
    if retry is None:
        # redis-py retries once on the listed errors, or not at all.
        return any(_is_timeout_error(e) for e in extra)
    retries = getattr(retry, "_retries", None)
    if retries == 0:
        return False
    if not isinstance(retries, int) or retries < 0 or retries > 1:
        return True
    errors = tuple(getattr(retry, "_supported_errors", (Exception,))) + tuple(extra)
    return any(_is_timeout_error(e) for e in errors)


def connect_bound(kwargs: dict[str, Any]) -> float | None:
    """How long connecting may take: one connect timeout, and one socket
    timeout for the handshake (HELLO, AUTH, CLIENT SETINFO)."""
    timeout = kwargs.get("socket_timeout")
    connect = kwargs.get("socket_connect_timeout") or timeout
    if timeout is None or connect is None:
        return None
    return float(connect) + float(timeout)


# -- sync pools ------------------------------------------------------------------

# Connects once: no back-off, nothing retried (it keeps no state between calls).
_NO_RETRY: Any = None
_wants_command_name: dict[type, bool] = {}
_takers: dict[type, Any] = {}
_warned: set[type] = set()


def _no_retry() -> Any:
    global _NO_RETRY
    if _NO_RETRY is None:
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        _NO_RETRY = Retry(NoBackoff(), 0)
    return _NO_RETRY


def _record_checkout(pool: Any) -> None:
    """Count a connection as taken in redis-py's pool metrics, as its checkout does.

    The pool's ``release`` counts it back: without this, the opt-in
    connection-count metrics of redis-py 8 would drift by one per call.
    """
    enabled = getattr(_metrics, "is_enabled", None)  # absent: record, as before
    if _metrics is None or (enabled is not None and not enabled()):
        # Metrics off (the default): the pool's name and two records cost
        # more than the rest of the checkout.
        return
    name = _metric_names.get_pool_name(pool)
    idle, used = _metric_names.ConnectionState.IDLE, _metric_names.ConnectionState.USED
    _metrics.record_connection_count(pool_name=name, connection_state=idle, counter=-1)
    _metrics.record_connection_count(pool_name=name, connection_state=used, counter=1)


def _checkpid(pool: Any) -> None:
    # The pool's own check (a forked child resets the pool it inherited),
    # skipped while the pool is this process's: it asks the system each time.
    if getattr(pool, "pid", None) != this_process.pid:
        pool._checkpid()


def _take(pool: Any) -> Any:
    """A connection of a ``ConnectionPool``, counted in use, not yet checked.

    The critical section of ``ConnectionPool.get_connection``; the pool's cap
    holds (``make_connection`` raises ``MaxConnectionsError`` past it).
    """
    _checkpid(pool)
    with pool._lock:
        try:
            conn = pool._available_connections.pop()
        except IndexError:
            conn = pool.make_connection()
        pool._in_use_connections.add(conn)
    _record_checkout(pool)
    return conn


def _take_blocking(pool: Any) -> Any:
    """``_take`` for a ``BlockingConnectionPool``: wait for a free slot."""
    import queue

    from redis.exceptions import MaxConnectionsError

    _checkpid(pool)
    timeout = pool.timeout
    # Waiting for a slot and connecting together stay within one connect's bound.
    wait = connect_bound(pool.connection_kwargs)
    if wait is not None and (timeout is None or timeout > wait):
        timeout = wait
    # During a maintenance notification (redis-py 8) the pool takes its lock
    # around this too, while it updates its connections.
    guard = pool._lock if getattr(pool, "_in_maintenance", False) else contextlib.nullcontext()
    with guard:
        try:
            conn = pool.pool.get(block=True, timeout=timeout)
        except queue.Empty:
            raise MaxConnectionsError(f"No connection available within {timeout}s.") from None
        if conn is None:
            try:
                conn = pool.make_connection()
            except BaseException:
                pool.pool.put_nowait(None)  # the slot stays free
                raise
    _record_checkout(pool)
    return conn


def _taker(pool: Any) -> Any:
    """How to take a connection of ``pool`` without connecting it, or None.

    Known for the pools whose checkout is redis-py's own (``ConnectionPool``,
    ``BlockingConnectionPool`` and subclasses that keep it: Sentinel, Cluster
    nodes); decided once per pool class.
    """
    kind = type(pool)
    if kind not in _takers:
        from redis.connection import BlockingConnectionPool, ConnectionPool

        checkout = getattr(kind, "get_connection", None)
        if checkout is BlockingConnectionPool.get_connection:
            _takers[kind] = _take_blocking
        elif checkout is ConnectionPool.get_connection:
            _takers[kind] = _take
        else:
            _takers[kind] = None
    if getattr(pool, "cache", None) is not None:
        # Client-side caching wraps each connection in a proxy whose
        # connect is the inner connection's: use the pool's own checkout.
        return None
    return _takers[kind]


def _connect(conn: Any) -> None:
    """Connect ``conn`` (ours for now) once, with no retry; a no-op if connected."""
    if getattr(conn, "_sock", None) is not None:
        return  # connected: what ``connect`` would find first, without the swap
    saved = conn.retry
    conn.retry = _no_retry()
    try:
        conn.connect()
    finally:
        conn.retry = saved


def disconnect(conn: Any) -> None:
    """Close a connection that failed mid-call (``disconnect_async``'s twin)."""
    conn.disconnect()


def _make_ready(pool: Any, conn: Any) -> None:
    """What ``get_connection`` does after its critical section, connecting once."""
    _connect(conn)
    maintenance = getattr(pool, "maint_notifications_enabled", None)
    # Pushed maintenance notifications (redis-py 8) are data the pool expects
    # on an idle connection; EOF (Redis restarted) still raises.
    expects_data = maintenance is not None and maintenance()
    try:
        if conn.can_read() and not expects_data:
            raise RedisConnectionError("Connection has data")
    except (RedisConnectionError, RedisTimeoutError, OSError):
        # Data or EOF on an idle connection: start afresh.
        conn.disconnect()
        _connect(conn)
        if conn.can_read() and not expects_data:
            raise RedisConnectionError("Connection not ready") from None


def checkout(pool: Any) -> Any:
    """A connected connection of the caller's own pool, within the pool's cap.

    ``get_connection`` would connect with the connections' retry policy; the
    same steps here connect once. See the module docstring.
    """
    take = _taker(pool)
    if take is None:
        if _connect_may_linger(pool.connection_kwargs) and type(pool) not in _warned:
            _warned.add(type(pool))
            logger.warning(
                "cannot take a connection of a %s without its retries: lock calls may "
                "last longer than one socket timeout while connecting",
                type(pool).__name__,
            )
        return pool.get_connection(*_get_connection_args(pool))
    conn = take(pool)
    try:
        _make_ready(pool, conn)
    except BaseException:
        # Failed or interrupted mid-connect: a reply of the handshake may be
        # on its way, and must not greet the next caller. It goes back closed.
        conn.disconnect()
        pool.release(conn)
        raise
    return conn


def _get_connection_args(pool: Any) -> tuple[str, ...]:
    # redis-py before 5.3 requires a command name; later versions warn on one.
    kind = type(pool)
    wants = _wants_command_name.get(kind)
    if wants is None:
        parameter = inspect.signature(kind.get_connection).parameters.get("command_name")
        wants = parameter is not None and parameter.default is inspect.Parameter.empty
        _wants_command_name[kind] = wants
    return ("EVALSHA",) if wants else ()


# -- asyncio ---------------------------------------------------------------------


async def disconnect_async(conn: Any) -> None:
    try:
        await conn.disconnect(nowait=True)
    except Exception:  # closing a broken connection: nothing more to do
        logger.debug("closing a failed connection failed", exc_info=True)


async def connected(conn: Any, bound: float | None) -> None:
    """Connect ``conn`` (ours for now) without its retry policy."""
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    if getattr(conn, "is_connected", False):
        return
    saved = conn.retry
    conn.retry = Retry(NoBackoff(), 0)
    try:
        if bound is None:
            await conn.connect()
        else:
            await asyncio.wait_for(conn.connect(), bound)
    except asyncio.TimeoutError as exc:
        await disconnect_async(conn)
        raise RedisTimeoutError("Timeout connecting to server") from exc
    finally:
        conn.retry = saved


def _socket_readable(conn: Any) -> bool:
    """Whether the socket of an idle asyncio connection has data or EOF waiting.

    ``can_read`` sees only what the event loop already read, and a server
    that closed the connection (restarted, say) is seen only once the loop
    has polled the socket since: until then the first call would be written
    on a dead connection and fail. One poll of the socket, as the sync path
    does it, sees it at once.
    """
    writer = getattr(conn, "_writer", None)
    sock = writer.get_extra_info("socket") if writer is not None else None
    if sock is None:
        return False
    try:
        if not hasattr(select, "poll"):  # Windows
            return bool(select.select([sock.fileno()], [], [], 0)[0])
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True  # a socket that cannot be polled is no good either


async def checkout_async(pool: Any) -> Any:
    from redis.asyncio.connection import BlockingConnectionPool

    bound = connect_bound(pool.connection_kwargs)
    if isinstance(pool, BlockingConnectionPool) or not hasattr(pool, "get_available_connection"):
        # Waiting for a free connection is the pool's business; connecting
        # (with whatever retries) must end within the bound all the same.
        getter = pool.get_connection(*_get_connection_args(pool))
        if bound is None:
            return await getter
        try:
            return await asyncio.wait_for(getter, bound)
        except asyncio.TimeoutError as exc:
            raise RedisTimeoutError("Timeout getting a connection") from exc
    conn = pool.get_available_connection()
    try:
        await fresh(conn, bound)
    except BaseException:
        # As ``checkout``: it goes back closed (cancelled mid-handshake too).
        await disconnect_async(conn)
        await pool.release(conn)
        raise
    return conn


async def fresh(conn: Any, bound: float | None) -> None:
    """Connect ``conn`` (ours for now), afresh if data or EOF waits on it.

    Only a connection that was already open is looked at: one connected just
    now may have bytes of its own handshake waiting (a TLS 1.3 server sends
    its session tickets after it), which the event loop reads in due course.
    """
    if getattr(conn, "is_connected", False):
        # ``can_read`` from redis-py 8 on; 5.x names it ``can_read_destructive``.
        stale = getattr(conn, "can_read", None) or conn.can_read_destructive
        if await stale() or _socket_readable(conn):
            # Data or EOF on an idle connection: it is stale, start afresh.
            await disconnect_async(conn)
    await connected(conn, bound)
