"""Lock and semaphore handles configured from ``REDISLOCK``: the Django face of the core."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..conf import conf
from ..connection import check_eviction, get_async_client, get_client
from ..core.drivers.lock import Lock
from ..core.drivers.lock_async import AsyncLock
from ..core.drivers.multi import MultiLock, lock_names
from ..core.drivers.multi_async import AsyncMultiLock
from ..core.drivers.rwlock import Mode, ReadWriteLock
from ..core.drivers.rwlock_async import AsyncReadWriteLock
from ..core.drivers.semaphore import Semaphore
from ..core.drivers.semaphore_async import AsyncSemaphore
from ..core.engine.keys import KeySpace
from ..signals import observer

__all__ = [
    "cap_wait",
    "get_async_lock",
    "get_async_multi_lock",
    "get_async_rw_lock",
    "get_async_semaphore",
    "get_lock",
    "get_multi_lock",
    "get_rw_lock",
    "get_semaphore",
    "keyspace",
]

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


def _wait(kind: str, name: str, wait: float | None) -> float:
    chosen = conf.WAIT if wait is None else wait
    cap = _wait_caps.get((kind, name))
    return chosen if cap is None else min(chosen, cap)


def keyspace() -> KeySpace:
    """The KeySpace of ``REDISLOCK['PREFIX']``, shared with the core's per prefix."""
    return KeySpace.default(conf.PREFIX)


def _options(
    name: str,
    timeout: float | None,
    wait: float | None,
    renew: bool | None,
    renew_max: float | None,
    label: str,
    on_lost: Callable[[Any], None] | None,
    replicas: int | None,
    replicas_timeout: float | None,
) -> dict[str, Any]:
    return {
        "ttl": conf.TIMEOUT if timeout is None else timeout,
        "wait": _wait("lock", name, wait),
        "renew": conf.RENEW if renew is None else renew,
        "renew_max": conf.RENEW_MAX if renew_max is None else renew_max,
        "label": label,
        "on_lost": on_lost,
        "keyspace": keyspace(),
        "observer": observer,
        "replicas": conf.REPLICAS if replicas is None else replicas,
        "replicas_timeout": (
            conf.REPLICAS_TIMEOUT if replicas_timeout is None else replicas_timeout
        ),
    }


def get_lock(
    name: str,
    *,
    timeout: float | None = None,
    wait: float | None = None,
    renew: bool | None = None,
    renew_max: float | None = None,
    label: str = "",
    alias: str | None = None,
    on_lost: Callable[[Any], None] | None = None,
    replicas: int | None = None,
    replicas_timeout: float | None = None,
    metric_name: str | None = None,
    fair: bool = True,
) -> Lock:
    """A ``Lock`` on ``name`` with defaults from ``REDISLOCK`` and Django signals.

    ``metric_name`` labels it in metrics (``docs/metrics.rst``): a name shared
    by every lock of one kind, such as ``"purchase"``; without it, "other".
    ``fair=False``: the barging order (``docs/locks.rst``).
    """
    client = get_client(alias)
    check_eviction(client)
    lock = Lock(
        client,
        name,
        fair=fair,
        **_options(
            name, timeout, wait, renew, renew_max, label, on_lost, replicas, replicas_timeout
        ),
    )
    lock.metric_name = metric_name
    return lock


def get_async_lock(
    name: str,
    *,
    timeout: float | None = None,
    wait: float | None = None,
    renew: bool | None = None,
    renew_max: float | None = None,
    label: str = "",
    alias: str | None = None,
    on_lost: Callable[[Any], None] | None = None,
    replicas: int | None = None,
    replicas_timeout: float | None = None,
    metric_name: str | None = None,
    fair: bool = True,
) -> AsyncLock:
    """An ``AsyncLock`` for the running event loop, configured as ``get_lock``."""
    check_eviction(get_client(alias))  # on the sync twin, as get_async_semaphore does
    client = get_async_client(alias)
    lock = AsyncLock(
        client,
        name,
        fair=fair,
        **_options(
            name, timeout, wait, renew, renew_max, label, on_lost, replicas, replicas_timeout
        ),
    )
    lock.metric_name = metric_name
    return lock


def _multi_options(names: tuple[str, ...], wait: float | None, **rest: Any) -> dict[str, Any]:
    options = _options(names[0], wait=wait, **rest)
    # A name a test holds caps the wait of every lock that includes it.
    options["wait"] = min(_wait("lock", name, wait) for name in names)
    return options


def get_multi_lock(
    names: Iterable[str],
    *,
    timeout: float | None = None,
    wait: float | None = None,
    renew: bool | None = None,
    renew_max: float | None = None,
    label: str = "",
    alias: str | None = None,
    on_lost: Callable[[Any], None] | None = None,
    replicas: int | None = None,
    replicas_timeout: float | None = None,
    metric_name: str | None = None,
) -> MultiLock:
    """A ``MultiLock`` on ``names`` (all held or none), configured as ``get_lock``."""
    ordered = lock_names(names)
    client = get_client(alias)
    check_eviction(client)
    return MultiLock(
        client,
        ordered,
        metric_name=metric_name,
        **_multi_options(
            ordered,
            wait,
            timeout=timeout,
            renew=renew,
            renew_max=renew_max,
            label=label,
            on_lost=on_lost,
            replicas=replicas,
            replicas_timeout=replicas_timeout,
        ),
    )


def get_async_multi_lock(
    names: Iterable[str],
    *,
    timeout: float | None = None,
    wait: float | None = None,
    renew: bool | None = None,
    renew_max: float | None = None,
    label: str = "",
    alias: str | None = None,
    on_lost: Callable[[Any], None] | None = None,
    replicas: int | None = None,
    replicas_timeout: float | None = None,
    metric_name: str | None = None,
) -> AsyncMultiLock:
    """An ``AsyncMultiLock`` for the running event loop, configured as ``get_lock``."""
    check_eviction(get_client(alias))
    ordered = lock_names(names)
    return AsyncMultiLock(
        get_async_client(alias),
        ordered,
        metric_name=metric_name,
        **_multi_options(
            ordered,
            wait,
            timeout=timeout,
            renew=renew,
            renew_max=renew_max,
            label=label,
            on_lost=on_lost,
            replicas=replicas,
            replicas_timeout=replicas_timeout,
        ),
    )


def _semaphore_options(
    name: str, timeout: float | None, wait: float | None, label: str
) -> dict[str, Any]:
    return {
        "ttl": conf.PERMIT_TIMEOUT if timeout is None else timeout,
        "wait": _wait("semaphore", name, wait),
        "label": label,
        "keyspace": keyspace(),
        "observer": observer,
        "replicas": conf.REPLICAS,
        "replicas_timeout": conf.REPLICAS_TIMEOUT,
    }


def get_semaphore(
    name: str,
    limit: int,
    *,
    timeout: float | None = None,
    wait: float | None = None,
    label: str = "",
    alias: str | None = None,
    metric_name: str | None = None,
) -> Semaphore:
    """A ``Semaphore`` of ``limit`` permits on ``name``, configured as ``get_lock``
    (``metric_name`` included); a permit lasts ``timeout`` seconds (default
    ``REDISLOCK['PERMIT_TIMEOUT']``)."""
    client = get_client(alias)
    check_eviction(client)
    sem = Semaphore(client, name, limit, **_semaphore_options(name, timeout, wait, label))
    sem.metric_name = metric_name
    return sem


def get_async_semaphore(
    name: str,
    limit: int,
    *,
    timeout: float | None = None,
    wait: float | None = None,
    label: str = "",
    alias: str | None = None,
    metric_name: str | None = None,
) -> AsyncSemaphore:
    """An ``AsyncSemaphore`` for the running event loop, configured as ``get_semaphore``."""
    # The check runs on the sync twin of the client, in a thread of its own:
    # an ASGI site that only throttles would otherwise never be warned.
    check_eviction(get_client(alias))
    client = get_async_client(alias)
    sem = AsyncSemaphore(client, name, limit, **_semaphore_options(name, timeout, wait, label))
    sem.metric_name = metric_name
    return sem


def get_rw_lock(
    name: str,
    mode: Mode,
    *,
    timeout: float | None = None,
    wait: float | None = None,
    renew: bool | None = None,
    renew_max: float | None = None,
    label: str = "",
    alias: str | None = None,
    on_lost: Callable[[Any], None] | None = None,
    replicas: int | None = None,
    replicas_timeout: float | None = None,
    metric_name: str | None = None,
) -> ReadWriteLock:
    """A ``ReadWriteLock`` on ``name`` in ``mode`` (``"read"`` or ``"write"``),
    configured as ``get_lock``. Its keys are not the lock's: a read-write lock
    and a ``Lock`` of the same name do not exclude each other."""
    client = get_client(alias)
    check_eviction(client)
    lock = ReadWriteLock(
        client,
        name,
        mode,
        **_options(
            name, timeout, wait, renew, renew_max, label, on_lost, replicas, replicas_timeout
        ),
    )
    lock.metric_name = metric_name
    return lock


def get_async_rw_lock(
    name: str,
    mode: Mode,
    *,
    timeout: float | None = None,
    wait: float | None = None,
    renew: bool | None = None,
    renew_max: float | None = None,
    label: str = "",
    alias: str | None = None,
    on_lost: Callable[[Any], None] | None = None,
    replicas: int | None = None,
    replicas_timeout: float | None = None,
    metric_name: str | None = None,
) -> AsyncReadWriteLock:
    """An ``AsyncReadWriteLock`` for the running event loop, configured as ``get_rw_lock``."""
    check_eviction(get_client(alias))
    lock = AsyncReadWriteLock(
        get_async_client(alias),
        name,
        mode,
        **_options(
            name, timeout, wait, renew, renew_max, label, on_lost, replicas, replicas_timeout
        ),
    )
    lock.metric_name = metric_name
    return lock
