"""Optional metrics of lock contention: which backends are on, and what they share.

``REDISLOCK["METRICS"]`` names the backends to feed (``"prometheus"``,
``"opentelemetry"``). A backend lives in ``django_redislock.contrib.<backend>``
and is imported, and its sink added to the lock events (``signals.py``), only when
the setting names it. With the setting empty (the default) nothing is
connected and no metrics library is imported: locks pay nothing.

What every backend shares is decided here:

* **The label of a lock** (``label_of``): the lock's ``metric_name`` (the
  decorator's template, the throttling rule's name, or what the caller gave),
  never its full name, so that the number of series stays bounded. A lock
  without one counts as ``"other"``; past ``MAX_NAMES`` distinct names in a
  process, new ones count as ``"other"`` too, with one warning.
* **The levels of throttling semaphores** (``semaphore_levels``): permits in
  use and requests queued, read from Redis when a metrics backend asks for
  them (a scrape), not counted per process.

The setting is read when the app loads, and again when ``override_settings``
changes ``REDISLOCK``.
"""

from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import dataclass
from importlib.util import find_spec
from typing import Any

from django.core.signals import setting_changed

from ..checks import Problem, register_problems
from ..conf import conf
from ..core.drivers.base import LockBase
from ..core.drivers.semaphore import SemaphoreBase

__all__ = [
    "BACKENDS",
    "MAX_NAMES",
    "OTHER",
    "Level",
    "installed",
    "kind_of",
    "label_of",
    "metric_problems",
    "semaphore_levels",
    "sync",
]

logger = logging.getLogger("django_redislock.metrics")

# backend -> (module that implements it, module whose presence it needs, the
# distribution that brings that module: what its extra of the same name installs)
BACKENDS: dict[str, tuple[str, str, str]] = {
    "prometheus": ("django_redislock.contrib.prometheus", "prometheus_client", "prometheus-client"),
    "opentelemetry": (
        "django_redislock.contrib.opentelemetry",
        "opentelemetry.trace",
        "opentelemetry-api",
    ),
}

OTHER = "other"

# Distinct label values one process admits. Templates and rule names are few;
# this only stops a metric_name built from per-call data from growing the
# metrics without end.
MAX_NAMES = 500


# -- labels -------------------------------------------------------------------------
class _Names:
    """The bounded set of label values seen in this process."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._mutex = threading.Lock()
        self._warned = False

    def admit(self, name: str) -> str:
        if name in self._seen:  # the common case: no lock taken
            return name
        with self._mutex:
            if name in self._seen:
                return name
            if len(self._seen) < self.limit:
                self._seen.add(name)
                return name
            warn, self._warned = not self._warned, True
        if warn:
            logger.warning(
                "more than %d distinct lock metric names in this process; %r and any "
                "further ones are counted as %r. Name locks by what they protect "
                "('purchase'), not by id ('purchase:42').",
                self.limit,
                name,
                OTHER,
            )
        return OTHER

    def clear(self) -> None:
        with self._mutex:
            self._seen.clear()
            self._warned = False


names = _Names(MAX_NAMES)


def label_of(lock: LockBase) -> str:
    """The bounded name metrics give ``lock``."""
    name = lock.metric_name
    return OTHER if not name else names.admit(name)


def kind_of(lock: LockBase) -> str:
    return "semaphore" if isinstance(lock, SemaphoreBase) else "lock"


def unavailable_label(sender: Any, name: str, lock: LockBase | None) -> tuple[str, str]:
    """``(label, kind)`` of a ``redis_unavailable`` signal."""
    if lock is not None:
        return label_of(lock), kind_of(lock)
    from ..throttling.middleware import ConcurrencyLimitMiddleware

    if sender is ConcurrencyLimitMiddleware:
        # The throttling middleware sends the rule's name.
        return names.admit(name), "semaphore"
    return OTHER, "lock"


# -- semaphore levels ---------------------------------------------------------------
@dataclass(frozen=True)
class Level:
    """One throttling rule's semaphore, as Redis has it now."""

    name: str
    in_use: int
    limit: int
    waiting: int


def semaphore_levels() -> list[Level]:
    """Permits in use and requests waiting, for every global throttling rule.

    Rules come from ``REDISLOCK["THROTTLE"]`` and from ``concurrency_limited``
    views this process has imported. A per-client rule has one semaphore per
    client and is left out: listing them would take a SCAN per scrape. One
    read-only script per rule; raises ``RedisUnavailable``.
    """
    from ..connection import get_client
    from ..core.ops.inspection import find
    from ..locking.factories import keyspace
    from ..throttling.middleware import decorated_rules, semaphore_name
    from ..throttling.rules import current_rules

    rules = {rule.name: rule for rule in current_rules() if not rule.per_client}
    for name, rule in list(decorated_rules.items()):
        if not rule.per_client:
            rules.setdefault(name, rule)
    if not rules:
        return []
    by_semaphore = {semaphore_name(rule, None): rule for rule in rules.values()}
    rows, _missing = find(get_client(), keyspace(), by_semaphore, kinds=("semaphore",))
    found = {row.name: row for row in rows}
    levels = []
    for sem_name, rule in by_semaphore.items():
        row = found.get(sem_name)
        levels.append(
            Level(
                name=rule.name,
                in_use=len(row.holders) if row is not None else 0,
                limit=rule.limit,
                waiting=row.waiters if row is not None else 0,
            )
        )
    return levels


# -- switching backends on and off --------------------------------------------------
_installed: dict[str, Any] = {}
_sync_mutex = threading.Lock()


def installed() -> list[str]:
    """The backends whose sinks hear the lock events now."""
    return sorted(_installed)


def sync() -> None:
    """Connect the backends ``REDISLOCK["METRICS"]`` names; disconnect the others.

    A backend that cannot be imported is logged and left out (``manage.py
    check`` reports it as ``django_redislock.E041``): metrics never stop a site.
    """
    wanted = [b for b in conf.METRICS if isinstance(b, str) and b in BACKENDS]
    with _sync_mutex:
        for backend in list(_installed):
            if backend not in wanted:
                _installed.pop(backend).uninstall()
        for backend in wanted:
            if backend in _installed:
                continue
            try:
                module = importlib.import_module(BACKENDS[backend][0])
            except ImportError as exc:
                logger.error(
                    "REDISLOCK['METRICS'] names %r, which cannot be imported (%s); "
                    "python -m pip install %s",
                    backend,
                    exc,
                    BACKENDS[backend][2],
                )
                continue
            module.install()
            _installed[backend] = module


def _on_setting_changed(setting: str, **kwargs: Any) -> None:
    if setting == "REDISLOCK":
        sync()


setting_changed.connect(_on_setting_changed, dispatch_uid="django_redislock.metrics")


# -- checks ---------------------------------------------------------------------------
def _installed_package(module: str) -> bool:
    try:
        return find_spec(module) is not None
    except ImportError:  # a parent package is missing
        return False


@register_problems
def metric_problems() -> list[Problem]:
    """System check of ``REDISLOCK["METRICS"]``: known backends, installed packages."""
    raw = conf.raw.get("METRICS", [])
    valid = ", ".join(map(repr, BACKENDS))
    if not isinstance(raw, (list, tuple)) or not all(isinstance(b, str) for b in raw):
        return [
            Problem(
                "django_redislock.E040",
                f"REDISLOCK['METRICS'] must be a list of backend names; got {raw!r}.",
                f"Set it to a list of some of {valid}, or [] for no metrics.",
            )
        ]
    found = []
    for backend in raw:
        if backend not in BACKENDS:
            found.append(
                Problem(
                    "django_redislock.E040",
                    f"REDISLOCK['METRICS'] names an unknown backend {backend!r}.",
                    f"Use some of {valid}.",
                )
            )
            continue
        _module, package, distribution = BACKENDS[backend]
        if not _installed_package(package):
            found.append(
                Problem(
                    "django_redislock.E041",
                    f"REDISLOCK['METRICS'] names {backend!r}, but {package.split('.')[0]} "
                    "is not installed.",
                    f"Install it with: python -m pip install {distribution} (the "
                    f"{backend!r} extra of django-redislock), or remove {backend!r} "
                    "from REDISLOCK['METRICS'].",
                )
            )
    return found
