"""Throttling rules: parsing, validation (system checks) and matching requests.

A rule is a dict in ``REDISLOCK["THROTTLE"]``::

    {"name": "reports", "path": r"^/reports/", "limit": 2, "per": "global", "wait": 0.5}

Bad rules are reported by ``manage.py check`` (IDs E020 to E030) and skipped
at request time with a logged error, never turned into a 500.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest
from django.urls import Resolver404, resolve
from django.utils.module_loading import import_string

from ..checks import Problem, register_problems
from ..conf import conf
from ..core import MAX_COUNT, count_problem, seconds_problem

__all__ = [
    "PER_CHOICES",
    "RULE_CHECKS",
    "Invalid",
    "Rule",
    "RuleError",
    "RuleKey",
    "current_rules",
    "make_rule",
    "matching_rules",
    "rule_problems",
]

logger = logging.getLogger("django_redislock.throttle")

PER_CHOICES = ("global", "user", "ip")


class RuleError(ValueError):
    """One thing wrong with one rule; ``check_id`` is its system check ID."""

    def __init__(self, check_id: str, msg: str, hint: str) -> None:
        super().__init__(f"{msg} {hint}")
        self.check_id = check_id
        self.msg = msg
        self.hint = hint


@dataclass(frozen=True)
class Rule:
    name: str
    limit: int
    per: str = "global"
    wait: float = 0.0
    # Permit TTL (seconds); None means REDISLOCK["PERMIT_TIMEOUT"] at request time.
    timeout: float | None = None
    retry_after: float | None = None
    path: re.Pattern[str] | None = None
    url_names: frozenset[str] | None = None
    methods: frozenset[str] | None = None
    key_func: Callable[[HttpRequest], Any] | None = None

    @property
    def per_client(self) -> bool:
        return self.per != "global"


# -- a rule's keys, one row each ------------------------------------------------------------
# A row reads one key's value into what a Rule holds, or raises Invalid: what
# is wrong (the message is "<where>: '<key>' <what is wrong>."), and a hint
# where the row's own does not fit that case.
class Invalid(ValueError):
    def __init__(self, problem: str, hint: str | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.hint = hint


@dataclass(frozen=True)
class RuleKey:
    key: str
    check_id: str
    read: Callable[[Any], Any]
    hint: str
    default: Any = None  # what a rule without the key has
    optional: bool = True  # None means "not set", and is not read


def _name(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise Invalid(f"must be a non-empty string; got {value!r}")
    return value


def _path(value: Any) -> re.Pattern[str]:
    if not isinstance(value, str):
        raise Invalid(f"must be a regular expression string; got {value!r}")
    try:
        return re.compile(value)
    except re.error as exc:
        raise Invalid(
            f"{value!r} is not a valid regular expression: {exc}",
            "Fix the pattern; it is matched with re.search against request.path_info.",
        ) from None


_KEY_FUNC_HINT = "Point it at a callable taking the request and returning a string key."


def _per(value: Any) -> tuple[str, Callable[[HttpRequest], Any] | None]:
    """(what the rule shows as its ``per``, the function of the request it counts by)."""
    if callable(value):
        return getattr(value, "__qualname__", "key"), value
    if not isinstance(value, str) or not value:
        raise Invalid(f"must be 'global', 'user', 'ip' or a dotted path; got {value!r}")
    if value in PER_CHOICES:
        return value, None
    if "." not in value:
        raise Invalid(
            f"{value!r} is not 'global', 'user', 'ip' or a dotted path",
            "Use one of 'global', 'user', 'ip', or 'package.module.function'.",
        )
    try:
        key_func = import_string(value)
    except ImportError as exc:
        raise Invalid(f"{value!r} cannot be imported: {exc}", _KEY_FUNC_HINT) from None
    if not callable(key_func):
        raise Invalid(f"{value!r} is not callable", _KEY_FUNC_HINT)
    return value, key_func


def _limit(value: Any) -> int:
    problem = count_problem(value, low=1, high=MAX_COUNT, unit="permits")
    if problem is not None:
        raise Invalid(problem)
    return int(value)


def _seconds(*, allow_zero: bool) -> Callable[[Any], float]:
    def read(value: Any) -> float:
        problem = seconds_problem(value, allow_zero=allow_zero)
        if problem is not None:
            raise Invalid(problem)
        return float(value)

    return read


def _strings(value: object) -> list[str] | None:
    """A string or a non-empty list/tuple of non-empty strings, as a list."""
    if isinstance(value, str):
        return [value] if value else None
    if isinstance(value, (list, tuple, set, frozenset)) and value:
        items = list(value)
        if all(isinstance(v, str) and v for v in items):
            return items
    return None


def _methods(value: Any) -> frozenset[str]:
    items = _strings(value)
    if items is None or not all(re.fullmatch(r"[A-Za-z]+", m) for m in items):
        raise Invalid(f"must be an HTTP method or a list of them; got {value!r}")
    return frozenset(m.upper() for m in items)


def _url_names(value: Any) -> frozenset[str]:
    items = _strings(value)
    if items is None:
        raise Invalid(f"must be a URL name or a list of them; got {value!r}")
    return frozenset(items)


# In the order their problems are reported. The IDs are stable: docs/checks.rst lists them.
RULE_CHECKS: tuple[RuleKey, ...] = (
    RuleKey(
        "name",
        "django_redislock.E021",
        _name,
        "Give every rule a unique name, e.g. 'name': 'reports'.",
        optional=False,
    ),
    RuleKey("path", "django_redislock.E023", _path, "Use a string such as r'^/reports/'."),
    RuleKey(
        "per",
        "django_redislock.E024",
        _per,
        "Use one of 'global', 'user', 'ip', or 'package.module.function' taking the request.",
        default="global",
        optional=False,
    ),
    RuleKey(
        "limit",
        "django_redislock.E025",
        _limit,
        "Set 'limit' to how many requests may run at once, e.g. 'limit': 2.",
        optional=False,
    ),
    RuleKey(
        "wait",
        "django_redislock.E026",
        _seconds(allow_zero=True),
        "Set 'wait' to how long a request may queue for a permit, e.g. 'wait': 0.5.",
        default=0,
        optional=False,
    ),
    RuleKey(
        "timeout",
        "django_redislock.E027",
        _seconds(allow_zero=False),
        "Set 'timeout' to the longest a request may hold its permit, or remove it to use "
        "REDISLOCK['PERMIT_TIMEOUT'].",
    ),
    RuleKey(
        "methods",
        "django_redislock.E028",
        _methods,
        "Use e.g. 'methods': ['POST', 'PUT'].",
    ),
    RuleKey(
        "url_name",
        "django_redislock.E029",
        _url_names,
        "Use the name given to path(), with its namespace: e.g. 'reports:detail'.",
    ),
    RuleKey(
        "retry_after",
        "django_redislock.E030",
        _seconds(allow_zero=False),
        "Set 'retry_after' to the Retry-After a throttled client gets, or remove it.",
    ),
)
RULE_KEYS = frozenset(row.key for row in RULE_CHECKS)


def make_rule(
    spec: dict[str, Any], *, where: str = "rule", errors: list[RuleError] | None = None
) -> Rule | None:
    """Build a Rule from a dict. Raises the first RuleError, or collects them all
    into ``errors`` (and returns None) when a list is given."""
    found: list[RuleError] = []
    unknown = sorted(set(spec) - RULE_KEYS)
    if unknown:
        found.append(
            RuleError(
                "django_redislock.E022",
                f"{where}: unknown key(s) {', '.join(map(repr, unknown))}.",
                "Valid keys: " + ", ".join(sorted(RULE_KEYS)) + ".",
            )
        )
    read: dict[str, Any] = {}
    for row in RULE_CHECKS:
        value = spec.get(row.key, row.default)
        if value is None and row.optional:
            read[row.key] = None
            continue
        try:
            read[row.key] = row.read(value)
        except Invalid as bad:
            message = f"{where}: '{row.key}' {bad.problem}."
            found.append(RuleError(row.check_id, message, bad.hint or row.hint))
    if found:
        if errors is None:
            raise found[0]
        errors.extend(found)
        return None
    per, key_func = read["per"]
    return Rule(
        name=read["name"],
        limit=read["limit"],
        per=per,
        wait=read["wait"],
        timeout=read["timeout"],
        retry_after=read["retry_after"],
        path=read["path"],
        url_names=read["url_name"],
        methods=read["methods"],
        key_func=key_func,
    )


def _parse(raw: object) -> tuple[list[Rule], list[RuleError]]:
    errors: list[RuleError] = []
    if not isinstance(raw, (list, tuple)):
        errors.append(
            RuleError(
                "django_redislock.E020",
                f"REDISLOCK['THROTTLE'] must be a list of rule dicts; got {type(raw).__name__}.",
                "Set it to a list such as [{'name': 'reports', 'path': r'^/reports/', "
                "'limit': 2}], or [] for none.",
            )
        )
        return [], errors
    rules: list[Rule] = []
    seen: set[str] = set()
    for index, spec in enumerate(raw):
        where = f"REDISLOCK['THROTTLE'][{index}]"
        if not isinstance(spec, dict):
            errors.append(
                RuleError(
                    "django_redislock.E020",
                    f"{where} must be a dict; got {type(spec).__name__}.",
                    "Write each rule as a dict with at least 'name' and 'limit'.",
                )
            )
            continue
        rule = make_rule(spec, where=where, errors=errors)
        # Checked apart from the rule's other problems, so that none hides it.
        name = spec.get("name")
        if isinstance(name, str) and name.strip():
            if name in seen:
                errors.append(
                    RuleError(
                        "django_redislock.E021",
                        f"{where}: the name {name!r} is used by another rule.",
                        "Rule names name their semaphores: give each rule its own.",
                    )
                )
                continue
            seen.add(name)
        if rule is not None:
            rules.append(rule)
    return rules, errors


@register_problems
def rule_problems() -> list[Problem]:
    """System check: every problem with ``REDISLOCK['THROTTLE']``, no network."""
    raw = conf.raw.get("THROTTLE", [])
    return [Problem(e.check_id, e.msg, e.hint) for e in _parse(raw)[1]]


_cache: tuple[Any, list[Rule]] | None = None


def current_rules() -> list[Rule]:
    """The valid rules of the current settings; bad ones are logged and skipped."""
    global _cache
    raw = conf.raw.get("THROTTLE", [])
    cached = _cache
    # Compare by value, so override_settings and edited lists both take effect.
    if cached is not None and cached[0] == raw:
        return cached[1]
    rules, errors = _parse(raw)
    for error in errors:
        logger.error("ignoring a throttling rule (%s): %s", error.check_id, error)
    try:
        snapshot = [dict(spec) if isinstance(spec, dict) else spec for spec in raw]
    except TypeError:
        snapshot = None
    _cache = (snapshot, rules)
    return rules


class _Resolved:
    """The request's URL name and namespaced view name, resolved at most once."""

    def __init__(self, request: HttpRequest) -> None:
        self.request = request
        self._names: frozenset[str] | None = None

    @property
    def names(self) -> frozenset[str]:
        if self._names is None:
            match = getattr(self.request, "resolver_match", None)
            if match is None:
                try:
                    match = resolve(self.request.path_info, getattr(self.request, "urlconf", None))
                except Resolver404:
                    match = None
            names = set()
            if match is not None:
                if match.url_name:
                    names.add(match.url_name)
                if match.view_name:
                    names.add(match.view_name)
            self._names = frozenset(names)
        return self._names


def matching_rules(request: HttpRequest, rules: Iterable[Rule]) -> list[Rule]:
    """The rules that apply to ``request``: every given matcher must match."""
    resolved = _Resolved(request)
    found = []
    for rule in rules:
        if rule.methods is not None and (request.method or "").upper() not in rule.methods:
            continue
        if rule.path is not None and not rule.path.search(request.path_info):
            continue
        if rule.url_names is not None and not (rule.url_names & resolved.names):
            continue
        found.append(rule)
    return found
