"""``REDISLOCK["THROTTLE_SCOPES"]``: the limits of DRF's ``throttle_scope``.

Read by ``ConcurrencyThrottle`` (``drf.py``) as DRF's ``ScopedRateThrottle``
reads ``DEFAULT_THROTTLE_RATES``: a scope maps to a limit, or to a dict of a
rule's ``limit``, ``per``, ``wait``, ``timeout`` and ``retry_after``. Bad
entries are reported by ``manage.py check`` (E081, E082, and the rule IDs)
and skipped at request time with a logged error; a scope no view of the
URLconf is limited by, by W081.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Warning

from ..checks import Problem, register_problems
from ..conf import conf
from .rules import Rule, RuleError, make_rule

__all__ = ["check_scopes_used", "scope_problems", "scope_rule"]

logger = logging.getLogger("django_redislock.throttle")

# Keys a scope's dict may not have: the view's ``throttle_scope`` selects the
# requests, and the scope names the semaphore.
SELECTING_KEYS = frozenset({"name", "path", "url_name", "methods"})


def _parse_scopes(raw: object) -> tuple[dict[str, Rule], list[RuleError]]:
    errors: list[RuleError] = []
    if not isinstance(raw, dict):
        errors.append(
            RuleError(
                "django_redislock.E081",
                "REDISLOCK['THROTTLE_SCOPES'] must be a dict of throttle_scope -> limit; "
                f"got {type(raw).__name__}.",
                "Write e.g. {'exports': 2, 'uploads': {'limit': 4, 'wait': 1}}, as "
                "REST_FRAMEWORK['DEFAULT_THROTTLE_RATES'] maps scopes to rates.",
            )
        )
        return {}, errors
    rules: dict[str, Rule] = {}
    for scope, value in raw.items():
        where = f"REDISLOCK['THROTTLE_SCOPES'][{scope!r}]"
        if not isinstance(scope, str) or not scope:
            errors.append(
                RuleError(
                    "django_redislock.E081",
                    f"{where}: a scope must be a non-empty string.",
                    "Use the view's throttle_scope, e.g. 'exports'.",
                )
            )
            continue
        if isinstance(value, dict):
            selecting = sorted(SELECTING_KEYS & set(value))
            if selecting:
                errors.append(
                    RuleError(
                        "django_redislock.E082",
                        f"{where}: {', '.join(map(repr, selecting))} cannot be set for a scope.",
                        "The views whose throttle_scope it is are its requests, and the scope "
                        "names its semaphore: remove them (or write a THROTTLE rule).",
                    )
                )
                continue
            spec = {"per": "user", **value, "name": scope}
        elif isinstance(value, int) and not isinstance(value, bool):
            spec = {"per": "user", "limit": value, "name": scope}
        else:
            errors.append(
                RuleError(
                    "django_redislock.E081",
                    f"{where} must be a limit (an int) or a dict with 'limit'; got {value!r}.",
                    "Write e.g. 2, or {'limit': 2, 'per': 'user', 'wait': 0.5}.",
                )
            )
            continue
        rule = make_rule(spec, where=where, errors=errors)
        if rule is not None:
            rules[scope] = rule
    return rules, errors


@register_problems
def scope_problems() -> list[Problem]:
    """System check: every problem with ``REDISLOCK['THROTTLE_SCOPES']``, no network."""
    raw = conf.raw.get("THROTTLE_SCOPES", {})
    return [Problem(e.check_id, e.msg, e.hint) for e in _parse_scopes(raw)[1]]


_scopes_cache: tuple[Any, dict[str, Rule]] | None = None


def scope_rule(scope: str) -> Rule | None:
    """The rule of a DRF ``throttle_scope``, or None: not limited. Bad ones are logged."""
    global _scopes_cache
    raw = conf.raw.get("THROTTLE_SCOPES", {})
    cached = _scopes_cache
    if cached is None or cached[0] != raw:
        rules, errors = _parse_scopes(raw)
        for error in errors:
            logger.error("ignoring a throttle scope (%s): %s", error.check_id, error)
        try:
            snapshot = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
        except (AttributeError, TypeError):
            snapshot = None
        cached = _scopes_cache = (snapshot, rules)
    return cached[1].get(scope)


# -- every scope is some view's ---------------------------------------------------------
def _views(patterns: Any) -> Iterator[Any]:
    from django.urls import URLPattern, URLResolver

    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _views(pattern.url_patterns)
        elif isinstance(pattern, URLPattern):
            yield pattern.callback


def _throttled_scope(view: Any, throttle: type) -> str | None:
    """The ``throttle_scope`` ``throttle`` limits in ``view``, if it is one of its classes."""
    cls = getattr(view, "cls", None)
    if not isinstance(cls, type):
        return None
    # A viewset's @action(throttle_scope=..., throttle_classes=...) arrives as initkwargs.
    initkwargs = getattr(view, "initkwargs", None) or {}
    classes = initkwargs.get("throttle_classes", getattr(cls, "throttle_classes", ()))
    if not any(isinstance(c, type) and issubclass(c, throttle) for c in classes or ()):
        return None
    scope = initkwargs.get("throttle_scope", getattr(cls, "throttle_scope", None))
    return scope if isinstance(scope, str) else None


def check_scopes_used(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """W081: a ``THROTTLE_SCOPES`` entry that no view of ROOT_URLCONF is limited by."""
    raw = conf.raw.get("THROTTLE_SCOPES", {})
    if not raw or not isinstance(raw, dict) or not getattr(django_settings, "ROOT_URLCONF", None):
        return []
    try:
        from .drf import ConcurrencyThrottle
    except ImportError:  # no DRF: E081 and friends still check the shape
        return []
    from django.urls import get_resolver

    try:
        views = list(_views(get_resolver().url_patterns))
    except Exception:  # noqa: BLE001 - Django's own URL checks report a broken URLconf.
        return []
    used = {_throttled_scope(view, ConcurrencyThrottle) for view in views}
    return [
        Warning(
            f"REDISLOCK['THROTTLE_SCOPES'][{scope!r}] limits no view of ROOT_URLCONF "
            f"({django_settings.ROOT_URLCONF}): no view with throttle_scope = {scope!r} has "
            "ConcurrencyThrottle among its throttle classes, so the limit never applies.",
            hint="Add 'django_redislock.throttling.drf.ConcurrencyThrottle' to "
            "REST_FRAMEWORK['DEFAULT_THROTTLE_CLASSES'] (or to the view's throttle_classes), "
            "and check the view's throttle_scope. A URLconf chosen per request is not "
            "checked: then add 'django_redislock.W081' to SILENCED_SYSTEM_CHECKS.",
            id="django_redislock.W081",
        )
        for scope in raw
        if isinstance(scope, str) and scope not in used
    ]
