"""What went wrong when Redis could not serve a call, in words that name the fix.

A wrong password, a server that is not running and a server that does not
answer in time all reach the caller as ``RedisUnavailable``; each gets its own
sentence and ``reason`` so that an operator is not sent looking for a network
problem when the password is wrong.
"""

from __future__ import annotations

import errno

from redis.exceptions import (
    AuthenticationError,
    ClusterDownError,
    NoPermissionError,
    RedisClusterException,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .clients import AnyRedisClient
from .exceptions import RedisUnavailable
from .io.breaker import BreakerOpen

__all__ = [
    "AUTH",
    "BREAKER_OPEN",
    "ERROR",
    "PERMISSION",
    "REASONS",
    "REFUSED",
    "TIMEOUT",
    "UNREACHABLE",
    "address_of",
    "said_retry",
]

# RedisUnavailable.reason values.
AUTH = "auth"  # the server refused the username or password, or wants one
PERMISSION = "permission"  # an ACL user may not run the command
REFUSED = "refused"  # nothing listens at the address
TIMEOUT = "timeout"  # no answer within the socket timeout
UNREACHABLE = "unreachable"  # another connection failure (DNS, reset, ...)
ERROR = "error"  # the server answered with an error
# Not called: a call timed out lately and the circuit breaker fails calls fast
# for a short window (io/breaker.py).
BREAKER_OPEN = "breaker_open"
# Every value, in the order the docs list them.
REASONS = (AUTH, PERMISSION, REFUSED, TIMEOUT, BREAKER_OPEN, UNREACHABLE, ERROR)

_NOT_LISTENING = (errno.ECONNREFUSED, errno.ENOENT)


def address_of(client: AnyRedisClient) -> str | None:
    """``host:port`` or the unix socket path a client connects to, if it says."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if not isinstance(kwargs, dict):
        return None
    if kwargs.get("path"):
        return str(kwargs["path"])
    host, port = kwargs.get("host"), kwargs.get("port")
    if host is None:
        return None
    return f"{host}:{port}" if port is not None else str(host)


def _refused(exc: BaseException) -> bool:
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.errno in _NOT_LISTENING:
            return True
        cause = cause.__cause__ or cause.__context__
    text = str(exc)
    return "Connection refused" in text or "No such file or directory" in text


# Error replies of a server that wants a password it did not get (Redis 7 refuses
# an unauthenticated client's long commands with the last one).
_AUTH_REPLIES = ("NOAUTH", "WRONGPASS", "Protocol error: unauthenticated")


# Replies by which a Cluster says that a command did not run and may run if
# sent again soon: TRYAGAIN (a command on several keys of a slot being
# migrated) and CLUSTERDOWN (some slot has no primary: a failover under way;
# MASTERDOWN, a replica cut off from its primary, is one of them). Not an
# error of the command: the lock's node cannot serve it for now.
_RETRY_LATER = (TryAgainError, ClusterDownError)


def said_retry(exc: object) -> bool:
    """Whether ``exc`` is (or a ``RedisUnavailable`` raised from) a reply by
    which Redis says that the command did not run, and may if sent again."""
    seen: set[int] = set()
    while isinstance(exc, Exception) and id(exc) not in seen:
        if isinstance(exc, _RETRY_LATER):
            return True
        seen.add(id(exc))
        exc = exc.__cause__
    return False


def reason_of(exc: BaseException) -> str:
    if isinstance(exc, BreakerOpen):
        return BREAKER_OPEN
    if isinstance(exc, AuthenticationError) or (
        isinstance(exc, ResponseError) and str(exc).startswith(_AUTH_REPLIES)
    ):
        return AUTH
    if isinstance(exc, NoPermissionError):
        return PERMISSION
    if isinstance(exc, (RedisTimeoutError, TimeoutError)):
        return TIMEOUT
    if isinstance(exc, RedisConnectionError):
        return REFUSED if _refused(exc) else UNREACHABLE
    if isinstance(exc, (*_RETRY_LATER, RedisClusterException)):
        # The Cluster cannot reach the lock's data for now (or no startup
        # node answers): unreachable, not an error of the command.
        return UNREACHABLE
    return ERROR


def unavailable(doing: str, exc: BaseException, address: str | None) -> RedisUnavailable:
    """The ``RedisUnavailable`` for ``exc``, raised while ``doing`` (e.g. "running acquire")."""
    reason = reason_of(exc)
    at = f" at {address}" if address else ""
    # redis-py's messages end without a full stop; the advice that follows is a sentence.
    said = f"{exc}".rstrip() + ("" if f"{exc}".rstrip().endswith((".", "!", "?")) else ".")
    if reason == AUTH:
        text = (
            f"Redis{at} did not accept the client's username and password {doing}: {said} "
            "Check the credentials the client uses (with Django: user:password in the "
            "LOCATION URL, or in CACHES' OPTIONS: PASSWORD for django-redis, username and "
            "password for Django's RedisCache)."
        )
    elif reason == PERMISSION:
        text = (
            f"Redis{at} does not let this user {doing.replace('running', 'run')}: {said} "
            "Check the ACL rules of the user the client logs in as."
        )
    elif reason == REFUSED:
        text = (
            f"Redis{at} refused the connection {doing}: {said} "
            f"Is Redis running at {address or 'the configured address'}?"
        )
    elif reason == TIMEOUT:
        text = (
            f"Redis{at} did not answer in time {doing}: {said} It may be overloaded, paused "
            "or behind a firewall that drops packets; SOCKET_TIMEOUT and CONNECT_TIMEOUT "
            "bound the wait."
        )
    elif reason == BREAKER_OPEN:
        text = (
            f"Redis{at} was not called {doing}: {said} It did not answer within the socket "
            "timeout; failing fast spares the caller that wait. BREAKER_WINDOW sets how "
            "long (0 turns this off)."
        )
    elif isinstance(exc, ClusterDownError):
        text = (
            f"Redis Cluster{at} is down {doing}: {said} Some hash slot has no primary: a "
            "failover is under way (calls succeed again once a replica is promoted, "
            "within about twice cluster-node-timeout), or a shard lost every node."
        )
    elif isinstance(exc, TryAgainError):
        text = (
            f"Redis Cluster{at} is moving the lock's hash slot to another node {doing}: "
            f"{said} Calls succeed again once the slot's keys have moved."
        )
    elif reason == UNREACHABLE:
        text = f"Redis{at} could not be reached {doing}: {exc}"
    else:
        text = f"Redis{at} answered with an error {doing}: {exc}"
    error = RedisUnavailable(text)
    error.reason = reason
    error.address = address
    return error
