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

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Warning
from django.utils.module_loading import import_string

from .conf import DEFAULTS, DJANGO_REDIS_CACHE, cache_backend, cache_locations, conf
from .core import (
    MAX_BREAKER_WINDOW,
    MAX_COUNT,
    RENEWAL_HINT,
    count_problem,
    green_runtime,
    is_seconds,
    renewal_warning,
    seconds_problem,
    seconds_range,
    validate_prefix,
)

__all__ = [
    "SETTING_CHECKS",
    "Problem",
    "SettingCheck",
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
# Each key's check is one row: its ID, a validator that says what is wrong with a
# value (or None), and the hint. The message is "REDISLOCK[key] <what is wrong>.".
# Checks that read two keys, or other settings, follow the table.
@dataclass(frozen=True)
class SettingCheck:
    id: str
    problem: Callable[[Any], str | None]
    hint: str


def _seconds(*, allow_zero: bool = False, allow_none: bool = False) -> Callable[[Any], str | None]:
    def problem(value: Any) -> str | None:
        if allow_none and value is None:
            return None
        if allow_none and not is_seconds(value, allow_zero=allow_zero):
            return (
                "must be None or a finite number of seconds, "
                f"{seconds_range(allow_zero=allow_zero)}; got {value!r}"
            )
        return seconds_problem(value, allow_zero=allow_zero)

    return problem


def _prefix_problem(value: Any) -> str | None:
    try:
        validate_prefix(value)
    except ValueError as exc:
        return f"is invalid: {exc}"
    return None


def _callable_problem(value: Any) -> str | None:
    if value is None or callable(value) or (isinstance(value, str) and "." in value):
        return None
    return f"must be a callable or a dotted path; got {value!r}"


def _headers_problem(value: Any) -> str | None:
    if isinstance(value, (list, tuple)) and all(
        isinstance(h, str) and re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", h) for h in value
    ):
        return None
    return f"must be a list of HTTP header names; got {value!r}"


def _status_problem(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool) and 400 <= value <= 599:
        return None
    return f"must be an HTTP error status; got {value!r}"


def _bool_problem(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"must be True or False; got {value!r}"


def _window_problem(value: Any) -> str | None:
    if is_seconds(value, allow_zero=True) and value <= MAX_BREAKER_WINDOW:
        return None
    return f"must be 0 (off) or a number of seconds up to {MAX_BREAKER_WINDOW:g}; got {value!r}"


def _replicas_problem(value: Any) -> str | None:
    return count_problem(value, low=0, high=MAX_COUNT)


def _connect_early_problem(value: Any) -> str | None:
    databases = getattr(django_settings, "DATABASES", {})
    if isinstance(value, bool) or (
        isinstance(value, (list, tuple))
        and all(isinstance(alias, str) and alias in databases for alias in value)
    ):
        return None
    return f"must be True, False or a list of DATABASES aliases; got {value!r}"


def _seconds_row(key: str, *, allow_zero: bool = False) -> SettingCheck:
    return SettingCheck(
        "django_redislock.E003",
        _seconds(allow_zero=allow_zero),
        f"Set REDISLOCK[{key!r}] to a number such as {DEFAULTS[key]!r}.",
    )


def _callable_row(key: str) -> SettingCheck:
    return SettingCheck(
        "django_redislock.E007",
        _callable_problem,
        f"Set REDISLOCK[{key!r}] to 'package.module.name', or remove it.",
    )


def _bool_row(key: str) -> SettingCheck:
    return SettingCheck(
        "django_redislock.E010",
        _bool_problem,
        f"Set REDISLOCK[{key!r}] = {DEFAULTS[key]!r} (or its opposite).",
    )


SETTING_CHECKS: dict[str, SettingCheck] = {
    "TIMEOUT": _seconds_row("TIMEOUT"),
    "WAIT": _seconds_row("WAIT", allow_zero=True),
    "SOCKET_TIMEOUT": _seconds_row("SOCKET_TIMEOUT"),
    "CONNECT_TIMEOUT": _seconds_row("CONNECT_TIMEOUT"),
    "PERMIT_TIMEOUT": _seconds_row("PERMIT_TIMEOUT"),
    "REPLICAS_TIMEOUT": _seconds_row("REPLICAS_TIMEOUT"),
    "UNIQUE_TTL": _seconds_row("UNIQUE_TTL"),
    "RENEW_MAX": SettingCheck(
        "django_redislock.E003",
        _seconds(allow_none=True),
        "Set REDISLOCK['RENEW_MAX'] to a number of seconds, or None for no cap.",
    ),
    "PREFIX": SettingCheck(
        "django_redislock.E004",
        _prefix_problem,
        "Use a plain prefix such as 'redislock' or 'myproject:locks'.",
    ),
    "CLIENT": _callable_row("CLIENT"),
    "BUSY_RESPONSE": _callable_row("BUSY_RESPONSE"),
    "UNAVAILABLE_RESPONSE": _callable_row("UNAVAILABLE_RESPONSE"),
    "THROTTLE_RESPONSE": _callable_row("THROTTLE_RESPONSE"),
    "ADMIN_PERMISSION": _callable_row("ADMIN_PERMISSION"),
    "CALLER": _callable_row("CALLER"),
    "CREDENTIAL_HEADERS": SettingCheck(
        "django_redislock.E080",
        _headers_problem,
        "Use e.g. ['Authorization', 'X-Api-Key'] (the default), or [] to trust the "
        "address of every request no authentication accepts.",
    ),
    "BUSY_STATUS": SettingCheck(
        "django_redislock.E008", _status_problem, "Use 409 (the default), 423 or 503."
    ),
    "REPLICAS": SettingCheck(
        "django_redislock.E009",
        _replicas_problem,
        "Set it to the number of replicas that must acknowledge a new lease, or 0.",
    ),
    "ENABLED": _bool_row("ENABLED"),
    "RENEW": _bool_row("RENEW"),
    "FAIL_OPEN": _bool_row("FAIL_OPEN"),
    "THROTTLE_FAIL_OPEN": _bool_row("THROTTLE_FAIL_OPEN"),
    "OTEL_LOCK_NAMES": _bool_row("OTEL_LOCK_NAMES"),
    "BREAKER_WINDOW": SettingCheck(
        "django_redislock.E013",
        _window_problem,
        "Set it to how long calls to a Redis that timed out fail fast before one call "
        f"tries it again, such as {DEFAULTS['BREAKER_WINDOW']!r}, or 0 to turn the circuit "
        "breaker off.",
    ),
    "CONNECT_EARLY": SettingCheck(
        "django_redislock.E012",
        _connect_early_problem,
        "Set it to False (the default), True, or aliases from DATABASES such as ['default'].",
    ),
}


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

    for key, check in SETTING_CHECKS.items():
        problem = check.problem(value(key))
        if problem is not None:
            found.append(Problem(check.id, f"REDISLOCK[{key!r}] {problem}.", check.hint))
    found.extend(_cache_problems(value("CACHE"), value("CLIENT")))
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


def _cache_problems(alias: Any, client: Any) -> list[Problem]:
    """REDISLOCK['CACHE'] against CACHES, unless REDISLOCK['CLIENT'] gives the client."""
    caches = getattr(django_settings, "CACHES", {})
    if not isinstance(alias, str) or (client is None and alias not in caches):
        return [
            Problem(
                "django_redislock.E005",
                f"REDISLOCK['CACHE'] = {alias!r} names no entry of CACHES.",
                "Add a Redis cache (django-redis, or Django's own RedisCache) under that "
                "alias to CACHES, or set REDISLOCK['CACHE'] to an existing alias.",
            )
        ]
    cache = caches.get(alias, {})
    if client is not None or cache_backend(cache) is not None:
        return []
    backend = cache.get("BACKEND", "") if isinstance(cache, dict) else cache
    return [
        Problem(
            "django_redislock.E006",
            f"CACHES[{alias!r}] uses {backend!r}, which is not a Redis cache "
            "the library can read its connection from.",
            "Use BACKEND 'django_redis.cache.RedisCache' (django-redis) or "
            f"{DJANGO_REDIS_CACHE!r} (Django's own) for that alias, or point "
            "REDISLOCK['CACHE'] at one that does (or set REDISLOCK['CLIENT']).",
        )
    ]


# -- renewal on green threads ----------------------------------------------------------
def _green_problems() -> list[Problem]:
    # Only REDISLOCK["RENEW"]: a decorator's or a lock's own renew=True is
    # told by the log at its first renewal (core/io/background.py), in the process
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
