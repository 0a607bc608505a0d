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
from typing import Any

from ..checks import Problem, register_problems
from ..conf import conf
from .rules import Rule, RuleError, make_rule

__all__ = ["scope_problems", "scope_rule"]

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
