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
    "Rule",
    "current_rules",
    "make_rule",
    "matching_rules",
    "rule_problems",
]

logger = logging.getLogger("django_redislock.throttle")

PER_CHOICES = ("global", "user", "ip")
RULE_KEYS = frozenset(
    {"name", "path", "url_name", "methods", "limit", "per", "wait", "timeout", "retry_after"}
)


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


def _strings(value: object) -> list[str] | None:
    """A string or a non-empty list/tuple of non-empty strings, as a list."""
    if isinstance(value, str):
        return [value] if value else None
    if isinstance(value, (list, tuple, set, frozenset)) and value:
        items = list(value)
        if all(isinstance(v, str) and v for v in items):
            return items
    return None


def make_rule(
    spec: dict[str, Any], *, where: str = "rule", errors: list[RuleError] | None = None
) -> Rule | None:
    """Build a Rule from a dict. Raises the first RuleError, or collects them all
    into ``errors`` (and returns None) when a list is given."""
    found: list[RuleError] = []

    def bad(check_id: str, msg: str, hint: str) -> None:
        found.append(RuleError(check_id, f"{where}: {msg}", hint))

    name = spec.get("name")
    if not isinstance(name, str) or not name.strip():
        bad(
            "django_redislock.E021",
            f"'name' must be a non-empty string; got {name!r}.",
            "Give every rule a unique name, e.g. 'name': 'reports'.",
        )
    unknown = sorted(set(spec) - RULE_KEYS)
    if unknown:
        bad(
            "django_redislock.E022",
            f"unknown key(s) {', '.join(map(repr, unknown))}.",
            "Valid keys: " + ", ".join(sorted(RULE_KEYS)) + ".",
        )
    path = spec.get("path")
    pattern = None
    if path is not None:
        if not isinstance(path, str):
            bad(
                "django_redislock.E023",
                f"'path' must be a regular expression string; got {path!r}.",
                "Use a string such as r'^/reports/'.",
            )
        else:
            try:
                pattern = re.compile(path)
            except re.error as exc:
                bad(
                    "django_redislock.E023",
                    f"'path' {path!r} is not a valid regular expression: {exc}.",
                    "Fix the pattern; it is matched with re.search against request.path_info.",
                )
    per = spec.get("per", "global")
    key_func = None
    if callable(per):
        key_func = per
    elif not isinstance(per, str) or not per:
        bad(
            "django_redislock.E024",
            f"'per' must be 'global', 'user', 'ip' or a dotted path; got {per!r}.",
            "Use one of 'global', 'user', 'ip', or 'package.module.function' taking the request.",
        )
    elif per not in PER_CHOICES:
        if "." not in per:
            bad(
                "django_redislock.E024",
                f"'per' {per!r} is not 'global', 'user', 'ip' or a dotted path.",
                "Use one of 'global', 'user', 'ip', or 'package.module.function'.",
            )
        else:
            try:
                key_func = import_string(per)
            except ImportError as exc:
                bad(
                    "django_redislock.E024",
                    f"'per' {per!r} cannot be imported: {exc}.",
                    "Point it at a callable taking the request and returning a string key.",
                )
            else:
                if not callable(key_func):
                    bad(
                        "django_redislock.E024",
                        f"'per' {per!r} is not callable.",
                        "Point it at a callable taking the request and returning a string key.",
                    )
    limit = spec.get("limit")
    problem = count_problem(limit, low=1, high=MAX_COUNT, unit="permits")
    if problem is not None:
        bad(
            "django_redislock.E025",
            f"'limit' {problem}.",
            "Set 'limit' to how many requests may run at once, e.g. 'limit': 2.",
        )
    wait = spec.get("wait", 0)
    problem = seconds_problem(wait, allow_zero=True)
    if problem is not None:
        bad(
            "django_redislock.E026",
            f"'wait' {problem}.",
            "Set 'wait' to how long a request may queue for a permit, e.g. 'wait': 0.5.",
        )
    timeout = spec.get("timeout")
    problem = None if timeout is None else seconds_problem(timeout, allow_zero=False)
    if problem is not None:
        bad(
            "django_redislock.E027",
            f"'timeout' {problem}.",
            "Set 'timeout' to the longest a request may hold its permit, or remove it to use "
            "REDISLOCK['PERMIT_TIMEOUT'].",
        )
    methods = spec.get("methods")
    method_set = None
    if methods is not None:
        items = _strings(methods)
        if items is None or not all(re.fullmatch(r"[A-Za-z]+", m) for m in items):
            bad(
                "django_redislock.E028",
                f"'methods' must be an HTTP method or a list of them; got {methods!r}.",
                "Use e.g. 'methods': ['POST', 'PUT'].",
            )
        else:
            method_set = frozenset(m.upper() for m in items)
    url_name = spec.get("url_name")
    url_names = None
    if url_name is not None:
        items = _strings(url_name)
        if items is None:
            bad(
                "django_redislock.E029",
                f"'url_name' must be a URL name or a list of them; got {url_name!r}.",
                "Use the name given to path(), with its namespace: e.g. 'reports:detail'.",
            )
        else:
            url_names = frozenset(items)
    retry_after = spec.get("retry_after")
    problem = None if retry_after is None else seconds_problem(retry_after, allow_zero=False)
    if problem is not None:
        bad(
            "django_redislock.E030",
            f"'retry_after' {problem}.",
            "Set 'retry_after' to the Retry-After a throttled client gets, or remove it.",
        )
    if found:
        if errors is None:
            raise found[0]
        errors.extend(found)
        return None
    return Rule(
        name=str(name),
        limit=int(limit),  # type: ignore[arg-type]
        per=per if isinstance(per, str) else getattr(per, "__qualname__", "key"),
        wait=float(wait),
        timeout=None if timeout is None else float(timeout),
        retry_after=None if retry_after is None else float(retry_after),
        path=pattern,
        url_names=url_names,
        methods=method_set,
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
