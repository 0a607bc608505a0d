"""W081: every ``THROTTLE_SCOPES`` entry limits some view of ``ROOT_URLCONF``.

Apart from ``scopes.py``, which ``drf.py`` reads: this check looks for
``drf.ConcurrencyThrottle`` among the views' throttle classes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Warning

from ..conf import conf

__all__ = ["check_scopes_used"]


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
