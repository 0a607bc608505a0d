"""Redis clients for the library, built from a ``CACHES`` alias.

The alias is a django-redis cache or Django's own ``RedisCache``; either way
the library reads the connection parameters of its first server (the one both
write to) and never uses the cache itself.

The cache's own client may have no socket timeout (redis-py's default) and its
own retry policy. Lock calls must be bounded (DESIGN invariant 8), so the
library builds a client of its own from the same connection parameters, with
``SOCKET_TIMEOUT``/``CONNECT_TIMEOUT`` from ``REDISLOCK`` and one retry on a
broken pooled connection. Its pool is of the cache pool's kind (blocking or
not) and has its ``max_connections``: a pool of its own, never a larger one.
Sentinel pools are rebuilt as Sentinel pools, so failover keeps working.
``REDISLOCK['CLIENT']`` (a dotted path to a callable returning a client)
replaces all of this, for Redis Cluster and other setups.

Async code gets a ``redis.asyncio`` client derived from the same parameters,
one per event loop (an asyncio connection belongs to the loop that made it).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import weakref
from typing import Any, cast

import redis
import redis.asyncio
from django.conf import settings
from django.utils.module_loading import import_string

from .conf import cache_backend, cache_locations, conf
from .core import (
    DEFAULT_BREAKER_WINDOW,
    AsyncRedisClient,
    RedisClient,
    set_breaker_window,
    this_process,
)
from .retrying import RETRIED, BoundedAsyncRetry, bounded_retry

__all__ = ["get_async_client", "get_client", "reset"]

logger = logging.getLogger("django_redislock.connection")

_lock = threading.Lock()
_clients: dict[tuple[str, int, float, float], Any] = {}
_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Any, Any]] = (
    weakref.WeakKeyDictionary()
)
_eviction_checks: dict[int, threading.Thread] = {}


def _breaker_window() -> float:
    """``BREAKER_WINDOW``, read at each opening of a breaker (so that
    ``override_settings`` applies at once). Not before Django has loaded its
    settings: a process that uses the core alone keeps the core's default,
    and a call that just timed out never waits for the settings to load."""
    if not settings.configured:
        return DEFAULT_BREAKER_WINDOW
    return conf.BREAKER_WINDOW


set_breaker_window(_breaker_window)

# The asyncio twin of each sync connection class.
_SYNC_TO_ASYNC = {
    redis.connection.Connection: redis.asyncio.connection.Connection,
    redis.connection.UnixDomainSocketConnection: (
        redis.asyncio.connection.UnixDomainSocketConnection
    ),
    redis.connection.SSLConnection: redis.asyncio.connection.SSLConnection,
}
# What identifies the server and the credentials; internals of a sync pool
# (maintenance-notification state, OCSP contexts, parsers) are not carried over.
_ASYNC_KEEP = {
    "host",
    "port",
    "path",
    "db",
    "username",
    "password",
    "credential_provider",
    "client_name",
    "lib_name",
    "lib_version",
    "socket_keepalive",
    "socket_keepalive_options",
    "socket_timeout",
    "socket_connect_timeout",
    "ssl_keyfile",
    "ssl_certfile",
    "ssl_cert_reqs",
    "ssl_ca_certs",
    "ssl_ca_data",
    "ssl_check_hostname",
    "ssl_min_version",
    "ssl_ciphers",
}


def _cache_client(alias: str) -> Any:
    """A client whose pool holds the connection parameters of ``alias``'s primary.

    It is only read (its pool's class and kwargs), never used: a pool connects
    on first use.
    """
    cache = getattr(settings, "CACHES", {}).get(alias)
    if isinstance(cache, dict) and cache_backend(cache) == "django":
        return _django_cache_client(cache)
    from django_redis import get_redis_connection

    return get_redis_connection(alias)


def _django_cache_client(cache: dict[str, Any]) -> redis.Redis:
    """What Django's ``RedisCache`` would connect to for a write, built as it builds it.

    Its ``RedisCacheClient`` passes OPTIONS (but ``serializer``) to
    ``pool_class.from_url`` of the first LOCATION, and reads from the others,
    its replicas: a lock is a write, so only the first counts. Built from the
    settings, not through the cache object, whose client is private to Django.
    """
    options = dict(cache.get("OPTIONS") or {})
    options.pop("serializer", None)
    pool_class = options.pop("pool_class", None) or redis.ConnectionPool
    if isinstance(pool_class, str):
        pool_class = import_string(pool_class)
    if isinstance(options.get("parser_class"), str):
        options["parser_class"] = import_string(options["parser_class"])
    # Not a str: redis-py's from_url says what is wrong, as the cache's would (E011).
    pool = pool_class.from_url(cache_locations(cache)[0], **options)  # type: ignore[arg-type]
    return redis.Redis(connection_pool=pool)


def _user_client(path_or_callable: Any, *, asyncio_client: bool) -> Any:
    factory = (
        import_string(path_or_callable) if isinstance(path_or_callable, str) else path_or_callable
    )
    return factory(asyncio=asyncio_client)


def _bounded_kwargs(pool: Any) -> dict[str, Any]:
    kwargs = dict(pool.connection_kwargs)
    kwargs["socket_timeout"] = conf.SOCKET_TIMEOUT
    kwargs["socket_connect_timeout"] = conf.CONNECT_TIMEOUT
    kwargs["retry"] = bounded_retry()
    # redis-py 5.0 (unlike 8) retries only errors also listed here, whatever the Retry says.
    kwargs["retry_on_error"] = list(RETRIED)
    kwargs.pop("retry_on_timeout", None)
    # The library reads raw bytes; decoding is done where needed.
    kwargs["decode_responses"] = False
    return kwargs


def _sentinel(manager: Any, kind: Any) -> Any:
    """A Sentinel manager (of ``kind``) for ``manager``'s sentinels, asking them with bounds.

    The cache's own manager asks the sentinels with whatever timeouts the
    cache had (none, by default): a blackholed sentinel would hang a lock call.
    """
    addresses = [
        (
            c.connection_pool.connection_kwargs.get("host"),
            c.connection_pool.connection_kwargs.get("port"),
        )
        for c in manager.sentinels
    ]
    kwargs = dict(manager.sentinel_kwargs or {})
    kwargs["socket_timeout"] = conf.SOCKET_TIMEOUT
    kwargs["socket_connect_timeout"] = conf.CONNECT_TIMEOUT
    return kind(addresses, min_other_sentinels=manager.min_other_sentinels, sentinel_kwargs=kwargs)


def _pool_like(pool: Any, blocking: Any, plain: Any, connection_class: Any, **kwargs: Any) -> Any:
    """A pool of ``pool``'s kind (blocking or not) and size: of its own, never larger."""
    if isinstance(pool, redis.BlockingConnectionPool):
        return blocking(
            connection_class=connection_class,
            max_connections=pool.max_connections,
            timeout=pool.timeout,
            **kwargs,
        )
    return plain(connection_class=connection_class, max_connections=pool.max_connections, **kwargs)


def _build_sync(alias: str) -> Any:
    base = _cache_client(alias)
    pool = base.connection_pool
    kwargs = _bounded_kwargs(pool)
    from redis.sentinel import SentinelConnectionPool

    if isinstance(pool, SentinelConnectionPool):
        from redis.sentinel import Sentinel as SyncSentinel

        kwargs.pop("connection_pool", None)
        manager = _sentinel(pool.sentinel_manager, SyncSentinel)
        new_pool: Any = SentinelConnectionPool(
            pool.service_name, manager, max_connections=pool.max_connections, **kwargs
        )
    else:
        new_pool = _pool_like(
            pool,
            redis.BlockingConnectionPool,
            redis.ConnectionPool,
            pool.connection_class,
            **kwargs,
        )
    return redis.Redis(connection_pool=new_pool)


def check_eviction(client: RedisClient) -> threading.Thread | None:
    """Check Redis's eviction policy once per client, off the caller's path.

    It is one more bounded call, and against a stalled Redis the first lock a
    request takes must not pay for it twice. Returns the checking thread the
    first time (tests join it), None after.
    """
    if id(client) in _eviction_checks:
        return None  # checked: every call after the first, without the lock
    with _lock:
        if id(client) in _eviction_checks:
            return None
        thread = threading.Thread(
            target=_warn_eviction, args=(client,), name="redislock-eviction-check", daemon=True
        )
        _eviction_checks[id(client)] = thread
    thread.start()
    return thread


def _warn_eviction(client: RedisClient) -> None:
    """Log if Redis may evict lock keys under memory pressure."""
    try:
        policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
    except Exception:  # CONFIG is often disabled on managed Redis: nothing to say
        return
    if isinstance(policy, bytes):
        policy = policy.decode()
    if policy and policy != "noeviction":
        logger.warning(
            "Redis maxmemory-policy is %r: under memory pressure Redis may evict lock "
            "keys, and a lock would silently be free. Use 'noeviction' (or a Redis "
            "of its own for locks).",
            policy,
        )


def _new_client(alias: str, *, asyncio_client: bool) -> Any:
    """The project's own (``REDISLOCK['CLIENT']``), else one built from ``CACHES[alias]``."""
    if conf.CLIENT is not None:
        return _user_client(conf.CLIENT, asyncio_client=asyncio_client)
    return _build_async(alias) if asyncio_client else _build_sync(alias)


def get_client(alias: str | None = None) -> RedisClient:
    """The library's sync client for ``alias`` (default ``REDISLOCK['CACHE']``)."""
    alias = alias or conf.CACHE
    key = (alias, this_process.pid, conf.SOCKET_TIMEOUT, conf.CONNECT_TIMEOUT)
    client = _clients.get(key)
    if client is None:
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = _new_client(alias, asyncio_client=False)
    return client


def _build_async(alias: str) -> Any:
    # Without CLIENT (the only case that gets here) the sync client is _build_sync's.
    sync_pool = cast(redis.Redis, get_client(alias)).connection_pool
    from redis.sentinel import SentinelConnectionPool

    kwargs = {k: v for k, v in sync_pool.connection_kwargs.items() if k in _ASYNC_KEEP}
    kwargs["retry"] = bounded_retry(BoundedAsyncRetry)
    kwargs["retry_on_error"] = list(RETRIED)
    if isinstance(sync_pool, SentinelConnectionPool):
        from redis.asyncio.sentinel import Sentinel

        sentinel = _sentinel(sync_pool.sentinel_manager, Sentinel)
        return sentinel.master_for(
            sync_pool.service_name, max_connections=sync_pool.max_connections, **kwargs
        )
    connection_class = _SYNC_TO_ASYNC.get(sync_pool.connection_class)
    if connection_class is None:
        raise TypeError(
            f"no asyncio counterpart for {sync_pool.connection_class!r}: set "
            "REDISLOCK['CLIENT'] to a factory that accepts asyncio=True"
        )
    pool = _pool_like(
        sync_pool,
        redis.asyncio.BlockingConnectionPool,
        redis.asyncio.ConnectionPool,
        connection_class,
        **kwargs,
    )
    return redis.asyncio.Redis(connection_pool=pool)


async def _aclose(client: Any) -> None:
    """Close an asyncio client and the sockets of its pool.

    A client built on a pool we passed in does not close that pool by
    default, so its sockets would stay open; but a Cluster client's
    ``aclose()`` takes no such argument (it closes every node's pool).
    """
    try:
        parameters = inspect.signature(client.aclose).parameters
    except (TypeError, ValueError):
        parameters = {}  # type: ignore[assignment]
    if "close_connection_pool" in parameters:
        await client.aclose(close_connection_pool=True)
    else:
        await client.aclose()


def _close_with_loop(client: Any) -> Any:
    """Close ``client`` when its event loop shuts down; returns what must be kept.

    A loop can be short-lived (an async view under WSGI runs in a loop of its
    own per request): its client would leak open sockets. asyncio has no
    loop-close hook, but ``asyncio.run`` (and asgiref, uvicorn, test loops)
    finalise the loop's async generators on shutdown: a suspended generator
    whose ``finally`` closes the client is exactly that hook.
    """

    async def closer() -> Any:
        try:
            yield
        finally:
            try:
                await _aclose(client)
            except Exception:
                logger.debug("closing an asyncio client at loop shutdown failed", exc_info=True)

    agen = closer()
    # Step it to its yield by hand (registers it with the running loop).
    with contextlib.suppress(StopIteration):
        agen.asend(None).send(None)
    return agen  # the loop holds async generators weakly: keep a reference


def get_async_client(alias: str | None = None) -> AsyncRedisClient:
    """The library's ``redis.asyncio`` client for ``alias`` in the running loop."""
    alias = alias or conf.CACHE
    loop = asyncio.get_running_loop()
    per_loop = _async_clients.setdefault(loop, {})
    key = (alias, conf.SOCKET_TIMEOUT, conf.CONNECT_TIMEOUT)
    client = per_loop.get(key)
    if client is None:
        client = per_loop[key] = _new_client(alias, asyncio_client=True)
        per_loop[(key, "closer")] = _close_with_loop(client)
    return client


def reset() -> None:
    """Forget cached clients (tests, or after changing CACHES at run time)."""
    with _lock:
        for client in _clients.values():
            try:
                client.close()
            except Exception:
                logger.debug("closing a cached client failed", exc_info=True)
        _clients.clear()
        _eviction_checks.clear()
    _async_clients.clear()
