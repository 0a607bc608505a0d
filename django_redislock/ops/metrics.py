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
* **Which series exist from the start** (``OUTCOMES``, ``WAIT_OUTCOMES``,
  ``HOLD_OUTCOMES``, ``CAUSES``): every name declared (``signals.declare``:
  a decorator's template, a throttling rule, a unique task) or first seen
  gets all of its series at 0, so that an alert on ``increase()`` sees the
  first loss after a deploy.
* **How many names a lock counts as** (``width_of``): a lock on several
  names counts once per name, in every metric.
* **The levels of throttling semaphores** (``semaphore_levels``): permits in
  use and requests queued, read from Redis when a metrics backend asks for
  them (a scrape), not counted per process, within ``SCRAPE_TIMEOUT``
  (``levels_within``) however long Redis takes.

The setting is read when the app loads, and again when ``override_settings``
changes ``REDISLOCK``.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from importlib.util import find_spec
from typing import Any

from django.core.signals import setting_changed

from .. import signals
from ..checks import Problem, register_problems
from ..conf import conf
from ..core import CAUSES, LockBase, SemaphoreBase
from .levels import SCRAPE_TIMEOUT, Level, levels_within, semaphore_levels

__all__ = [
    "BACKENDS",
    "CAUSES",
    "HOLD_OUTCOMES",
    "KINDS",
    "MAX_NAMES",
    "OTHER",
    "OUTCOMES",
    "admitted",
    "SCRAPE_TIMEOUT",
    "WAIT_OUTCOMES",
    "Level",
    "Zeroes",
    "installed",
    "key_family",
    "kind_of",
    "label_of",
    "levels_within",
    "metric_problems",
    "semaphore_levels",
    "sync",
    "width_of",
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

# The values of ``kind`` and ``outcome`` every backend uses.
KINDS = ("lock", "semaphore")
OUTCOMES = ("acquired", "busy", "lost", "unavailable", "fail_open")
WAIT_OUTCOMES = ("acquired", "busy")
# A hold ends in a release, or in a loss (timed to the moment it was found).
HOLD_OUTCOMES = ("released", "lost")

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


def admitted(name: str) -> str:
    """``name`` as a label value, within the process's bound of names."""
    return names.admit(name)


def label_of(lock: LockBase) -> str:
    """The bounded name metrics give ``lock``."""
    name = lock.metric_name
    return OTHER if not name else names.admit(name)


def kind_of(lock: LockBase) -> str:
    return "semaphore" if isinstance(lock, SemaphoreBase) else "lock"


def width_of(lock: Any) -> int:
    """How many names ``lock`` counts as: one per name of a multi-lock."""
    names = getattr(lock, "names", None)
    return len(names) if isinstance(names, tuple) and names else 1


def key_family(kind: str) -> str | None:
    """The key family a declared ``kind`` names (``signals.KEY_FAMILIES``), or None."""
    return kind if kind in signals.KEY_FAMILIES else None


class Zeroes:
    """The ``(name, kind)`` pairs a backend has made every series of, at 0.

    ``make(name, kind)`` makes them; called once per pair, the first time the
    pair is declared or seen (``ensure``). A set look-up per event after that.
    """

    def __init__(self, make: Callable[[str, str], None]) -> None:
        self._make = make
        self._made: set[tuple[str, str]] = set()
        self._mutex = threading.Lock()

    def ensure(self, name: str, kind: str) -> None:
        key = (name, kind)
        if key in self._made:
            return
        with self._mutex:
            if key in self._made:
                return
            self._make(name, kind)
            self._made.add(key)

    def declared(self, name: str, kind: str) -> None:
        """A ``signals.declare``: admitted against the bound of names first."""
        self.ensure(names.admit(name), kind)

    def clear(self) -> None:
        with self._mutex:
            self._made.clear()


def declare_rules() -> None:
    """Declare every global throttling rule known (the setting's, and those of
    ``concurrency_limited`` views imported): their series start at 0."""
    from ..throttling.middleware import decorated_rules
    from ..throttling.rules import current_rules

    for rule in [*current_rules(), *decorated_rules.values()]:
        signals.declare(rule.name, "semaphore")


def unavailable_label(sender: Any, name: str, lock: LockBase | None) -> tuple[str, str]:
    """``(label, kind)`` of a ``redis_unavailable`` signal."""
    if lock is not None:
        return label_of(lock), kind_of(lock)
    from ..throttling.middleware import ConcurrencyLimitMiddleware

    if sender is ConcurrencyLimitMiddleware:
        # The throttling middleware sends the rule's name.
        return names.admit(name), "semaphore"
    return OTHER, "lock"


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
    # The rules of the settings as they are now (override_settings included).
    if _installed:
        declare_rules()


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
