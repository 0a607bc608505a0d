"""How the library's scripts reach Redis: one connection, bounded, never re-sent blindly.

``execute_command`` would apply the client's retry policy, and redis-py 8's
default one (ten retries, timeouts included, with back-off) turns a frozen
Redis into a call that lasts many socket timeouts and sends the same script
again after a timeout, when the first one may still run. So a batch of
commands (a script, or a script and the ``WAIT`` that must follow it on the
same connection) is written here on a connection taken from the client's pool,
with the library's own policy:

* the batch is sent again once only when the connection failed before any of
  it was written (connecting, or a pooled connection found dead);
* after a timeout nothing is sent again, and the connection is not closed:
  the batch is still in Redis's buffer and may run when Redis resumes. The
  connection goes to ``giveback``, which reads the late replies and frees the
  connection; a give-back asked for that call goes on after them, so it runs
  after the late script, not before it.

The connection is one of the caller's own pool, so lock calls stay within the
pool's ``max_connections`` with everything else the client does: at the cap a
lock call fails as a plain command does. Its connections may retry a connect
(redis-py 8's default policy retries timeouts, with back-off), so the library
does not let ``get_connection`` connect them: it takes a connection as the
pool's checkout does, then connects it itself, once, with the connection's
retry policy set aside and restored (the connection is the caller's alone
meanwhile). The asyncio pools have a public method for the first step
(``get_available_connection``); the sync ones do the same under their lock.
On a Cluster the batch goes to the node that owns the key's slot, following
MOVED and ASK; the script has not run where Redis answered with a
redirection, so following it is safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import socket
import weakref
from collections.abc import Sequence
from typing import Any

from redis.exceptions import AskError, MovedError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

try:  # redis-py 8's connection metrics (opt-in), which its own checkouts keep
    from redis.observability import attributes as _metric_names
    from redis.observability import recorder as _metrics
except ImportError:  # pragma: no cover - redis-py before 8
    _metric_names = _metrics = None  # type: ignore[assignment]

from ..topology import is_cluster
from . import giveback
from .giveback import Pending

__all__ = ["CallFailed", "Pending", "call", "call_async"]

logger = logging.getLogger("django_redislock.transport")

Command = tuple[Any, ...]

# A redirection is followed this many times at most: a slot moving while we
# follow it is rare, a loop between two confused nodes must not hang a call.
_MAX_REDIRECTS = 5


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


def _connect_bound(kwargs: dict[str, Any]) -> float | None:
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
    if _metrics is None:
        return
    name = _metric_names.get_pool_name(pool)
    idle, used = _metric_names.ConnectionState.IDLE, _metric_names.ConnectionState.USED
    _metrics.record_connection_count(pool_name=name, connection_state=idle, counter=-1)
    _metrics.record_connection_count(pool_name=name, connection_state=used, counter=1)


def _take(pool: Any, wait: float | None) -> Any:
    """A connection of a ``ConnectionPool``, counted in use, not yet checked.

    The critical section of ``ConnectionPool.get_connection``; the pool's cap
    holds (``make_connection`` raises ``MaxConnectionsError`` past it).
    """
    pool._checkpid()
    with pool._lock:
        try:
            conn = pool._available_connections.pop()
        except IndexError:
            conn = pool.make_connection()
        pool._in_use_connections.add(conn)
    _record_checkout(pool)
    return conn


def _take_blocking(pool: Any, wait: float | None) -> Any:
    """``_take`` for a ``BlockingConnectionPool``: wait for a free slot."""
    import queue

    from redis.exceptions import MaxConnectionsError

    pool._checkpid()
    timeout = pool.timeout
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
    saved = conn.retry
    conn.retry = _no_retry()
    try:
        conn.connect()
    finally:
        conn.retry = saved


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


def _checkout(pool: Any) -> Any:
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
    conn = take(pool, _connect_bound(pool.connection_kwargs))
    try:
        _make_ready(pool, conn)
    except BaseException:
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


def _call_on_pool(pool: Any, commands: Sequence[Command]) -> list[Any]:
    from redis.exceptions import MaxConnectionsError

    for attempt in (1, 2):
        try:
            conn = _checkout(pool)
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


# -- Cluster ---------------------------------------------------------------------

_refresh: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _node_may_be_gone(failed: CallFailed) -> bool:
    from redis.exceptions import MaxConnectionsError

    # A pool at its cap says nothing of the node: it must not cost the
    # next call a refresh of the slot map (which replaces node clients).
    return isinstance(failed.cause, (RedisConnectionError, RedisTimeoutError)) and not (
        isinstance(failed.cause, MaxConnectionsError)
    )


def _redirect_target(client: Any, error: AskError) -> Any:
    """The node a MOVED/ASK names, with the client's slot map told of a MOVED."""
    manager = client.nodes_manager
    if isinstance(error, MovedError):
        for method in ("move_slot", "update_moved_exception"):
            if hasattr(manager, method):
                outcome = getattr(manager, method)(error)
                break
        else:
            manager._moved_exception = error
            outcome = None
        if inspect.isawaitable(outcome):
            return outcome  # the asyncio manager: the caller awaits it first
        if getattr(manager, "_moved_exception", None) is error:
            # redis-py 5.0 only notes the move and applies it at the next
            # get_node_from_slot (get_node_from_key does not look): apply it.
            manager.get_node_from_slot(error.slot_id)
    return None


def _node_at(client: Any, error: AskError) -> Any:
    node = client.get_node(host=error.host, port=error.port)
    if node is None and isinstance(error, MovedError):
        node = client.nodes_manager.get_node_from_slot(error.slot_id)
    if node is None:
        raise CallFailed(error, may_have_run=False)
    return node


def _cluster_call(client: Any, commands: Sequence[Command], key: bytes) -> list[Any]:
    if _refresh.pop(client, False):
        try:
            client.nodes_manager.initialize()
        except RedisError as exc:
            _refresh[client] = True
            raise CallFailed(exc, may_have_run=False) from exc
    node = client.get_node_from_key(key)
    prefix: tuple[Command, ...] = ()
    for _ in range(_MAX_REDIRECTS):
        redis_node = node.redis_connection or client.get_redis_connection(node)
        try:
            replies = _call_on_pool(redis_node.connection_pool, (*prefix, *commands))
        except CallFailed as failed:
            if _node_may_be_gone(failed):
                # The node may be gone for good (failover): look again next time.
                _refresh[client] = True
            raise
        replies = replies[len(prefix) :]
        first = replies[0]
        if not isinstance(first, AskError):
            return replies
        # Redirected: the command did not run here; a WAIT after it has
        # nothing to wait for. Send the whole batch where Redis says.
        _redirect_target(client, first)
        node = _node_at(client, first)
        prefix = () if isinstance(first, MovedError) else (("ASKING",),)
    raise CallFailed(RedisError("too many Cluster redirections"), may_have_run=False)


def call(client: Any, commands: Sequence[Command], key: bytes) -> list[Any]:
    """Send ``commands`` as one batch on one connection; a reply each, errors as values.

    On a Cluster the batch goes to the node owning ``key``'s slot. Raises
    ``CallFailed``; it never sends a written batch again.
    """
    if is_cluster(client):
        return _cluster_call(client, commands, key)
    return _call_on_pool(client.connection_pool, commands)


# -- asyncio ---------------------------------------------------------------------


async def _exchange_async(conn: Any, commands: Sequence[Command]) -> list[Any]:
    try:
        await conn.send_packed_command(conn.pack_commands(commands), False)
    except BaseException as exc:
        await _disconnect(conn)
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
            await _disconnect(conn)
            raise CallFailed(exc, may_have_run=True) from exc
    return replies


async def _disconnect(conn: Any) -> None:
    try:
        await conn.disconnect(nowait=True)
    except Exception:  # closing a broken connection: nothing more to do
        logger.debug("closing a failed connection failed", exc_info=True)


async def _connected(conn: Any, bound: float | None) -> None:
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
        await _disconnect(conn)
        raise RedisTimeoutError("Timeout connecting to server") from exc
    finally:
        conn.retry = saved


async def _checkout_async(pool: Any) -> Any:
    from redis.asyncio.connection import BlockingConnectionPool

    bound = _connect_bound(pool.connection_kwargs)
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
        await _connected(conn, bound)
        # ``can_read`` from redis-py 8 on; 5.x names it ``can_read_destructive``.
        stale = getattr(conn, "can_read", None) or conn.can_read_destructive
        if await stale():
            # Data or EOF on an idle connection: it is stale, start afresh.
            await _disconnect(conn)
            await _connected(conn, bound)
    except BaseException:
        await pool.release(conn)
        raise
    return conn


async def _call_on_pool_async(pool: Any, commands: Sequence[Command]) -> list[Any]:
    from redis.exceptions import MaxConnectionsError

    for attempt in (1, 2):
        try:
            conn = await _checkout_async(pool)
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


async def _call_on_node_async(node: Any, commands: Sequence[Command]) -> list[Any]:
    from redis.exceptions import MaxConnectionsError

    try:
        conn = node.acquire_connection()
    except MaxConnectionsError as exc:
        raise CallFailed(exc, may_have_run=False) from exc
    try:
        try:
            await _connected(conn, _connect_bound(node.connection_kwargs))
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


async def _cluster_call_async(client: Any, commands: Sequence[Command], key: bytes) -> list[Any]:
    if _refresh.pop(client, False):
        try:
            await client.nodes_manager.initialize()
        except RedisError as exc:
            _refresh[client] = True
            raise CallFailed(exc, may_have_run=False) from exc
    if getattr(client, "_initialize", False):
        await client.initialize()
    node = client.get_node_from_key(key)
    prefix: tuple[Command, ...] = ()
    for _ in range(_MAX_REDIRECTS):
        try:
            replies = await _call_on_node_async(node, (*prefix, *commands))
        except CallFailed as failed:
            if _node_may_be_gone(failed):
                _refresh[client] = True
            raise
        replies = replies[len(prefix) :]
        first = replies[0]
        if not isinstance(first, AskError):
            return replies
        moved = _redirect_target(client, first)
        if moved is not None:
            await moved
        node = _node_at(client, first)
        prefix = () if isinstance(first, MovedError) else (("ASKING",),)
    raise CallFailed(RedisError("too many Cluster redirections"), may_have_run=False)


async def call_async(client: Any, commands: Sequence[Command], key: bytes) -> list[Any]:
    """``call`` for a ``redis.asyncio`` client."""
    if is_cluster(client):
        return await _cluster_call_async(client, commands, key)
    return await _call_on_pool_async(client.connection_pool, commands)
