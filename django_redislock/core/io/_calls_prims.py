"""What a thread does its own way under the bounded calls: ``_calls_prims_async.py``'s twin.

The generated ``calls.py`` imports these names where its asyncio source
imports those of ``_calls_prims_async.py``; each means the same for threads.

A sync pool's checkout (``get_connection``) would connect with the
connections' retry policy (redis-py's default one, since 6.0, retries
timeouts with back-off), so ``checkout`` takes a connection as the pool's
checkout does, under its lock, then connects it itself, once, with the
connection's retry policy set aside and restored (the connection is the
caller's alone meanwhile). Lock calls stay within the pool's
``max_connections`` with everything else the client does: at the cap a lock
call fails as a plain command does. ``give_back`` is its counterpart: the
connection goes back as the pool's ``release`` puts it back, without the
work that release does for nobody (see there).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

# The clients of this shell, as ``calls_async.py``'s annotations name them.
from redis import Redis as ServerClient
from redis.cluster import RedisCluster as ClusterClient
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..process import this_process
from .breaker import Breaker, breaker_of
from .calls_base import (
    POOL_METRICS,
    RELEASED,
    connect_bound,
    connect_may_linger,
    get_connection_args,
    redirect_target,
    refused,
    release_listeners,
)

if TYPE_CHECKING:
    from redis.exceptions import AskError

# redis-py's connection metrics where its sync pools record theirs (None: nowhere).
_metric_names, _metrics, _ = POOL_METRICS

__all__ = [
    "ClusterClient",
    "ServerClient",
    "checkout",
    "disconnect",
    "follow_moved",
    "give_back",
    "make_ready",
    "node_pool",
    "owner_refused",
    "pause",
]

# The warnings of this module are those of the bounded calls it serves.
logger = logging.getLogger("django_redislock.transport")

# A pause before a batch is sent again (the thread sleeps).
pause = time.sleep

# Connects once: no back-off, nothing retried (it keeps no state between calls).
_NO_RETRY: Any = None
_takers: dict[type, Any] = {}
# Per pool class: whether its release is redis-py's ``ConnectionPool.release``.
_own_release: dict[type, bool] = {}
_warned: set[type] = set()


def _no_retry() -> Any:
    global _NO_RETRY
    if _NO_RETRY is None:
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        _NO_RETRY = Retry(NoBackoff(), 0)
    return _NO_RETRY


def _record(pool: Any, *, taken: bool) -> None:
    """Count a connection of ``pool`` as taken (``taken``) or idle again in
    redis-py's pool metrics, as its checkout and its ``release`` do.

    Without this, the opt-in connection-count metrics of redis-py (7.4 and
    later) would drift by one per call.
    """
    if _metrics is None or not _metrics.is_enabled():
        # Metrics off (the default): the pool's name and two records cost
        # more than the rest of the checkout.
        return
    name = _metric_names.get_pool_name(pool)
    idle, used = _metric_names.ConnectionState.IDLE, _metric_names.ConnectionState.USED
    step = 1 if taken else -1
    _metrics.record_connection_count(pool_name=name, connection_state=idle, counter=-step)
    _metrics.record_connection_count(pool_name=name, connection_state=used, counter=step)


def _released(pool: Any, conn: Any) -> None:
    """Tell the pool's listeners that ``conn`` went back, under the pool's
    lock as its ``release`` does (``release_listeners``: redis-py's
    re-authentication alone is called directly, without the dispatcher's
    lock, event and copy of its listeners)."""
    how = release_listeners(pool, RELEASED)
    if how is True:
        conn.re_auth()
    elif how is not None:
        how.dispatch(RELEASED[0](conn))


def give_back(pool: Any, conn: Any) -> None:
    """Put ``conn`` back in ``pool``: what ``pool.release(conn)`` does.

    For a pool whose release is redis-py's own ``ConnectionPool.release``
    and a connection it owns and counts in use (every call's), the same steps
    under the pool's lock (closed if redis-py marked it to reconnect, made
    available, its listeners told) with redis-py's connection metrics
    recorded only when they are on, as ``_take`` does. That release names
    the pool for its metrics and asks twice for a collector whether they
    are on or not, and dispatches its event through a lock and a copy of
    the listeners: about an eighth of a lock call's client instructions
    (``python -m benchmarks.client_cost --calls``). Any other pool or
    connection goes back through the pool's own release.
    """
    kind = type(pool)
    own = _own_release.get(kind)
    if own is None:
        from redis.connection import ConnectionPool

        own = _own_release[kind] = getattr(kind, "release", None) is ConnectionPool.release
    if not own:
        pool.release(conn)
        return
    _checkpid(pool)
    with pool._lock:
        taken = conn in pool._in_use_connections and pool.owns_connection(conn)
        if taken:
            pool._in_use_connections.remove(conn)
            reconnect = getattr(conn, "should_reconnect", None)  # redis-py 7 and later
            if reconnect is not None and reconnect():
                conn.disconnect()
            pool._available_connections.append(conn)
            _released(pool, conn)
    if not taken:
        # Not counted in use, or another process's: the pool says what then.
        pool.release(conn)
        return
    _record(pool, taken=False)


def _checkpid(pool: Any) -> None:
    # The pool's own check (a forked child resets the pool it inherited),
    # skipped while the pool is this process's: it asks the system each time.
    if getattr(pool, "pid", None) != this_process.pid:
        pool._checkpid()


def _record_checkout(pool: Any, asked: float, made: float | None, waited: bool) -> None:
    """What redis-py's checkout records of a connection it hands out, besides
    the counts, once it is connected: how long a new one (``made``: when it
    was made) took to make, and for a blocking pool (``waited``) how long
    the caller waited for one since it asked (``asked``)."""
    if _metrics is None or not _metrics.is_enabled():
        return
    now = time.monotonic()
    if made is not None:
        _metrics.record_connection_create_time(connection_pool=pool, duration_seconds=now - made)
    if waited:
        name = _metric_names.get_pool_name(pool)
        _metrics.record_connection_wait_time(pool_name=name, duration_seconds=now - asked)


def _take(pool: Any) -> tuple[Any, float | None]:
    """A connection of a ``ConnectionPool``, counted in use, not yet checked,
    and when it was made (None: an idle one).

    The critical section of ``ConnectionPool.get_connection``; the pool's cap
    holds (``make_connection`` raises ``MaxConnectionsError`` past it).
    """
    _checkpid(pool)
    made = None
    with pool._lock:
        try:
            conn = pool._available_connections.pop()
        except IndexError:
            made = time.monotonic()
            conn = pool.make_connection()
        pool._in_use_connections.add(conn)
    _record(pool, taken=True)
    return conn, made


def _take_blocking(pool: Any) -> tuple[Any, float | None]:
    """``_take`` for a ``BlockingConnectionPool``: wait for a free slot."""
    import queue

    from redis.exceptions import MaxConnectionsError

    _checkpid(pool)
    timeout = pool.timeout
    # Waiting for a slot and connecting together stay within one connect's bound.
    wait = connect_bound(pool.connection_kwargs)
    if wait is not None and (timeout is None or timeout > wait):
        timeout = wait
    # During a maintenance notification (redis-py 7 and later) the pool takes
    # its lock around this too, while it updates its connections.
    guard = pool._lock if getattr(pool, "_in_maintenance", False) else contextlib.nullcontext()
    made = None
    with guard:
        try:
            conn = pool.pool.get(block=True, timeout=timeout)
        except queue.Empty:
            raise MaxConnectionsError(f"No connection available within {timeout}s.") from None
        if conn is None:
            made = time.monotonic()
            try:
                conn = pool.make_connection()
            except BaseException:
                pool.pool.put_nowait(None)  # the slot stays free
                raise
    _record(pool, taken=True)
    return conn, made


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
    """Close a connection that failed mid-call."""
    conn.disconnect()


def make_ready(pool: Any, conn: Any) -> None:
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
        if connect_may_linger(pool.connection_kwargs) and type(pool) not in _warned:
            _warned.add(type(pool))
            logger.warning(
                "cannot take a connection of a %s without its retries: lock calls may "
                "last longer than one socket timeout while connecting",
                type(pool).__name__,
            )
        return pool.get_connection(*get_connection_args(pool))
    # A blocking pool's checkout times the caller's wait for a connection.
    waited = take is _take_blocking
    asked = time.monotonic() if waited else 0.0
    conn, made = take(pool)
    try:
        make_ready(pool, conn)
    except BaseException:
        # Failed or interrupted mid-connect: a reply of the handshake may be
        # on its way, and must not greet the next caller. It goes back closed.
        conn.disconnect()
        pool.release(conn)
        raise
    if made is not None or waited:
        _record_checkout(pool, asked, made, waited)
    return conn


def node_pool(client: ClusterClient, node: Any) -> Any:
    """The pool a batch for ``node`` is sent on: that of the node's client."""
    return (node.redis_connection or client.get_redis_connection(node)).connection_pool


def _breaker_of_node(client: ClusterClient, key: bytes) -> Breaker | None:
    """The breaker of the node the current slot map names for ``key``, if it has a pool yet."""
    try:
        node = client.get_node_from_key(key)
    except (RedisError, RedisClusterException):
        return None
    pool = getattr(getattr(node, "redis_connection", None), "connection_pool", None)
    return breaker_of(pool) if pool is not None else None


def owner_refused(client: ClusterClient, key: bytes) -> bool:
    """Whether the node the slot map names for ``key`` has its breaker open."""
    return refused(_breaker_of_node(client, key))


def follow_moved(client: ClusterClient, error: AskError) -> None:
    """Tell the client's slot map of a MOVED (``redirect_target``)."""
    redirect_target(client, error)
