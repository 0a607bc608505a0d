# generated from calls_async.py by tools/gen_sync.py; do not edit
"""Every call of the library to Redis, bounded: written once, for asyncio.

``tools/gen_sync.py`` makes the sync functions (``calls.py``) from this
source: edit it, never the generated file. The policy, and every decision
that needs no I/O, is in ``calls_base.py``; what a task and a thread do
differently (taking a connection of a pool, pausing) is in
``_calls_prims.py``. The steps, from the caller down:

* the script runner (``run``, ``run_acked``) sends the batches
  ``ScriptCall`` decides on;
* ``call`` sends one batch to a single server's pool
  (``call_on_pool``) or, on a Cluster, to the node owning the key's
  slot (``cluster_call``), through the pool's or node's breaker
  (``breaker.py``);
* ``exchange`` writes the batch on one connection and reads a reply
  each.

A call cut short by anything but Redis (a cancelled task; in sync code, a
signal's ``KeyboardInterrupt`` or ``SystemExit``) closes its connection, whose
reply would otherwise wait for the next caller, and goes on as itself: it is
not Redis failing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from redis.exceptions import AskError, RedisClusterException, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..clients import RedisClient
from ..engine.scripts import Script
from ..failures import said_retry
from ..topology import is_cluster
from . import giveback
from ._calls_prims import (
    checkout,
    disconnect,
    follow_moved,
    give_back,
    make_ready,
    node_pool,
    owner_refused,
    pause,
)
from .breaker import Breaker, breaker_of, node_breaker
from .calls_base import (
    Args,
    CallFailed,
    Command,
    Keys,
    Pending,
    Retries,
    ScriptCall,
    clean,
    first_batch,
    hop,
    looked_up_again_if_gone,
    next_hop,
    packed,
    release_to_node,
    slot_maps_due,
    unwritten,
    wait_for_replicas,
)
from .interrupts import CallTimeout

if TYPE_CHECKING:
    from ._calls_prims import ClusterClient, ServerClient

__all__ = [
    "CallFailed",
    "Command",
    "Pending",
    "call",
    "call_on_pool",
    "cluster_call",
    "exchange",
    "guarded",
    "refresh_slots",
    "run_acked",
    "run",
]

logger = logging.getLogger("django_redislock.transport")


# -- one batch on one connection -----------------------------------------------------


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


# -- on a pool -----------------------------------------------------------------------


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
                give_back(pool, conn)
    raise AssertionError("unreachable")  # pragma: no cover


# -- on a Redis Cluster (calls_base.py says what is sent again, and when) -------------


def refresh_slots(client: ClusterClient) -> bool:
    """Read the slot map again now; whether it could be read."""
    try:
        client.nodes_manager.initialize()
    except (RedisError, RedisClusterException) as exc:
        logger.debug("could not read the Cluster's slot map: %s", exc)
        return False
    return True


def cluster_call(client: ClusterClient, commands: Sequence[Command], key: bytes) -> list[Any]:
    """``commands`` on the node owning ``key``'s slot."""
    with looked_up_again_if_gone(client):
        if slot_maps_due.get(client, False) and not owner_refused(client, key):
            slot_maps_due.pop(client, None)
            client.nodes_manager.initialize()
        # redis-py's asyncio client closes itself after its own timeout (5.0:
        # and reads the slot map again at the next call): not while the
        # owner's breaker is open. (A sync client has no such flag.)
        if getattr(client, "_initialize", False) and not owner_refused(client, key):
            client.initialize()  # type: ignore[attr-defined, unused-ignore]
        # Annotated ``str`` by redis-py's asyncio client, which takes bytes keys
        # as every command does.
        node = client.get_node_from_key(key)  # type: ignore[arg-type, unused-ignore]
    prefix: tuple[Command, ...] = ()
    retries = Retries(node)
    hops = 0
    while True:
        try:
            with looked_up_again_if_gone(client):
                replies = (_call_on_node(client, node, (*prefix, *commands)))[len(prefix) :]
        except CallFailed as failed:
            moved = _moved_since(client, node, key) if unwritten(failed) else None
            if moved is None:
                raise
            node, prefix, hops = moved, (), hop(hops, failed)
            continue
        if said_retry(replies[0]):
            delay = retries.next_pause()
            if delay is None:
                return replies
            pause(delay)
            continue
        if not isinstance(replies[0], AskError):
            return replies
        follow_moved(client, replies[0])
        node, prefix = next_hop(client, replies[0])
        hops = hop(hops, None)


def _moved_since(client: ClusterClient, node: Any, key: bytes) -> Any:
    """The slot's owner after reading the map again, if another than ``node``."""
    with contextlib.suppress(RedisError, RedisClusterException):
        if refresh_slots(client):
            slot_maps_due.pop(client, None)
            owner = client.get_node_from_key(key)  # type: ignore[arg-type, unused-ignore]
            if owner is not None and owner.name != node.name:
                return owner
    return None


def _call_on_node(client: ClusterClient, node: Any, commands: Sequence[Command]) -> list[Any]:
    """``commands`` on a Cluster node: on its client's pool (a sync node), or
    on a connection of the node itself (an asyncio node, which has no pool:
    its breaker is kept per client and node name)."""
    pool = node_pool(client, node)
    if pool is not None:
        return call_on_pool(pool, commands)
    return guarded(node_breaker(client, node), lambda: _on_node(node, commands))


def _on_node(node: Any, commands: Sequence[Command]) -> list[Any]:
    from redis.exceptions import MaxConnectionsError

    try:
        conn = node.acquire_connection()
    except MaxConnectionsError as exc:
        raise CallFailed(exc, may_have_run=False) from exc
    try:
        try:
            make_ready(node, conn)
        except RedisError as exc:
            raise CallFailed(exc, may_have_run=False) from exc
        return exchange(conn, commands)
    except CallFailed as failed:
        if failed.pending is not None:
            failed.pending.release = lambda: release_to_node(node, conn)
            giveback.drain(failed.pending)
            conn = None
        raise
    finally:
        if conn is not None:
            release_to_node(node, conn)


# -- the transport ---------------------------------------------------------------------


def call(client: RedisClient, commands: Sequence[Command], key: bytes) -> list[Any]:
    """Send ``commands`` as one batch on one connection; a reply each, errors as values.

    On a Cluster the batch goes to the node owning ``key``'s slot. Raises
    ``CallFailed``; it never sends a written batch again.
    """
    if is_cluster(client):
        return cluster_call(cast("ClusterClient", client), commands, key)
    # Not a Cluster: a single server's client, with its pool.
    return call_on_pool(cast("ServerClient", client).connection_pool, commands)


# -- the script runner (``ScriptCall`` decides; this only sends its batches) ------------


def _resent(client: RedisClient, script_call: ScriptCall) -> list[Any]:
    while script_call.batch is not None:
        try:
            script_call.answer(call(client, script_call.batch, script_call.slot_key))
        except CallFailed as failed:
            script_call.answer(failed)
    return script_call.replies


def _sent(client: RedisClient, script: Script, keys: Keys, args: Args, extra: Args = ()) -> Any:
    """The first batch; ``ScriptCall`` decides what follows only when it is not clean."""
    try:
        outcome: Any = call(client, *first_batch(script, keys, args, extra))
        if clean(outcome):
            return outcome
    except CallFailed as failed:
        outcome = failed
    script_call = ScriptCall(client, script, keys, args, extra).answered(outcome)
    return _resent(client, script_call)


def run(client: RedisClient, script: Script, keys: Keys, args: Args) -> Any:
    """Run ``script``; Redis failures become RedisUnavailable.

    Bounded by the client's socket timeout whatever its retry policy (see
    ``calls_base``); a script that may have run is never sent again.
    """
    return (_sent(client, script, keys, args))[0]


def run_acked(
    client: RedisClient,
    script: Script,
    keys: Keys,
    args: Args,
    replicas: int,
    timeout: float,
) -> tuple[Any, int]:
    """``run``, then WAIT for ``replicas``; returns (result, replicas that acked).

    The script and WAIT go together on one connection (of the node owning the
    keys' slot, on a Cluster): WAIT counts only the writes made on its own
    connection, so anywhere else it could confirm a write it never saw.
    Still one round trip.
    """
    result, acked = _sent(client, script, keys, args, wait_for_replicas(replicas, timeout))
    return result, int(acked)
