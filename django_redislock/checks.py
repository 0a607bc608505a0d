"""System checks for ``REDISLOCK``. They read settings (and may import the
URLconf and middleware classes), never the network.

Every ID is written out literally where its message is made, so that a search
for one finds its cause; ``docs/checks.rst`` lists them all with their fixes.
The checks are registered by ``RedisLockConfig.ready()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Warning
from django.utils.module_loading import import_string

from .conf import Problem, cache_backend, cache_locations, conf, problems
from .core.green import RENEWAL_HINT, green_runtime, renewal_warning

__all__ = [
    "check_settings",
    "check_throttle_setup",
    "check_url_names",
    "middleware_entries",
    "middleware_index",
    "register_problems",
]

MIDDLEWARE_PATH = "django_redislock.middleware.ConcurrencyLimitMiddleware"
AUTH_MIDDLEWARE_PATH = "django.contrib.auth.middleware.AuthenticationMiddleware"
# What redis-py's ``from_url`` accepts (both Redis cache backends hand it LOCATION).
URL_SCHEMES = ("redis://", "rediss://", "unix://")

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
    found = problems()
    for validator in _extra:
        found.extend(validator())
    found.extend(_location_problems())
    found.extend(_green_problems())
    return [_message(p) for p in found]


# -- renewal on green threads ----------------------------------------------------------
def _green_problems() -> list[Problem]:
    # Only REDISLOCK["RENEW"]: a decorator's or a lock's own renew=True is
    # told by the log at its first renewal (core/renewal.py), in the process
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


def _rule_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    raw = conf.raw.get("THROTTLE", [])
    if isinstance(raw, (list, tuple)):
        for index, spec in enumerate(raw):
            if isinstance(spec, dict):
                yield f"REDISLOCK['THROTTLE'][{index}]", spec


def check_throttle_setup(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """THROTTLE rules without the middleware, and ``per: "user"`` without authentication."""
    throttle = conf.raw.get("THROTTLE", [])
    if not throttle:
        return []
    entries = middleware_entries()
    ours = middleware_index(entries, MIDDLEWARE_PATH)
    if ours is None:
        return [
            Error(
                "REDISLOCK['THROTTLE'] has rules, but ConcurrencyLimitMiddleware is not in "
                "MIDDLEWARE: no rule is ever applied.",
                hint=f"Add {MIDDLEWARE_PATH!r} to MIDDLEWARE (last, after "
                "AuthenticationMiddleware), or remove the rules.",
                id="django_redislock.E031",
            )
        ]
    per_user = [
        f"{where} ({spec.get('name')!r})"
        for where, spec in _rule_specs()
        if spec.get("per") == "user"
    ]
    auth = middleware_index(entries, AUTH_MIDDLEWARE_PATH)
    if not per_user or (auth is not None and auth < ours):
        return []
    where = "is not in MIDDLEWARE" if auth is None else "comes after ConcurrencyLimitMiddleware"
    return [
        Warning(
            f"{', '.join(per_user)} limit(s) per user, but AuthenticationMiddleware {where}: "
            "request.user is not set when the permit is taken, so every request is counted "
            "per IP address instead.",
            hint=f"Put {MIDDLEWARE_PATH!r} after {AUTH_MIDDLEWARE_PATH!r} in MIDDLEWARE "
            "(last is best), or use 'per': 'ip' if that is what you want.",
            id="django_redislock.W002",
        )
    ]


# -- url_name matchers -------------------------------------------------------------------
def _func_path(callback: Any) -> str:
    # What ResolverMatch.view_name holds for a pattern without a name.
    func = getattr(callback, "view_class", callback)
    if not hasattr(func, "__name__"):
        return f"{type(func).__module__}.{type(func).__name__}"
    return f"{func.__module__}.{func.__name__}"


def _url_names(patterns: Any, namespaces: tuple[str, ...] = ()) -> Iterator[str]:
    """Every ``url_name`` and ``view_name`` a request can resolve to."""
    from django.urls import URLPattern, URLResolver

    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            inner = (*namespaces, pattern.namespace) if pattern.namespace else namespaces
            yield from _url_names(pattern.url_patterns, inner)
        elif isinstance(pattern, URLPattern):
            if pattern.name:
                yield pattern.name
            yield ":".join((*namespaces, pattern.name or _func_path(pattern.callback)))


def check_url_names(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """Each rule's ``url_name`` must name a URL of ROOT_URLCONF (it imports the URLconf)."""
    specs = [(where, spec) for where, spec in _rule_specs() if spec.get("url_name")]
    if not specs or not getattr(django_settings, "ROOT_URLCONF", None):
        return []
    from django.urls import get_resolver

    try:
        known = set(_url_names(get_resolver().url_patterns))
    except Exception:  # noqa: BLE001 - Django's own URL checks report a broken URLconf.
        return []
    messages: list[CheckMessage] = []
    for where, spec in specs:
        value = spec["url_name"]
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, (list, tuple, set, frozenset)):
            continue  # E029
        for name in names:
            if isinstance(name, str) and name and name not in known:
                messages.append(
                    Warning(
                        f"{where}: 'url_name' {name!r} names no URL of ROOT_URLCONF "
                        f"({django_settings.ROOT_URLCONF}): the rule never applies.",
                        hint="Use the name given to path(), or 'namespace:name' for a URL "
                        "included with a namespace (e.g. 'shop:export'). A URLconf chosen per "
                        "request (request.urlconf) is not checked: if the name is there, add "
                        "'django_redislock.W003' to SILENCED_SYSTEM_CHECKS.",
                        id="django_redislock.W003",
                    )
                )
    return messages
