"""System checks of the throttling setup: the middleware is installed where it
must be, and each rule's ``url_name`` names a URL (E031, W002, W003).

The rules themselves are checked in ``rules.py``. Registered by
``RedisLockConfig.ready()``; settings only, never the network.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Warning

from ..checks import AUTH_MIDDLEWARE_PATH, middleware_entries, middleware_index
from ..conf import conf

__all__ = ["MIDDLEWARE_PATH", "check_throttle_setup", "check_url_names"]

# The public path the checks' hints name (see ``django_redislock/middleware.py``).
MIDDLEWARE_PATH = "django_redislock.middleware.ConcurrencyLimitMiddleware"


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
