"""What a bounded call decides without I/O, once for the sync and the asyncio shell.

``execute_command`` would apply the client's retry policy, and redis-py's
default one since 6.0 (three retries, ten from 8.0, timeouts included, with
back-off) turns a frozen Redis into a call that lasts many socket timeouts
and sends the same script again after a timeout, when the first one may
still run. So a batch of commands (a script, or a script and the ``WAIT``
that must follow it on the same connection) is written on a connection
taken from the client's pool, with the library's own policy:

* the batch is sent again once only when the connection failed before any of
  it was written (connecting, or a pooled connection found dead);
* after a timeout nothing is sent again, and the connection is not closed:
  the batch is still in Redis's buffer and may run when Redis resumes. The
  connection goes to ``giveback``, which reads the late replies and frees the
  connection; a give-back asked for that call goes on after them, so it runs
  after the late script, not before it.

This module holds the decisions: what a batch is and how it is packed
(``Command``, ``packed``), how it fails (``CallFailed``) and what a late one
still owes (``Pending``); how long connecting may take (``connect_bound``);
one call of a script (``ScriptCall``); and on a Redis Cluster, which failures
say a node may be gone, where a redirection leads and when a refused batch is
sent again. ``calls_async.py`` (and its generated sync twin ``calls.py``) does
the I/O; ``_calls_prims_async.py`` and ``_calls_prims.py`` hold what a task and
a thread do differently.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import socket
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis.connection
from redis.exceptions import AskError, MovedError, NoScriptError, RedisClusterException, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import failures
from ..clients import AnyRedisClient
from ..engine.scripts import Script
from ..exceptions import RedisUnavailable
from .breaker import Breaker

if TYPE_CHECKING:
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

__all__ = [
    "DRAIN_DEFAULT",
    "DRAIN_POLL",
    "FIRST_DELAY",
    "MAX_DELAY",
    "MAX_REDIRECTS",
    "Args",
    "CallFailed",
    "Command",
    "Keys",
    "Pending",
    "Retries",
    "ScriptCall",
    "clean",
    "connect_bound",
    "connect_may_linger",
    "first_batch",
    "get_connection_args",
    "release_listeners",
    "RELEASED",
    "ASYNC_RELEASED",
    "POOL_METRICS",
    "looked_up_again_if_gone",
    "next_hop",
    "hop",
    "packed",
    "pending_of",
    "redirect_target",
    "refused",
    "release_to_node",
    "slot_maps_due",
    "unwritten",
    "wait_for_replicas",
]

# -- a batch -----------------------------------------------------------------------

# The packer redis-py's connections use when hiredis is installed, and
# hiredis's own function; None (the type of no packer) without either.
_HiredisPacker: Any = getattr(redis.connection, "HiredisRespSerializer", None)
try:
    _pack_command: Any = importlib.import_module("hiredis").pack_command
except ImportError:  # pragma: no cover - without hiredis
    _HiredisPacker = None

Command = tuple[Any, ...]


def packed(conn: Any, commands: Sequence[Command]) -> list[bytes]:
    """``commands`` as ``conn`` would write them (``conn.pack_commands``).

    A connection that packs with hiredis has each command packed by hiredis
    directly: redis-py's wrapper first converts byte buffers and splits a
    command name holding a space, neither of which the library sends, at
    more than the packing costs (a lock's acquire: 4.1 us through redis-py,
    1.9 us directly). Anything else is packed by redis-py.
    """
    if type(getattr(conn, "_command_packer", None)) is _HiredisPacker:
        try:
            if len(commands) == 1:
                # One script call, the usual batch: no generator, no join.
                head = commands[0][0]
                if type(head) is str and " " not in head:
                    return [_pack_command(commands[0])]
            elif all(type(c[0]) is str and " " not in c[0] for c in commands):
                return [b"".join([_pack_command(c) for c in commands])]
        except TypeError:  # an argument hiredis does not take: redis-py converts it
            pass
    return list(conn.pack_commands(commands))


# A connection whose replies are late is kept this long, at least, for them.
DRAIN_DEFAULT = 30.0
# Back-off between attempts of a give-back: short, so that a Redis that comes
# back is answered within about one round trip; each attempt against a stalled
# Redis already waits a socket timeout, so this does not hammer it.
FIRST_DELAY = 0.02
MAX_DELAY = 0.25
# How long a sync drain polls its connection per turn before the next job's
# turn; a give-back that follows the drained call waits as long under asyncio.
DRAIN_POLL = 0.05


@dataclass(eq=False)
class Pending:
    """A connection with ``unread`` replies still owed by Redis.

    Sync and asyncio give-backs follow this one policy (``giveback.py``,
    ``giveback_async.py``).
    """

    conn: Any
    unread: int
    release: Any  # how the connection goes back to its pool (sync or async callable)
    deadline: float = field(default_factory=lambda: time.monotonic() + DRAIN_DEFAULT)
    done: threading.Event = field(default_factory=threading.Event)
    # True once the late replies were read: whatever the batch did is done.
    answered: bool = False
    # What to run once they are read (the give-backs to send again), and
    # whether the drain has ended.
    _again: list[Callable[[], Any]] = field(default_factory=list)
    _settled: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def keep_until(self, deadline: float) -> None:
        """Wait for the late replies at least until ``deadline`` (monotonic)."""
        self.deadline = max(self.deadline, deadline)

    def once_answered(self, action: Callable[[], Any]) -> None:
        """Run ``action`` when the drain has read every late reply.

        Nothing if the drain has ended already: a give-back queued now runs
        after whatever it read.
        """
        with self._lock:
            if not self._settled:
                self._again.append(action)

    def settle(self) -> None:
        """The drain has ended: run what waited for the late replies, if read."""
        with self._lock:
            self._settled = True
            actions, self._again = self._again, []
        if self.answered:
            for action in actions:
                action()


def pending_of(after: BaseException | None) -> Pending | None:
    """The late replies the failed call ``after`` left, if any."""
    return getattr(after, "pending", None) if after is not None else None


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


# -- connecting --------------------------------------------------------------------
#
# Lock calls stay within the pool's ``max_connections`` with everything else the
# client does: at the cap a lock call fails as a plain command does. The pool's
# connections may retry a connect (redis-py's default policy retries timeouts,
# with back-off), so the library does not let ``get_connection`` connect them: it
# takes a connection as the pool's checkout does, then connects it itself, once,
# with the connection's retry policy set aside and restored (the connection is
# the caller's alone meanwhile). The asyncio pools have a public method for the
# first step (``get_available_connection``); the sync ones do the same under
# their lock (``_calls_prims.py``).

_wants_command_name: dict[type, bool] = {}


def _is_timeout_error(error: Any) -> bool:
    if not isinstance(error, type):
        return False
    timeouts = (RedisTimeoutError, TimeoutError, socket.timeout)
    # A class above TimeoutError (RedisError, Exception) catches timeouts too.
    return issubclass(error, timeouts) or any(issubclass(t, error) for t in timeouts)


def connect_may_linger(kwargs: dict[str, Any]) -> bool:
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


def get_connection_args(pool: Any) -> tuple[str, ...]:
    """What ``pool.get_connection`` is called with: redis-py before 5.3
    requires a command name; later versions warn on one."""
    kind = type(pool)
    wants = _wants_command_name.get(kind)
    if wants is None:
        parameter = inspect.signature(kind.get_connection).parameters.get("command_name")
        wants = parameter is not None and parameter.default is inspect.Parameter.empty
        _wants_command_name[kind] = wants
    return ("EVALSHA",) if wants else ()


# What a pool's release tells its listeners (redis-py 5.3 and later): its
# event, and redis-py's own listener, which re-authenticates the connection;
# for sync pools, and for asyncio pools. (None, None) before 5.3.
RELEASED: tuple[Any, Any] = (None, None)
ASYNC_RELEASED: tuple[Any, Any] = (None, None)
with contextlib.suppress(ImportError):
    from redis import event as _event

    RELEASED = (_event.AfterConnectionReleasedEvent, _event.ReAuthConnectionListener)
    ASYNC_RELEASED = (
        _event.AsyncAfterConnectionReleasedEvent,
        _event.AsyncReAuthConnectionListener,
    )


# redis-py's connection metrics (opt-in), where its pools record their
# connections (7.4 and later; 7.2 and 7.3 have recorders whose pools record
# none): the names they record under, the recorder of sync pools and that of
# asyncio pools, which a lock call's checkout and give-back record with as
# the pools' own do. (None, None, None) where the pools record nothing.
POOL_METRICS: tuple[Any, Any, Any] = (None, None, None)
with contextlib.suppress(ImportError):
    from redis.asyncio.observability import recorder as _async_recorder
    from redis.observability import attributes as _metric_names
    from redis.observability import recorder as _sync_recorder

    if all(hasattr(r, "record_connection_count") for r in (_sync_recorder, _async_recorder)):
        POOL_METRICS = (_metric_names, _sync_recorder, _async_recorder)


def release_listeners(pool: Any, released: tuple[Any, Any]) -> Any:
    """How a connection given back to ``pool`` tells the pool's listeners
    (``released``: ``RELEASED`` or ``ASYNC_RELEASED``): None when nobody
    listens; True when redis-py's re-authentication listener, whose one step
    is the connection's ``re_auth``, is the only one; else the dispatcher,
    to dispatch the event through."""
    event, reauth = released
    dispatcher = getattr(pool, "_event_dispatcher", None)
    if dispatcher is None or event is None:
        return None
    listeners = getattr(dispatcher, "_event_listeners_mapping", {}).get(event)
    if listeners is not None and len(listeners) == 1 and type(listeners[0]) is reauth:
        return True
    return dispatcher


# -- one call of a script -----------------------------------------------------------
#
# EVALSHA first, the source again by EVAL when the server does not have it
# (``NOSCRIPT``: a restart, ``SCRIPT FLUSH``, a failover), which also caches it
# for the next EVALSHA; a broken connection sends a repeatable script once more
# on a new one, never after a timeout (the first may still be on its way); an
# error reply or a failure becomes ``RedisUnavailable``. ``ScriptCall`` is that
# decision; the script runner of ``calls_async.py`` sends its batches.

Keys = tuple[bytes, ...]
Args = tuple[Any, ...]


def _unavailable(script: Script, exc: BaseException, client: AnyRedisClient) -> RedisUnavailable:
    # A wrong password, a server that is not running and one that does not
    # answer in time each get their own words (see failures.py).
    return failures.unavailable(f"running {script.name}", exc, failures.address_of(client))


def _send_again(script: Script, failed: CallFailed, tried: int) -> bool:
    """Whether a failed batch of ``script`` is sent once more (see Script)."""
    return (
        tried == 1
        and script.repeatable
        and failed.pending is None
        and isinstance(failed.cause, RedisConnectionError)
        and not isinstance(failed.cause, RedisTimeoutError)
    )


def _failed(script: Script, failed: CallFailed, client: AnyRedisClient) -> RedisUnavailable:
    error = _unavailable(script, failed.cause, client)
    # What ``may_have_run`` reads; ``pending`` orders a give-back after the late script.
    error.may_have_run = failed.may_have_run  # type: ignore[attr-defined]
    error.pending = failed.pending  # type: ignore[attr-defined]
    return error


def _batch(script: Script, keys: Keys, args: Args, extra: Args, *, by_sha: bool) -> list[Args]:
    head = ("EVALSHA", script.sha) if by_sha else ("EVAL", script.source)
    return [(*head, len(keys), *keys, *args), *extra]


def _batches(
    client: AnyRedisClient, script: Script, keys: Keys, args: Args, extra: Args
) -> Generator[list[Args], list[Any], list[Any]]:
    """The batches one call of ``script`` sends: each is yielded, and its
    replies sent back or its ``CallFailed`` thrown in. Returns the replies."""
    for tried in (1, 2):
        try:
            replies = yield _batch(script, keys, args, extra, by_sha=True)
            if isinstance(replies[0], NoScriptError):
                # It did not run: send the source, with what followed it, again.
                replies = yield _batch(script, keys, args, extra, by_sha=False)
        except CallFailed as failed:
            if _send_again(script, failed, tried):
                continue
            raise _failed(script, failed, client) from failed.cause
        for reply in replies:
            if isinstance(reply, Exception):
                raise _unavailable(script, reply, client) from reply
        return replies
    raise AssertionError("unreachable")  # pragma: no cover


class ScriptCall:
    """One call of a script, decided once (``batches``) for the sync and the
    asyncio shell, which only send ``batch`` and hand back what came of it."""

    def __init__(
        self, client: AnyRedisClient, script: Script, keys: Keys, args: Args, extra: Args = ()
    ) -> None:
        self.slot_key = keys[0] if keys else b""
        self._steps = _batches(client, script, keys, args, extra)
        self.batch: list[Args] | None = next(self._steps)
        self.replies: list[Any] = []

    def answer(self, outcome: list[Any] | CallFailed) -> None:
        """The replies to ``batch``, or how it failed; ``batch`` is None once done."""
        try:
            if isinstance(outcome, CallFailed):
                self.batch = self._steps.throw(outcome)
            else:
                self.batch = self._steps.send(outcome)
        except StopIteration as done:
            self.batch, self.replies = None, done.value

    def answered(self, outcome: list[Any] | CallFailed) -> ScriptCall:
        """``answer`` the first batch, sent by the caller; returns the call."""
        self.answer(outcome)
        return self


def clean(replies: list[Any]) -> bool:
    """Whether the first batch's replies are the answer as they are: the common
    case, which needs none of ``batches``' decisions (no error reply, no NOSCRIPT)."""
    return not any(isinstance(reply, Exception) for reply in replies)


def first_batch(script: Script, keys: Keys, args: Args, extra: Args) -> tuple[list[Args], bytes]:
    """The first batch of a call (as ``batches`` makes it) and its slot's key."""
    return _batch(script, keys, args, extra, by_sha=True), keys[0] if keys else b""


def wait_for_replicas(replicas: int, timeout: float) -> Args:
    # WAIT 0 would block forever: the smallest bound is one millisecond.
    return (("WAIT", replicas, max(1, int(timeout * 1000))),)


# -- on a Redis Cluster ---------------------------------------------------------------
#
# A batch goes to the node that owns the key's slot, and is sent again only
# where Redis says that it did not run:
#
# * MOVED and ASK are followed (at most ``MAX_REDIRECTS`` times);
# * TRYAGAIN (a command on several keys of a slot that is being migrated) and
#   CLUSTERDOWN (some slot has no primary: a failover under way) are sent
#   again after a short pause, until one socket timeout of the node has passed
#   since the call began: what a silent node would have cost the caller. Past
#   that the error reaches the caller, whose wait may allow more
#   (``failures.said_retry``);
# * a connection that failed before anything was written (nothing listens
#   there any more: the node died) has the slot map read again at once, and
#   the batch goes to the slot's new owner if the map names another.
#
# A node that failed to answer may be gone for good (a failover): the slot map
# is read again before the next call. Nothing that may have run is sent again.

# A redirection is followed this many times at most: a slot moving while we
# follow it is rare, a loop between two confused nodes must not hang a call.
MAX_REDIRECTS = 5
# Clients whose slot map is read again before their next call.
slot_maps_due: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
# TRYAGAIN and CLUSTERDOWN are retried after a pause that doubles from the
# first to the last, within one socket timeout of the node, or within
# _PATIENCE for a node that has none.
_PAUSES = (0.01, 0.2)
_PATIENCE = 2.0


def _node_may_be_gone(failed: CallFailed) -> bool:
    from redis.exceptions import MaxConnectionsError

    # A pool at its cap says nothing of the node: it must not cost the
    # next call a refresh of the slot map (which replaces node clients).
    return isinstance(failed.cause, (RedisConnectionError, RedisTimeoutError)) and not (
        isinstance(failed.cause, MaxConnectionsError)
    )


def unwritten(failed: CallFailed) -> bool:
    """Whether the node could not be reached at all: nothing was written."""
    return (
        not failed.may_have_run
        and failed.pending is None
        and _node_may_be_gone(failed)
        and not isinstance(failed.cause, RedisTimeoutError)
    )


def redirect_target(client: RedisCluster | AsyncRedisCluster, error: AskError) -> Any:
    """The client's slot map told of a MOVED; an awaitable to await first, from
    an asyncio client's slot map, else None."""
    # Its methods differ across redis-py versions: asked for by name below.
    manager: Any = client.nodes_manager
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


def _node_at(client: RedisCluster | AsyncRedisCluster, error: AskError) -> Any:
    node = client.get_node(host=error.host, port=error.port)
    if node is None and isinstance(error, MovedError):
        node = client.nodes_manager.get_node_from_slot(error.slot_id)
    if node is None:
        raise CallFailed(error, may_have_run=False)
    return node


@contextlib.contextmanager
def looked_up_again_if_gone(client: RedisCluster | AsyncRedisCluster) -> Iterator[None]:
    """A failure that says the node may be gone for good (a failover), or a
    failed reading of the slot map, has the map read again before the next call."""
    try:
        yield
    except CallFailed as failed:
        if _node_may_be_gone(failed):
            slot_maps_due[client] = True
        raise
    except (RedisError, RedisClusterException) as exc:
        # RedisClusterException (no startup node answers, a slot nobody
        # serves) is not a RedisError: it must not reach the caller raw.
        slot_maps_due[client] = True
        raise CallFailed(exc, may_have_run=False) from exc


def next_hop(
    client: RedisCluster | AsyncRedisCluster, error: AskError
) -> tuple[Any, tuple[Command, ...]]:
    """Where a redirected batch goes, and what goes before it there."""
    # Redirected: the command did not run there; a WAIT after it had nothing
    # to wait for. The whole batch goes where Redis says, after ASKING for ASK.
    return _node_at(client, error), () if isinstance(error, MovedError) else (("ASKING",),)


class Retries:
    """When a batch refused with TRYAGAIN or CLUSTERDOWN is sent again."""

    def __init__(self, node: Any) -> None:
        timeout = _kwargs_of(node).get("socket_timeout")
        self.until = time.monotonic() + (float(timeout) if timeout else _PATIENCE)
        self.pause = _PAUSES[0]

    def next_pause(self) -> float | None:
        """Seconds to pause before sending again, or None: give up."""
        pause = self.pause
        if time.monotonic() + pause > self.until:
            return None
        self.pause = min(self.pause * 2, _PAUSES[1])
        return pause


def _kwargs_of(node: Any) -> dict[str, Any]:
    connection = getattr(node, "redis_connection", None)
    pool = getattr(connection, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or getattr(node, "connection_kwargs", None)
    return kwargs if isinstance(kwargs, dict) else {}


def release_to_node(node: Any, conn: Any) -> Any:
    """Give ``conn`` back to the asyncio Cluster node it was taken from."""
    if hasattr(node, "release"):
        node.release(conn)
    else:  # redis-py 5.0
        node._free.append(conn)


def refused(breaker: Breaker | None) -> bool:
    """Whether a call to that node would be refused now: then the slot map is
    not read again in its caller's path either (the read may well ask the
    frozen node first, and wait its timeout). The refresh stays due, for the
    first call its breaker lets through."""
    return breaker is not None and breaker.refusing()


def hop(hops: int, failed: CallFailed | None) -> int:
    """One more hop to another node; past ``MAX_REDIRECTS`` the call fails."""
    if hops + 1 >= MAX_REDIRECTS:
        cause = failed.cause if failed is not None else RedisError("too many Cluster redirections")
        raise CallFailed(cause, may_have_run=False)
    return hops + 1
