"""The ``REDISLOCK`` settings dict, read lazily so ``override_settings`` works.

Each setting is a typed property with its default beside it; nothing is ever
written onto ``django.conf.settings``. ``checks.py`` validates the dict for
the system checks without touching the network.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed

__all__ = [
    "DEFAULTS",
    "DJANGO_REDIS_CACHE",
    "cache_backend",
    "cache_locations",
    "conf",
]

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
    # Who may see and force-release locks in the admin: dotted path to a
    # callable of the user, or None for superusers only.
    "ADMIN_PERMISSION": None,
    # Metrics backends to feed from the lock signals: "prometheus",
    # "opentelemetry". Read when the app loads (and on override_settings).
    "METRICS": [],
    # Idempotency-Key handling of @idempotent views: a dict of the keys in
    # django_redislock.idempotency.SETTINGS (validated there, E060 to E065).
    "IDEMPOTENCY": {},
    # Unique tasks: how long a queued task that never starts keeps its key (seconds).
    "UNIQUE_TTL": 3600.0,
}


class Settings:
    """Typed, lazy view of ``settings.REDISLOCK``.

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

    @property
    def ENABLED(self) -> bool:
        return bool(self.get("ENABLED"))

    @property
    def CACHE(self) -> str:
        return str(self.get("CACHE"))

    @property
    def CLIENT(self) -> str | Callable[..., Any] | None:
        return self.get("CLIENT")

    @property
    def PREFIX(self) -> str:
        return str(self.get("PREFIX"))

    @property
    def TIMEOUT(self) -> float:
        return float(self.get("TIMEOUT"))

    @property
    def WAIT(self) -> float:
        return float(self.get("WAIT"))

    @property
    def RENEW(self) -> bool:
        return bool(self.get("RENEW"))

    @property
    def RENEW_MAX(self) -> float | None:
        value = self.get("RENEW_MAX")
        return None if value is None else float(value)

    @property
    def FAIL_OPEN(self) -> bool:
        return bool(self.get("FAIL_OPEN"))

    @property
    def CONNECT_EARLY(self) -> bool | tuple[str, ...]:
        value = self.get("CONNECT_EARLY")
        return value if isinstance(value, bool) else tuple(value)

    @property
    def SOCKET_TIMEOUT(self) -> float:
        return float(self.get("SOCKET_TIMEOUT"))

    @property
    def CONNECT_TIMEOUT(self) -> float:
        return float(self.get("CONNECT_TIMEOUT"))

    @property
    def BUSY_STATUS(self) -> int:
        return int(self.get("BUSY_STATUS"))

    @property
    def BUSY_RESPONSE(self) -> str | Callable[..., Any] | None:
        return self.get("BUSY_RESPONSE")

    @property
    def UNAVAILABLE_RESPONSE(self) -> str | Callable[..., Any] | None:
        return self.get("UNAVAILABLE_RESPONSE")

    @property
    def REPLICAS(self) -> int:
        return int(self.get("REPLICAS"))

    @property
    def REPLICAS_TIMEOUT(self) -> float:
        return float(self.get("REPLICAS_TIMEOUT"))

    @property
    def THROTTLE(self) -> list[dict[str, Any]]:
        return list(self.get("THROTTLE"))

    @property
    def THROTTLE_FAIL_OPEN(self) -> bool:
        return bool(self.get("THROTTLE_FAIL_OPEN"))

    @property
    def THROTTLE_RESPONSE(self) -> str | Callable[..., Any] | None:
        return self.get("THROTTLE_RESPONSE")

    @property
    def PERMIT_TIMEOUT(self) -> float:
        return float(self.get("PERMIT_TIMEOUT"))

    @property
    def ADMIN_PERMISSION(self) -> str | Callable[..., Any] | None:
        return self.get("ADMIN_PERMISSION")

    @property
    def METRICS(self) -> list[str]:
        value = self.get("METRICS")
        return list(value) if isinstance(value, (list, tuple)) else []

    @property
    def IDEMPOTENCY(self) -> dict[str, Any]:
        value = self.get("IDEMPOTENCY")
        return dict(value) if isinstance(value, dict) else {}

    @property
    def UNIQUE_TTL(self) -> float:
        return float(self.get("UNIQUE_TTL"))


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
