"""The ``REDISLOCK`` settings dict, read lazily so ``override_settings`` works.

Each setting is a typed attribute (its default in ``DEFAULTS``); nothing is ever
written onto ``django.conf.settings``. ``checks.py`` validates the dict for
the system checks without touching the network.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

from django.conf import settings as django_settings
from django.core.signals import setting_changed

__all__ = [
    "DEFAULTS",
    "DJANGO_REDIS_CACHE",
    "cache_backend",
    "cache_locations",
    "conf",
]

T = TypeVar("T")

DEFAULTS: dict[str, Any] = {
    # Master switch: when False, decorators and middleware run the code unlocked.
    "ENABLED": True,
    # CACHES alias (django-redis, or Django's own RedisCache) whose connection
    # settings are used.
    "CACHE": "default",
    # Dotted path to a callable returning a redis client (Cluster, custom setups).
    "CLIENT": None,
    "PREFIX": "redislock",
    # Lease length (seconds) and how long to wait for a busy lock (seconds).
    "TIMEOUT": 30.0,
    "WAIT": 10.0,
    # Renew held leases from a watchdog; RENEW_MAX caps the hold (None: no cap).
    "RENEW": False,
    "RENEW_MAX": None,
    # Redis down: locks fail closed (503) unless this is True.
    "FAIL_OPEN": False,
    # Open the database connections a decorated call will use before waiting
    # for its lock, not inside it: True (those its transaction and its earlier
    # calls used), a list of DATABASES aliases, or False. Off by default: each
    # waiter would hold a connection, which a site sized for CONN_MAX_AGE = 0
    # may not have (docs/choosing.rst).
    "CONNECT_EARLY": False,
    # Bounds on every call the library makes (seconds).
    "SOCKET_TIMEOUT": 2.0,
    "CONNECT_TIMEOUT": 1.0,
    # After a call times out, calls to that Redis fail fast for this long
    # (seconds), then one call probes it; 0: off (core/io/breaker.py).
    "BREAKER_WINDOW": 1.0,
    # Busy view: status and optional replacement (dotted path to a view or callable).
    "BUSY_STATUS": 409,
    "BUSY_RESPONSE": None,
    "UNAVAILABLE_RESPONSE": None,
    # Replica acknowledgement of new leases (0: off) and how long to wait for it.
    "REPLICAS": 0,
    "REPLICAS_TIMEOUT": 0.1,
    # Throttling middleware.
    "THROTTLE": [],
    "THROTTLE_FAIL_OPEN": True,
    "THROTTLE_RESPONSE": None,
    "PERMIT_TIMEOUT": 60.0,
    # DRF's ConcurrencyThrottle: throttle_scope -> a limit, or a dict of a
    # THROTTLE rule's limit, per, wait, timeout and retry_after (no matchers:
    # the view's throttle_scope selects its requests).
    "THROTTLE_SCOPES": {},
    # Who the caller is (django_redislock/caller.py): a callable (or dotted
    # path) of the request returning a str naming the caller, or None to
    # let the library answer (the user as the view sees it, else the address).
    "CALLER": None,
    # Headers that carry credentials: a request sending one that no
    # authentication accepts is refused, never counted by its address.
    "CREDENTIAL_HEADERS": ["Authorization", "X-Api-Key"],
    # Who may see and force-release locks in the admin: dotted path to a
    # callable of the user, or None for superusers only.
    "ADMIN_PERMISSION": None,
    # Metrics backends to feed from the lock signals: "prometheus",
    # "opentelemetry". Read when the app loads (and on override_settings).
    "METRICS": [],
    # OpenTelemetry spans also carry each lock's own name (redislock.lock_name),
    # not only its template: off, since every id makes a distinct value.
    "OTEL_LOCK_NAMES": False,
    # Idempotency-Key handling of @idempotent views: a dict of the keys in
    # django_redislock.idempotency.SETTINGS (validated there, E060 to E065).
    "IDEMPOTENCY": {},
    # Unique tasks: how long a queued task that never starts keeps its key (seconds).
    "UNIQUE_TTL": 3600.0,
}


class _Setting(Generic[T]):
    """One ``REDISLOCK`` key, read on each access and converted by ``cast``."""

    def __init__(self, cast: Callable[[Any], T]) -> None:
        self.cast = cast

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = name

    @overload
    def __get__(self, settings: None, owner: type) -> _Setting[T]: ...

    @overload
    def __get__(self, settings: Settings, owner: type) -> T: ...

    def __get__(self, settings: Settings | None, owner: type) -> _Setting[T] | T:
        if settings is None:
            return self
        # Settings.get, inlined: a decorated call reads about fourteen settings.
        raw = settings._raw
        if raw is None:
            raw = settings.raw
        key = self.key
        return self.cast(raw.get(key, DEFAULTS[key]))

    def __set__(self, settings: Settings, value: Any) -> None:
        raise AttributeError(f"{self.key} is read from settings.REDISLOCK")


def _optional_seconds(value: Any) -> float | None:
    return None if value is None else float(value)


def _databases(value: Any) -> bool | tuple[str, ...]:
    return value if isinstance(value, bool) else tuple(value)


def _listed(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else []


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def _handler(value: Any) -> str | Callable[..., Any] | None:
    return value  # a dotted path, a callable, or None


class Settings:
    """Typed, lazy view of ``settings.REDISLOCK``: each key, cast as it is read.

    The dict is looked up once and kept until Django announces a change of
    ``REDISLOCK`` (``setting_changed``: ``override_settings``, pytest-django's
    ``settings`` fixture): a decorated call reads a dozen settings, and a
    project without a ``REDISLOCK`` dict would otherwise pay for a failed
    lookup on Django's lazy settings object at each one. The dict itself is
    not copied, so a change made to it in place is seen at once.
    """

    def __init__(self) -> None:
        self._raw: dict[str, Any] | None = None

    @property
    def raw(self) -> dict[str, Any]:
        found = self._raw
        if found is None:
            value = getattr(django_settings, "REDISLOCK", {})
            found = self._raw = value if isinstance(value, dict) else {}
        return found

    def forget(self) -> None:
        """Look ``settings.REDISLOCK`` up again at the next read."""
        self._raw = None

    def get(self, key: str) -> Any:
        return self.raw.get(key, DEFAULTS[key])

    ENABLED = _Setting(bool)
    CACHE = _Setting(str)
    CLIENT = _Setting(_handler)
    PREFIX = _Setting(str)
    TIMEOUT = _Setting(float)
    WAIT = _Setting(float)
    RENEW = _Setting(bool)
    RENEW_MAX = _Setting(_optional_seconds)
    FAIL_OPEN = _Setting(bool)
    CONNECT_EARLY = _Setting(_databases)
    SOCKET_TIMEOUT = _Setting(float)
    CONNECT_TIMEOUT = _Setting(float)
    BREAKER_WINDOW = _Setting(float)
    BUSY_STATUS = _Setting(int)
    BUSY_RESPONSE = _Setting(_handler)
    UNAVAILABLE_RESPONSE = _Setting(_handler)
    REPLICAS = _Setting(int)
    REPLICAS_TIMEOUT = _Setting(float)
    THROTTLE: _Setting[list[dict[str, Any]]] = _Setting(list)
    THROTTLE_FAIL_OPEN = _Setting(bool)
    THROTTLE_RESPONSE = _Setting(_handler)
    PERMIT_TIMEOUT = _Setting(float)
    THROTTLE_SCOPES = _Setting(_mapping)
    CALLER = _Setting(_handler)
    CREDENTIAL_HEADERS: _Setting[list[str]] = _Setting(_listed)
    ADMIN_PERMISSION = _Setting(_handler)
    METRICS: _Setting[list[str]] = _Setting(_listed)
    OTEL_LOCK_NAMES = _Setting(bool)
    IDEMPOTENCY = _Setting(_mapping)
    UNIQUE_TTL = _Setting(float)


conf = Settings()


def _on_setting_changed(setting: str, **kwargs: Any) -> None:
    if setting == "REDISLOCK":
        conf.forget()


setting_changed.connect(_on_setting_changed, dispatch_uid="django_redislock.conf")


# Django's own Redis cache backend (Django 4.0+). django-redis is any backend
# under ``django_redis.``, as it always was.
DJANGO_REDIS_CACHE = "django.core.cache.backends.redis.RedisCache"


def cache_backend(cache: object) -> str | None:
    """Which Redis cache a ``CACHES`` entry is: ``"django-redis"``, ``"django"`` or None."""
    backend = str(cache.get("BACKEND", "")) if isinstance(cache, dict) else ""
    if backend.startswith("django_redis."):
        return "django-redis"
    if backend == DJANGO_REDIS_CACHE:
        return "django"
    return None


def cache_locations(cache: dict[str, Any]) -> list[object]:
    """The servers of a Redis ``CACHES`` entry, read as its backend reads them.

    Both backends write to the first and read from the others (replicas), so
    the first is the one every lock goes to. A string is split as the backend
    splits it: django-redis on commas, Django's RedisCache on commas and
    semicolons (without stripping spaces, which its redis-py then refuses).
    """
    value = cache.get("LOCATION")
    if isinstance(value, str):
        if cache_backend(cache) == "django":
            return list(re.split("[;,]", value))
        return [part.strip() for part in value.split(",")]
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]
