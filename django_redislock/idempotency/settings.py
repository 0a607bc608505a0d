"""``REDISLOCK["IDEMPOTENCY"]``: defaults, validation, system checks, and the policy of a call.

The decorator's arguments and the middleware's settings are the same keys:
``policy()`` reads the settings per request (``override_settings`` works) and
lays a decorator's arguments over them.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from collections.abc import Callable, Iterable
from typing import Any

from django.utils.module_loading import import_string

from ..checks import (
    AUTH_MIDDLEWARE_PATH,
    Problem,
    middleware_entries,
    middleware_index,
    register_problems,
    unknown_keys,
)
from ..conf import conf
from ..core import MAX_BYTES, count_problem, seconds_problem

__all__ = [
    "MIDDLEWARE_PATH",
    "RETRYABLE_STATUSES",
    "SETTINGS",
    "Policy",
    "check_arguments",
    "middleware_hooks_after",
    "policy",
]

MIDDLEWARE_PATH = "django_redislock.idempotency.IdempotencyMiddleware"

logger = logging.getLogger("django_redislock.idempotency")

# REDISLOCK["IDEMPOTENCY"]: each key optional, each overridable per decorator.
SETTINGS: dict[str, Any] = {
    # Methods whose requests honour the header; others run as if undecorated.
    "METHODS": ["POST", "PATCH"],
    "HEADER": "Idempotency-Key",
    # True: a request without the header gets 400 instead of running.
    "REQUIRED": False,
    # Whose keys are whose: "user" (anonymous: per IP), "ip", or a callable
    # (or dotted path) of the request returning a non-empty str.
    "SCOPE": "user",
    # With SCOPE "user": headers that carry credentials Django may not read.
    # A request that sends one yet looks anonymous is refused, never scoped
    # by its address (which many users may share). None: the caller
    # resolver's own, REDISLOCK["CREDENTIAL_HEADERS"].
    "CREDENTIAL_HEADERS": None,
    # How long a completed response is replayed (seconds; the draft and Stripe: 24 h).
    "TTL": 86400,
    "MAX_KEY_LENGTH": 255,
    # Largest response body kept (bytes); a larger one is stored without it.
    "MAX_BODY": 65536,
    # Replayed besides Content-Type. Never Set-Cookie: a replay must not hand
    # a session to whoever repeats the key.
    "REPLAY_HEADERS": ["Location"],
    # Whether a 4xx the view answered is stored (as Stripe does) or retried.
    "STORE_CLIENT_ERRORS": True,
    # IdempotencyMiddleware: regular expressions (re.search on path_info) of
    # the paths it serves; views it does not reach can use the decorator.
    "PATHS": [],
    # The key's lock. WAIT: how long a duplicate waits for the first request
    # to finish (0: a 409 at once). TIMEOUT and RENEW: its lease (None:
    # REDISLOCK["TIMEOUT"] and REDISLOCK["RENEW"]).
    "WAIT": 0,
    "TIMEOUT": None,
    "RENEW": None,
}

# Never stored: they ask the client to try again (a retry must run).
RETRYABLE_STATUSES = frozenset({408, 409, 425, 429})

_TOKEN_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token


# -- validators: each returns what is wrong, or None ----------------------------------
def _list_error(
    value: object,
    expected: str,
    item_error: Callable[[Any], str | None],
    *,
    kinds: tuple[type[Iterable[Any]], ...] = (list, tuple),
    empty: bool = True,
) -> str | None:
    """What is wrong with a list setting: not a list (of ``kinds``), empty when
    it must not be, or the first item that ``item_error`` refuses."""
    if isinstance(value, str) or not isinstance(value, kinds) or not (value or empty):
        return f"must be {expected}; got {value!r}"
    return next((error for error in map(item_error, value) if error is not None), None)


def _method_item_error(method: object) -> str | None:
    if isinstance(method, str) and _TOKEN_RE.fullmatch(method) and method.upper() == method:
        return None
    return f"must hold upper-case method names such as 'POST'; got {method!r}"


def _method_error(value: object) -> str | None:
    return _list_error(
        value,
        "a non-empty list of HTTP methods such as ['POST', 'PATCH']",
        _method_item_error,
        kinds=(list, tuple, set, frozenset),
        empty=False,
    )


def _seconds_error(
    value: object, *, allow_zero: bool = False, allow_none: bool = False
) -> str | None:
    if value is None and allow_none:
        return None
    return seconds_problem(value, allow_zero=allow_zero)


def _count_error(value: object, *, allow_zero: bool = False) -> str | None:
    # Sizes: a body or a key Redis stores, at most its largest value.
    return count_problem(value, low=0 if allow_zero else 1, high=MAX_BYTES)


def _scope_error(value: object) -> str | None:
    if value in ("user", "ip") or callable(value) or (isinstance(value, str) and "." in value):
        return None
    return f"must be 'user', 'ip', a callable or a dotted path to one; got {value!r}"


def _bool_error(value: object, *, allow_none: bool = False) -> str | None:
    if isinstance(value, bool) or (value is None and allow_none):
        return None
    return f"must be True or False; got {value!r}"


def _pattern_error(pattern: object) -> str | None:
    if not isinstance(pattern, str):
        return f"must hold regular expression strings; got {pattern!r}"
    try:
        re.compile(pattern)
    except re.error as exc:
        return f"has {pattern!r}, which is not a regular expression ({exc})"
    return None


def _paths_error(value: object) -> str | None:
    expected = "a list of regular expressions such as [r'^/api/payments/']"
    return _list_error(value, expected, _pattern_error)


def _header_error(value: object) -> str | None:
    if isinstance(value, str) and _TOKEN_RE.fullmatch(value):
        return None
    return f"must be an HTTP header name such as 'Idempotency-Key'; got {value!r}"


def _replayed_error(name: object) -> str | None:
    if not isinstance(name, str) or not _TOKEN_RE.fullmatch(name):
        return f"must hold header names such as 'Location'; got {name!r}"
    if name.lower() in ("set-cookie", "content-length"):
        return f"must not name {name!r}: a replay never hands out cookies, and sets its length"
    return None


def _headers_error(value: object) -> str | None:
    return _list_error(value, "a list of header names such as ['Location']", _replayed_error)


def _credentials_error(value: object) -> str | None:
    if value is None:
        return None
    return _list_error(value, "a list of header names such as ['Authorization']", _header_error)


# key -> (check ID, validator, hint). The IDs are stable: docs/checks.rst lists them.
VALIDATORS: dict[str, tuple[str, Callable[[Any], str | None], str]] = {
    "METHODS": ("django_redislock.E061", _method_error, "Use e.g. ['POST', 'PATCH']."),
    "TTL": ("django_redislock.E062", _seconds_error, "Use seconds, e.g. 86400 for a day."),
    "MAX_KEY_LENGTH": ("django_redislock.E062", _count_error, "Use 255 (the default)."),
    "MAX_BODY": (
        "django_redislock.E062",
        lambda v: _count_error(v, allow_zero=True),
        "Use a size in bytes such as 65536 (0 keeps no bodies).",
    ),
    "WAIT": (
        "django_redislock.E062",
        lambda v: _seconds_error(v, allow_zero=True),
        "Use seconds, e.g. 0 (a duplicate gets 409 at once) or 5.",
    ),
    "TIMEOUT": (
        "django_redislock.E062",
        lambda v: _seconds_error(v, allow_none=True),
        "Use seconds longer than the slowest request, e.g. 60, or None for REDISLOCK['TIMEOUT'].",
    ),
    "SCOPE": (
        "django_redislock.E063",
        _scope_error,
        "Use 'user', 'ip', or 'myapp.idempotency.scope' (a function of the request).",
    ),
    "REQUIRED": ("django_redislock.E064", _bool_error, "Write True or False."),
    "STORE_CLIENT_ERRORS": ("django_redislock.E064", _bool_error, "Write True or False."),
    "RENEW": (
        "django_redislock.E064",
        lambda v: _bool_error(v, allow_none=True),
        "Write True, False, or None for REDISLOCK['RENEW'].",
    ),
    "HEADER": ("django_redislock.E065", _header_error, "Use 'Idempotency-Key'."),
    "REPLAY_HEADERS": ("django_redislock.E065", _headers_error, "Use e.g. ['Location']."),
    "CREDENTIAL_HEADERS": (
        "django_redislock.E065",
        _credentials_error,
        "Use e.g. ['Authorization', 'X-Api-Key'].",
    ),
    "PATHS": (
        "django_redislock.E066",
        _paths_error,
        "Use a list such as [r'^/api/payments/'], or [] for no middleware rule.",
    ),
}


@register_problems
def idempotency_problems() -> list[Problem]:
    """What is wrong with ``REDISLOCK["IDEMPOTENCY"]`` (system checks, no network)."""
    raw = conf.raw.get("IDEMPOTENCY", {})
    if not isinstance(raw, dict):
        return [
            Problem(
                "django_redislock.E060",
                f"REDISLOCK['IDEMPOTENCY'] must be a dict, not {type(raw).__name__}.",
                "Write REDISLOCK['IDEMPOTENCY'] = {'TTL': 86400, ...}, or remove it.",
            )
        ]
    found = unknown_keys("django_redislock.E060", "REDISLOCK['IDEMPOTENCY'] key(s)", raw, SETTINGS)
    for key, (check_id, validate, hint) in VALIDATORS.items():
        if key in raw:
            error = validate(raw[key])
            if error is not None:
                found.append(Problem(check_id, f"REDISLOCK['IDEMPOTENCY'][{key!r}] {error}.", hint))
    found.extend(_middleware_problems(raw))
    return found


def middleware_hooks_after(entries: list[str], ours: int) -> list[str]:
    """The entries after ``ours`` whose ``process_view`` would not run.

    The middleware runs a served view itself, from its own ``process_view``
    (the only way to open the view's transaction inside the key's lock), so
    Django calls no ``process_view`` after it for that request: one there
    (``CsrfViewMiddleware``'s, say) would be skipped.
    """
    found = []
    for entry in entries[ours + 1 :]:
        try:
            cls = import_string(entry)
        except Exception:  # noqa: BLE001 - Django's startup reports an entry that fails to import.
            continue
        if getattr(cls, "process_view", None) is not None:
            found.append(entry)
    return found


def _middleware_problems(raw: dict[str, Any]) -> list[Problem]:
    entries = middleware_entries()
    ours = middleware_index(entries, MIDDLEWARE_PATH)
    if raw.get("PATHS") and ours is None:
        return [
            Problem(
                "django_redislock.E067",
                "REDISLOCK['IDEMPOTENCY']['PATHS'] is set, but IdempotencyMiddleware is not in "
                "MIDDLEWARE: no path is ever served.",
                f"Add {MIDDLEWARE_PATH!r} to MIDDLEWARE (last, after AuthenticationMiddleware), "
                "or remove PATHS.",
            )
        ]
    if ours is None:
        return []
    found = []
    skipped = middleware_hooks_after(entries, ours)
    if skipped:
        found.append(
            Problem(
                "django_redislock.E068",
                f"{', '.join(skipped)} come(s) after IdempotencyMiddleware and has process_view(): "
                "IdempotencyMiddleware runs the views of PATHS itself, so that hook would not "
                "run for them.",
                f"Move {MIDDLEWARE_PATH!r} after it in MIDDLEWARE (last is best).",
            )
        )
    auth = middleware_index(entries, AUTH_MIDDLEWARE_PATH)
    if raw.get("SCOPE", "user") == "user" and (auth is None or auth > ours):
        where = "is not in MIDDLEWARE" if auth is None else "comes after IdempotencyMiddleware"
        found.append(
            Problem(
                "django_redislock.W060",
                f"Idempotency keys are per user, but AuthenticationMiddleware {where}: "
                "request.user is not set when IdempotencyMiddleware runs, so every key is "
                "scoped per IP address instead.",
                f"Put {MIDDLEWARE_PATH!r} after {AUTH_MIDDLEWARE_PATH!r} in MIDDLEWARE, or set "
                "REDISLOCK['IDEMPOTENCY']['SCOPE'] = 'ip' if that is what you want.",
            )
        )
    return found


@dataclasses.dataclass(frozen=True)
class Policy:
    """What one call honours: the settings with a decorator's arguments over them."""

    methods: frozenset[str]
    header: str
    required: bool
    scope: Any
    credential_headers: tuple[str, ...] | None  # None: REDISLOCK['CREDENTIAL_HEADERS']
    ttl: float
    max_key_length: int
    max_body: int
    replay_headers: tuple[str, ...]
    store_client_errors: bool
    paths: tuple[re.Pattern[str], ...]
    wait: float
    timeout: float | None
    renew: bool | None
    alias: str | None  # the CACHES entry; None for REDISLOCK["CACHE"]

    def storable(self, status: int) -> bool:
        """Whether a response with ``status`` is kept for replay."""
        if status >= 500 or status in RETRYABLE_STATUSES:
            return False
        return status < 400 or self.store_client_errors


def policy(overrides: dict[str, Any]) -> Policy:
    """Settings, then the decorator's arguments; read per request (``override_settings``)."""
    raw = conf.IDEMPOTENCY
    value = {key: overrides.get(key, raw.get(key, default)) for key, default in SETTINGS.items()}
    for key, (_, validate, hint) in VALIDATORS.items():
        if key in raw and key not in overrides and validate(raw[key]) is not None:
            # manage.py check reports it; a request must not become a 500.
            logger.error(
                "REDISLOCK['IDEMPOTENCY'][%r] is invalid (%s); using the default", key, hint
            )
            value[key] = SETTINGS[key]
    return Policy(
        methods=frozenset(value["METHODS"]),
        header=value["HEADER"],
        required=value["REQUIRED"],
        scope=value["SCOPE"],
        credential_headers=None
        if value["CREDENTIAL_HEADERS"] is None
        else tuple(value["CREDENTIAL_HEADERS"]),
        ttl=float(value["TTL"]),
        max_key_length=value["MAX_KEY_LENGTH"],
        max_body=value["MAX_BODY"],
        replay_headers=tuple(value["REPLAY_HEADERS"]),
        store_client_errors=value["STORE_CLIENT_ERRORS"],
        paths=_compiled(tuple(value["PATHS"])),
        wait=float(value["WAIT"]),
        timeout=None if value["TIMEOUT"] is None else float(value["TIMEOUT"]),
        renew=value["RENEW"],
        alias=overrides.get("alias"),
    )


@functools.lru_cache(maxsize=16)
def _compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(pattern) for pattern in patterns)


def check_arguments(overrides: dict[str, Any]) -> None:
    """Refuse a decorator's bad argument when it is applied, as the checks refuse a setting."""
    for key, value in overrides.items():
        if key == "alias":
            if not isinstance(value, str) or not value:
                raise TypeError(f"idempotent(): alias must name a CACHES entry, not {value!r}")
            continue
        error = VALIDATORS[key][1](value)
        if error is not None:
            raise (TypeError if "True or False" in error else ValueError)(
                f"idempotent(): {key.lower()} {error}"
            )
