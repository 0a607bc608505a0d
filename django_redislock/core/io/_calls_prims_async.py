"""What a task does its own way under the bounded calls (``calls_async.py``).

``tools/gen_sync.py`` maps this module to ``_calls_prims.py``, whose names mean
the same for threads; the calls themselves, and every decision in them, are
written once, in ``calls_async.py``. Only what a task and a thread truly do
differently is here:

* taking a connection of the caller's own pool and connecting it once,
  without retries: the asyncio pools have a public method for the first step
  (``get_available_connection``); a sync pool is taken from under its lock;
  and giving it back as the pool's ``release`` does, without the work that
  release does for nobody (``give_back_async``);
* where a batch goes on a Cluster node: an asyncio node has connections of its
  own and no pool (``node_pool`` is None); a sync node's client has a pool;
* whether a node's breaker refuses calls (kept per client and node name for
  an asyncio Cluster client, per pool for a sync one);
* pausing, and telling an asyncio client's slot map of a MOVED (awaited).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import time
from typing import TYPE_CHECKING, Any

# The clients of this shell, as ``calls_async.py``'s annotations name them.
from redis.asyncio import Redis as ServerClient
from redis.asyncio.cluster import RedisCluster as ClusterClient
from redis.exceptions import RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .breaker import node_breaker
from .calls_base import (
    ASYNC_RELEASED,
    POOL_METRICS,
    connect_bound,
    get_connection_args,
    redirect_target,
    refused,
    release_listeners,
)

# redis-py's connection metrics where its asyncio pools record theirs (None: nowhere).
_metric_names, _, _metrics = POOL_METRICS

# Per pool class: whether its release is redis-py's asyncio ``ConnectionPool.release``,
# and whether that release takes the pool's lock (redis-py 8 and later).
_own_release: dict[type, tuple[bool, bool]] = {}

if TYPE_CHECKING:
    from redis.exceptions import AskError

__all__ = [
    "ClusterClient",
    "ServerClient",
    "checkout_async",
    "disconnect_async",
    "follow_moved_async",
    "give_back_async",
    "make_ready_async",
    "node_pool",
    "owner_refused",
    "pause_async",
]

# The warnings of this module are those of the bounded calls it serves.
logger = logging.getLogger("django_redislock.transport")

# A pause before a batch is sent again (the event loop runs meanwhile).
pause_async = asyncio.sleep


async def disconnect_async(conn: Any) -> None:
    """Close a connection that failed mid-call."""
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


async def _record_async(pool: Any, *, taken: bool, made: bool = False) -> None:
    """Count a connection of ``pool`` as taken (``taken``; ``made`` for a new
    one) or idle again in redis-py's pool metrics, as the asyncio pool's
    ``get_connection`` and ``release`` do: ``get_available_connection``,
    which a lock call takes it with, counts nothing, and the give-back must
    not count it back alone."""
    if _metrics is None or not await _metrics.is_enabled():
        return
    name = _metric_names.get_pool_name(pool)
    idle, used = _metric_names.ConnectionState.IDLE, _metric_names.ConnectionState.USED
    step = 1 if taken else -1
    if not made:
        await _metrics.record_connection_count(pool_name=name, connection_state=idle, counter=-step)
    await _metrics.record_connection_count(pool_name=name, connection_state=used, counter=step)


async def _record_made_async(pool: Any, made: float) -> None:
    """How long a new connection of ``pool``, made at ``made``, took to make
    and connect, as the asyncio pool's ``get_connection`` records it."""
    if _metrics is not None and await _metrics.is_enabled():
        spent = time.monotonic() - made
        await _metrics.record_connection_create_time(connection_pool=pool, duration_seconds=spent)


async def _released_async(pool: Any, conn: Any) -> None:
    """Tell the pool's listeners that ``conn`` went back, after the pool's
    lock as its ``release`` does (``release_listeners``: redis-py's
    re-authentication alone is awaited directly)."""
    how = release_listeners(pool, ASYNC_RELEASED)
    if how is True:
        await conn.re_auth()
    elif how is not None:
        await how.dispatch_async(ASYNC_RELEASED[0](conn))


async def give_back_async(pool: Any, conn: Any) -> None:
    """Put ``conn`` back in ``pool``: what ``await pool.release(conn)`` does.

    For a pool whose release is redis-py's own asyncio ``ConnectionPool.release``
    and a connection it counts in use (every call's), the same steps: under
    the pool's lock, closed if redis-py marked it to reconnect and made
    available; then its listeners told, and redis-py's connection metrics
    recorded only when they are on. That release names the pool and asks
    for a metrics collector twice whether they are on or not, and dispatches
    its event through a lock of the dispatcher's and a copy of the listeners
    (``python -m benchmarks.client_cost --calls`` counts what a call saves).
    Any other pool or connection goes back through the pool's own release.
    """
    kind = type(pool)
    known = _own_release.get(kind)
    if known is None:
        from redis.asyncio.connection import ConnectionPool

        release = ConnectionPool.release
        # A release without code of its own (wrapped) is not read here.
        names: tuple[str, ...] | None = getattr(
            getattr(release, "__code__", None), "co_names", None
        )
        own = names is not None and getattr(kind, "release", None) is release
        known = _own_release[kind] = (own, names is not None and "_lock" in names)
    own, locks = known
    if not own or conn not in pool._in_use_connections:
        await pool.release(conn)
        return
    # The pool's lock where its release takes it, and only there: a wait for
    # it is a point where the caller can be cancelled, the connection not
    # yet back, which a release without it does not have.
    async with pool._lock if locks else contextlib.nullcontext():
        pool._in_use_connections.remove(conn)
        reconnect = getattr(conn, "should_reconnect", None)  # redis-py 7 and later
        if reconnect is not None and reconnect():
            await conn.disconnect()
        pool._available_connections.append(conn)
    await _released_async(pool, conn)
    await _record_async(pool, taken=False)


async def checkout_async(pool: Any) -> Any:
    """A connected connection of the caller's own pool, within the pool's cap."""
    from redis.asyncio.connection import BlockingConnectionPool

    if isinstance(pool, BlockingConnectionPool) or not hasattr(pool, "get_available_connection"):
        bound = connect_bound(pool.connection_kwargs)
        # Waiting for a free connection is the pool's business; connecting
        # (with whatever retries) must end within the bound all the same.
        getter = pool.get_connection(*get_connection_args(pool))
        if bound is None:
            return await getter
        try:
            return await asyncio.wait_for(getter, bound)
        except asyncio.TimeoutError as exc:
            raise RedisTimeoutError("Timeout getting a connection") from exc
    idle = bool(pool._available_connections)
    made = time.monotonic()  # when a new one is made, as the pool times it
    conn = pool.get_available_connection()
    try:
        await _record_async(pool, taken=True, made=not idle)
        await make_ready_async(pool, conn)
        if not idle:
            await _record_made_async(pool, made)
    except BaseException:
        # Failed or interrupted mid-connect (cancelled mid-handshake too): a
        # reply of the handshake may be on its way, and must not greet the
        # next caller. It goes back closed.
        await disconnect_async(conn)
        await pool.release(conn)
        raise
    return conn


async def make_ready_async(pool: Any, conn: Any) -> None:
    """Connect ``conn`` (ours for now, of ``pool`` or of a Cluster node), afresh
    if data or EOF waits on it, within ``pool``'s connect bound.

    Only a connection that was already open is looked at: one connected just
    now may have bytes of its own handshake waiting (a TLS 1.3 server sends
    its session tickets after it), which the event loop reads in due course.
    """
    bound = connect_bound(pool.connection_kwargs)
    if getattr(conn, "is_connected", False):
        # ``can_read`` from redis-py 8 on; 5.x names it ``can_read_destructive``.
        stale = getattr(conn, "can_read", None) or conn.can_read_destructive
        if await stale() or _socket_readable(conn):
            # Data or EOF on an idle connection: it is stale, start afresh.
            await disconnect_async(conn)
    await connected(conn, bound)


def node_pool(client: ClusterClient, node: Any) -> Any:
    """The pool a batch for ``node`` is sent on: none, an asyncio Cluster node
    has connections of its own (its breaker is kept per client and node name)."""
    return None


def owner_refused(client: ClusterClient, key: bytes) -> bool:
    """Whether the node the slot map names for ``key`` has its breaker open."""
    try:
        owner = client.get_node_from_key(key)  # type: ignore[arg-type]
    except (RedisError, RedisClusterException, LookupError):
        return False  # no slot map to read: the call reads it
    return owner is not None and refused(node_breaker(client, owner))


async def follow_moved_async(client: ClusterClient, error: AskError) -> None:
    """Tell the client's slot map of a MOVED (``redirect_target``), awaited."""
    moved_slot = redirect_target(client, error)
    if moved_slot is not None:
        await moved_slot
