"""System checks for ``REDISLOCK``. They read settings (and may import the
URLconf and middleware classes), never the network.

This module checks the settings every feature reads; a feature checks its
own (``throttling/checks.py``, ``throttling/rules.py``, ``ops/metrics.py``,
``idempotency/settings.py``), through ``register_problems`` or a check of
its own registered by ``apps.py``.

Every ID is written out literally where its message is made, so that a search
for one finds its cause; ``docs/checks.rst`` lists them all with their fixes.
The checks are registered by ``RedisLockConfig.ready()``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Warning
from django.utils.module_loading import import_string

from .conf import DEFAULTS, DJANGO_REDIS_CACHE, cache_backend, cache_locations, conf
from .core import MAX_COUNT, count_problem, is_seconds, seconds_problem, seconds_range
from .core.engine.keys import validate_prefix
from .core.io.breaker import MAX_WINDOW
from .core.io.green import RENEWAL_HINT, green_runtime, renewal_warning

__all__ = [
    "Problem",
    "check_settings",
    "middleware_entries",
    "middleware_index",
    "register_problems",
    "unknown_keys",
]

AUTH_MIDDLEWARE_PATH = "django.contrib.auth.middleware.AuthenticationMiddleware"
# What redis-py's ``from_url`` accepts (both Redis cache backends hand it LOCATION).
URL_SCHEMES = ("redis://", "rediss://", "unix://")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the settings: a check ID, a message and a hint naming the fix."""

    id: str
    msg: str
    hint: str


# Other modules (the throttling rules, for one) add their own validators here.
_extra: list[Callable[[], list[Problem]]] = []


def register_problems(validator: Callable[[], list[Problem]]) -> Callable[[], list[Problem]]:
    _extra.append(validator)
    return validator


def _message(p: Problem) -> CheckMessage:
    cls = Warning if ".W" in p.id else Error
    return cls(p.msg, hint=p.hint, id=p.id)


def check_settings(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """``REDISLOCK`` itself, its throttling rules and the cache it points at."""
    found = settings_problems()
    for validator in _extra:
        found.extend(validator())
    found.extend(_location_problems())
    found.extend(_green_problems())
    return [_message(p) for p in found]


def unknown_keys(check_id: str, what: str, raw: dict[Any, Any], known: Any) -> list[Problem]:
    """A problem naming the keys of ``raw`` not in ``known``, if it has any."""
    unknown = sorted(set(raw) - set(known), key=repr)  # repr: a key need not be a str
    if not unknown:
        return []
    return [
        Problem(
            check_id,
            f"Unknown {what}: {', '.join(map(repr, unknown))}.",
            "Remove them or fix the spelling; valid keys: " + ", ".join(sorted(known)) + ".",
        )
    ]


# -- REDISLOCK itself ------------------------------------------------------------------
def _is_callable_or_path(value: object) -> bool:
    return value is None or callable(value) or (isinstance(value, str) and "." in value)


def settings_problems() -> list[Problem]:
    """Everything wrong with ``settings.REDISLOCK``; no network access."""
    raw = getattr(django_settings, "REDISLOCK", {})
    if not isinstance(raw, dict):
        return [
            Problem(
                "django_redislock.E001",
                f"REDISLOCK must be a dict, not {type(raw).__name__}.",
                "Set REDISLOCK = {...} in your settings, or remove it to use the defaults.",
            )
        ]
    found = unknown_keys("django_redislock.E002", "REDISLOCK setting(s)", raw, DEFAULTS)

    def value(key: str) -> Any:
        return raw.get(key, DEFAULTS[key])

    for key, allow_zero in (
        ("TIMEOUT", False),
        ("WAIT", True),
        ("SOCKET_TIMEOUT", False),
        ("CONNECT_TIMEOUT", False),
        ("PERMIT_TIMEOUT", False),
        ("REPLICAS_TIMEOUT", False),
        ("UNIQUE_TTL", False),
    ):
        problem = seconds_problem(value(key), allow_zero=allow_zero)
        if problem is not None:
            found.append(
                Problem(
                    "django_redislock.E003",
                    f"REDISLOCK[{key!r}] {problem}.",
                    f"Set REDISLOCK[{key!r}] to a number such as {DEFAULTS[key]!r}.",
                )
            )
    renew_max = value("RENEW_MAX")
    if renew_max is not None and not is_seconds(renew_max, allow_zero=False):
        found.append(
            Problem(
                "django_redislock.E003",
                "REDISLOCK['RENEW_MAX'] must be None or a finite number of seconds, "
                f"{seconds_range(allow_zero=False)}; got {renew_max!r}.",
                "Set REDISLOCK['RENEW_MAX'] to a number of seconds, or None for no cap.",
            )
        )
    try:
        validate_prefix(value("PREFIX"))
    except ValueError as exc:
        found.append(
            Problem(
                "django_redislock.E004",
                f"REDISLOCK['PREFIX'] is invalid: {exc}.",
                "Use a plain prefix such as 'redislock' or 'myproject:locks'.",
            )
        )
    if not isinstance(value("CACHE"), str) or (
        value("CLIENT") is None and value("CACHE") not in getattr(django_settings, "CACHES", {})
    ):
        found.append(
            Problem(
                "django_redislock.E005",
                f"REDISLOCK['CACHE'] = {value('CACHE')!r} names no entry of CACHES.",
                "Add a Redis cache (django-redis, or Django's own RedisCache) under that "
                "alias to CACHES, or set REDISLOCK['CACHE'] to an existing alias.",
            )
        )
    else:
        cache = getattr(django_settings, "CACHES", {}).get(value("CACHE"), {})
        if value("CLIENT") is None and cache_backend(cache) is None:
            backend = cache.get("BACKEND", "") if isinstance(cache, dict) else cache
            found.append(
                Problem(
                    "django_redislock.E006",
                    f"CACHES[{value('CACHE')!r}] uses {backend!r}, which is not a Redis cache "
                    "the library can read its connection from.",
                    "Use BACKEND 'django_redis.cache.RedisCache' (django-redis) or "
                    f"{DJANGO_REDIS_CACHE!r} (Django's own) for that alias, or point "
                    "REDISLOCK['CACHE'] at one that does (or set REDISLOCK['CLIENT']).",
                )
            )
    for key in (
        "CLIENT",
        "BUSY_RESPONSE",
        "UNAVAILABLE_RESPONSE",
        "THROTTLE_RESPONSE",
        "ADMIN_PERMISSION",
    ):
        if not _is_callable_or_path(value(key)):
            found.append(
                Problem(
                    "django_redislock.E007",
                    f"REDISLOCK[{key!r}] must be a callable or a dotted path; got {value(key)!r}.",
                    f"Set REDISLOCK[{key!r}] to 'package.module.name', or remove it.",
                )
            )
    status = value("BUSY_STATUS")
    if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
        found.append(
            Problem(
                "django_redislock.E008",
                f"REDISLOCK['BUSY_STATUS'] must be an HTTP error status; got {status!r}.",
                "Use 409 (the default), 423 or 503.",
            )
        )
    problem = count_problem(value("REPLICAS"), low=0, high=MAX_COUNT)
    if problem is not None:
        found.append(
            Problem(
                "django_redislock.E009",
                f"REDISLOCK['REPLICAS'] {problem}.",
                "Set it to the number of replicas that must acknowledge a new lease, or 0.",
            )
        )
    for key in ("ENABLED", "RENEW", "FAIL_OPEN", "THROTTLE_FAIL_OPEN", "OTEL_LOCK_NAMES"):
        if not isinstance(value(key), bool):
            found.append(
                Problem(
                    "django_redislock.E010",
                    f"REDISLOCK[{key!r}] must be True or False; got {value(key)!r}.",
                    f"Set REDISLOCK[{key!r}] = {DEFAULTS[key]!r} (or its opposite).",
                )
            )
    window = value("BREAKER_WINDOW")
    if not is_seconds(window, allow_zero=True) or window > MAX_WINDOW:
        found.append(
            Problem(
                "django_redislock.E013",
                "REDISLOCK['BREAKER_WINDOW'] must be 0 (off) or a number of seconds up to "
                f"{MAX_WINDOW:g}; got {window!r}.",
                "Set it to how long calls to a Redis that timed out fail fast before one "
                f"call tries it again, such as {DEFAULTS['BREAKER_WINDOW']!r}, or 0 to turn "
                "the circuit breaker off.",
            )
        )
    early = value("CONNECT_EARLY")
    databases = getattr(django_settings, "DATABASES", {})
    if not isinstance(early, bool) and (
        not isinstance(early, (list, tuple))
        or not all(isinstance(alias, str) and alias in databases for alias in early)
    ):
        found.append(
            Problem(
                "django_redislock.E012",
                "REDISLOCK['CONNECT_EARLY'] must be True, False or a list of DATABASES "
                f"aliases; got {early!r}.",
                "Set it to False (the default), True, or aliases from DATABASES such as "
                "['default'].",
            )
        )
    if (
        value("SOCKET_TIMEOUT") is not None
        and is_seconds(value("TIMEOUT"), allow_zero=False)
        and is_seconds(value("SOCKET_TIMEOUT"), allow_zero=False)
        and value("SOCKET_TIMEOUT") * 3 > value("TIMEOUT")
    ):
        found.append(
            Problem(
                "django_redislock.W001",
                "REDISLOCK['SOCKET_TIMEOUT'] is more than a third of REDISLOCK['TIMEOUT']: "
                "one slow call could outlast a renewal window.",
                "Lower SOCKET_TIMEOUT or raise TIMEOUT.",
            )
        )
    return found


# -- renewal on green threads ----------------------------------------------------------
def _green_problems() -> list[Problem]:
    # Only REDISLOCK["RENEW"]: a decorator's or a lock's own renew=True is
    # told by the log at its first renewal (core/io/renewal.py), in the process
    # that runs it, which is where green threads matter.
    runtime = green_runtime()
    if runtime is None or conf.raw.get("RENEW") is not True:
        return []
    return [
        Problem(
            "django_redislock.W004",
            f"REDISLOCK['RENEW'] is True. {renewal_warning(runtime)}",
            RENEWAL_HINT,
        )
    ]


# -- the cache's LOCATION ----------------------------------------------------------------
def _location_problems() -> list[Problem]:
    raw = conf.raw
    alias = raw.get("CACHE", "default")
    if raw.get("CLIENT") is not None or not isinstance(alias, str):
        return []
    cache = getattr(django_settings, "CACHES", {}).get(alias)
    if not isinstance(cache, dict) or cache_backend(cache) is None:
        return []  # E005 / E006 say what is wrong with the alias.
    found = []
    # Replicas too: the cache reads from them, and fails there just the same.
    for index, location in enumerate(cache_locations(cache)):
        # Case-sensitive, as redis-py reads it: "REDIS://" is refused too.
        if isinstance(location, str) and location.startswith(URL_SCHEMES):
            continue
        fails = "the first lock" if index == 0 else "the cache's first read from that replica"
        example = "redis://127.0.0.1:6379/0"
        if isinstance(location, str):
            scheme, sep, rest = location.partition("://")
            if sep and f"{scheme.lower()}://" in URL_SCHEMES:
                example = f"{scheme.lower()}://{rest}"
            elif location and "/" not in location:
                example = f"redis://{location}/0"
        found.append(
            Problem(
                "django_redislock.E011",
                f"CACHES[{alias!r}]['LOCATION'] = {location!r} is not a Redis URL: it needs a "
                f"scheme in lower case (redis://, rediss:// or unix://); {fails} would fail "
                "with redis-py's ValueError.",
                f"Write it as a URL, e.g. {example!r} (or 'unix:///path/to/redis.sock?db=0').",
            )
        )
    return found


# -- the throttling middleware and what it depends on ---------------------------------------
def middleware_entries() -> list[str]:
    """``MIDDLEWARE``, its string entries."""
    value = getattr(django_settings, "MIDDLEWARE", None) or []
    return [entry for entry in value if isinstance(entry, str)]


def _is(entry: str, path: str) -> bool:
    """Whether the MIDDLEWARE entry ``entry`` is the class at ``path`` or a subclass."""
    if entry == path:
        return True
    try:
        cls, base = import_string(entry), import_string(path)
    except Exception:  # noqa: BLE001 - Django's startup reports an entry that fails to import.
        return False
    return isinstance(cls, type) and isinstance(base, type) and issubclass(cls, base)


def middleware_index(entries: list[str], path: str) -> int | None:
    """Where the class at ``path``, or a subclass, first appears in ``entries``."""
    return next((i for i, entry in enumerate(entries) if _is(entry, path)), None)
