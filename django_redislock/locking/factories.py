"""Lock and semaphore handles configured from ``REDISLOCK``: the Django face of the core.

What a factory takes besides the name is written once, in ``SemaphoreKwargs``
and ``LockKwargs``, and turned into the core's arguments once, by
``_semaphore_settings`` and ``_lock_settings``: a sync factory and its asyncio
twin differ only in the class they build and the client they give it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypedDict, cast

from ..conf import conf
from ..connection import check_eviction, get_async_client, get_client
from ..core import (
    AsyncLock,
    AsyncMultiLock,
    AsyncReadWriteLock,
    AsyncSemaphore,
    KeySpace,
    Lock,
    Mode,
    MultiLock,
    ReadWriteLock,
    Semaphore,
    check_mode,
    check_replicas,
    check_seconds,
    lock_names,
)
from ..signals import observer

if TYPE_CHECKING:
    from typing_extensions import Unpack


class SemaphoreKwargs(TypedDict, total=False):
    """What every factory takes after the name; each one left out (or None) comes from
    ``REDISLOCK``."""

    #: Lease seconds: ``REDISLOCK['TIMEOUT']`` for a lock, ``['PERMIT_TIMEOUT']`` for a permit.
    timeout: float | None
    #: Seconds to wait while busy (0 tries once): ``REDISLOCK['WAIT']``.
    wait: float | None
    #: Shown beside the lock by ``manage.py redislocks list`` and the admin page.
    label: str
    #: The ``CACHES`` entry: ``REDISLOCK['CACHE']``.
    alias: str | None
    #: Labels it in metrics (``docs/metrics.rst``): a name shared by every lock
    #: of one kind, such as ``"purchase"``; without it, "other".
    metric_name: str | None


class LockKwargs(SemaphoreKwargs, total=False):
    """What the lock factories take besides ``SemaphoreKwargs``."""

    #: Renew the lease from a watchdog: ``REDISLOCK['RENEW']``.
    renew: bool | None
    #: Renew for at most this many seconds: ``REDISLOCK['RENEW_MAX']``.
    renew_max: float | None
    #: Called with the handle when its lease is lost.
    on_lost: Callable[[Any], None] | None
    #: Replicas that must acknowledge a new lease: ``REDISLOCK['REPLICAS']``.
    replicas: int | None
    #: Seconds to wait for them: ``REDISLOCK['REPLICAS_TIMEOUT']``.
    replicas_timeout: float | None


# ("lock" or "semaphore", name) -> longest wait (seconds) for calls on that
# name. Set only by django_redislock.testing while a test holds the name, so
# that the code under test finds it busy at once, whatever wait it asked for.
_wait_caps: dict[tuple[str, str], float] = {}


def cap_wait(kind: str, name: str, seconds: float | None) -> None:
    """Cap the wait of every call on ``(kind, name)`` at ``seconds``; None lifts the cap.

    ``kind`` is ``"lock"`` or ``"semaphore"``. For ``django_redislock.testing``,
    which holds names the code under test must find busy at once.
    """
    if seconds is None:
        _wait_caps.pop((kind, name), None)
    else:
        _wait_caps[(kind, name)] = seconds


def _wait(kind: str, names: tuple[str, ...], wait: float | None) -> float:
    chosen = conf.WAIT if wait is None else wait
    # A name a test holds caps the wait of every handle that includes it.
    caps = [cap for cap in (_wait_caps.get((kind, name)) for name in names) if cap is not None]
    return min([chosen, *caps])


def keyspace() -> KeySpace:
    """The KeySpace of ``REDISLOCK['PREFIX']``, shared with the core's per prefix."""
    return KeySpace.default(conf.PREFIX)


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def _refuse_bad(factory: str, given: dict[str, Any], known: type) -> None:
    unknown = sorted(given.keys() - known.__annotations__.keys())
    if unknown:
        # What Python says of a keyword that a signature does not name.
        raise TypeError(f"{factory}() got an unexpected keyword argument {unknown[0]!r}")
    # The factories are an edge of their own: checked here, so that the error
    # names the factory's own argument (``timeout``, where the handle says
    # ``ttl``); settings are the checks'. ``lock_for`` takes arguments its
    # callers checked at decoration, and does not check them again.
    try:
        for key, allow_zero in _SECONDS:
            if given.get(key) is not None:
                check_seconds(key, given[key], allow_zero=allow_zero)
        if given.get("replicas") is not None:
            check_replicas(given["replicas"])
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{factory}(): {exc}") from None


_SECONDS = (("timeout", False), ("wait", True), ("renew_max", False), ("replicas_timeout", False))


def _semaphore_settings(name: str, given: SemaphoreKwargs) -> dict[str, Any]:
    """The core's arguments for a permit of ``name``: the caller's (checked), then
    ``REDISLOCK``'s."""
    return {
        "ttl": _or(given.get("timeout"), conf.PERMIT_TIMEOUT),
        "wait": _wait("semaphore", (name,), given.get("wait")),
        "label": given.get("label", ""),
        "keyspace": keyspace(),
        "observer": observer,
        "replicas": conf.REPLICAS,
        "replicas_timeout": conf.REPLICAS_TIMEOUT,
    }


def _lock_settings(names: tuple[str, ...], given: LockKwargs) -> dict[str, Any]:
    """The core's arguments for a lock on ``names``: the caller's (checked), then
    ``REDISLOCK``'s. The lease is ``timeout`` up to here, and the core's ``ttl`` from here."""
    return {
        "ttl": _or(given.get("timeout"), conf.TIMEOUT),
        "wait": _wait("lock", names, given.get("wait")),
        "renew": _or(given.get("renew"), conf.RENEW),
        "renew_max": _or(given.get("renew_max"), conf.RENEW_MAX),
        "label": given.get("label", ""),
        "on_lost": given.get("on_lost"),
        "keyspace": keyspace(),
        "observer": observer,
        "replicas": _or(given.get("replicas"), conf.REPLICAS),
        "replicas_timeout": _or(given.get("replicas_timeout"), conf.REPLICAS_TIMEOUT),
    }


def _client(given: SemaphoreKwargs, asynchronous: bool) -> Any:
    client = get_client(given.get("alias"))
    # On the sync client even for an asyncio handle (the check runs in a
    # thread of its own): an ASGI site that only throttles would otherwise
    # never be warned.
    check_eviction(client)
    return get_async_client(given.get("alias")) if asynchronous else client


def _labelled(handle: Any, given: SemaphoreKwargs) -> Any:
    handle.metric_name = given.get("metric_name")
    return handle


def _lock(name: str, fair: bool, given: LockKwargs, asynchronous: bool) -> Any:
    settings = _lock_settings((name,), given)
    cls = AsyncLock if asynchronous else Lock
    return _labelled(cls(_client(given, asynchronous), name, fair=fair, **settings), given)


def _multi_lock(names: tuple[str, ...], given: LockKwargs, asynchronous: bool) -> Any:
    settings = _lock_settings(names, given)
    cls = AsyncMultiLock if asynchronous else MultiLock
    client = _client(given, asynchronous)
    return cls(client, names, metric_name=given.get("metric_name"), **settings)


def _rw_lock(name: str, mode: Mode, given: LockKwargs, asynchronous: bool) -> Any:
    settings = _lock_settings((name,), given)
    cls = AsyncReadWriteLock if asynchronous else ReadWriteLock
    return _labelled(cls(_client(given, asynchronous), name, mode, **settings), given)


def get_lock(name: str, *, fair: bool = True, **kwargs: Unpack[LockKwargs]) -> Lock:
    """A ``Lock`` on ``name`` with defaults from ``REDISLOCK`` and Django signals.

    ``kwargs``: ``LockKwargs``. ``fair=False``: the barging order (``docs/locks.rst``).
    """
    _refuse_bad("get_lock", dict(kwargs), LockKwargs)
    return cast(Lock, _lock(name, fair, kwargs, asynchronous=False))


def get_async_lock(name: str, *, fair: bool = True, **kwargs: Unpack[LockKwargs]) -> AsyncLock:
    """An ``AsyncLock`` for the running event loop, configured as ``get_lock``."""
    _refuse_bad("get_async_lock", dict(kwargs), LockKwargs)
    return cast(AsyncLock, _lock(name, fair, kwargs, asynchronous=True))


def get_multi_lock(names: Iterable[str], **kwargs: Unpack[LockKwargs]) -> MultiLock:
    """A ``MultiLock`` on ``names`` (all held or none), configured as ``get_lock``."""
    ordered = lock_names(names)
    _refuse_bad("get_multi_lock", dict(kwargs), LockKwargs)
    return cast(MultiLock, _multi_lock(ordered, kwargs, asynchronous=False))


def get_async_multi_lock(names: Iterable[str], **kwargs: Unpack[LockKwargs]) -> AsyncMultiLock:
    """An ``AsyncMultiLock`` for the running event loop, configured as ``get_lock``."""
    ordered = lock_names(names)
    _refuse_bad("get_async_multi_lock", dict(kwargs), LockKwargs)
    return cast(AsyncMultiLock, _multi_lock(ordered, kwargs, asynchronous=True))


def _semaphore(name: str, limit: int, given: SemaphoreKwargs, asynchronous: bool) -> Any:
    settings = _semaphore_settings(name, given)
    cls = AsyncSemaphore if asynchronous else Semaphore
    return _labelled(cls(_client(given, asynchronous), name, limit, **settings), given)


def get_semaphore(name: str, limit: int, **kwargs: Unpack[SemaphoreKwargs]) -> Semaphore:
    """A ``Semaphore`` of ``limit`` permits on ``name``, configured as ``get_lock``
    (``kwargs``: ``SemaphoreKwargs``); a permit lasts ``timeout`` seconds (default
    ``REDISLOCK['PERMIT_TIMEOUT']``)."""
    _refuse_bad("get_semaphore", dict(kwargs), SemaphoreKwargs)
    return cast(Semaphore, _semaphore(name, limit, kwargs, asynchronous=False))


def get_async_semaphore(name: str, limit: int, **kwargs: Unpack[SemaphoreKwargs]) -> AsyncSemaphore:
    """An ``AsyncSemaphore`` for the running event loop, configured as ``get_semaphore``."""
    _refuse_bad("get_async_semaphore", dict(kwargs), SemaphoreKwargs)
    return cast(AsyncSemaphore, _semaphore(name, limit, kwargs, asynchronous=True))


def semaphore_for(
    name: str, limit: int, *, asynchronous: bool, **kwargs: Unpack[SemaphoreKwargs]
) -> Any:
    """The semaphore of a throttling rule: ``get_semaphore`` (``get_async_semaphore``)
    with arguments checked once, when the rule was read, and not at every request."""
    return _semaphore(name, limit, kwargs, asynchronous)


def get_rw_lock(name: str, mode: Mode, **kwargs: Unpack[LockKwargs]) -> ReadWriteLock:
    """A ``ReadWriteLock`` on ``name`` in ``mode`` (``"read"`` or ``"write"``),
    configured as ``get_lock``. Its keys are not the lock's: a read-write lock
    and a ``Lock`` of the same name do not exclude each other."""
    _refuse_bad("get_rw_lock", dict(kwargs), LockKwargs)
    return cast(ReadWriteLock, _rw_lock(name, mode, kwargs, asynchronous=False))


def get_async_rw_lock(name: str, mode: Mode, **kwargs: Unpack[LockKwargs]) -> AsyncReadWriteLock:
    """An ``AsyncReadWriteLock`` for the running event loop, configured as ``get_rw_lock``."""
    _refuse_bad("get_async_rw_lock", dict(kwargs), LockKwargs)
    return cast(AsyncReadWriteLock, _rw_lock(name, mode, kwargs, asynchronous=True))


def lock_for(
    names: str | tuple[str, ...], mode: str | None, *, asynchronous: bool, **kwargs: Any
) -> Any:
    """The handle ``redis_lock`` and ``redis_locked`` take on ``names``: a
    read-write lock in ``mode``, else a lock on one name or all of several.

    ``kwargs`` were checked once, where they were given (``options.lock_options``,
    at decoration): they are not checked again at every call, as the public
    factories check theirs.
    """
    fair = kwargs.pop("fair", True)
    given = cast(LockKwargs, kwargs)
    if mode is not None and isinstance(names, str):
        return _rw_lock(names, check_mode(mode), given, asynchronous)
    if isinstance(names, str):
        return _lock(names, fair, given, asynchronous)
    return _multi_lock(names, given, asynchronous)
