"""Prometheus metrics of lock contention, fed by the lock events (``signals.py``).

Turned on by ``REDISLOCK = {"METRICS": ["prometheus"]}`` (and the
``prometheus`` extra); until then this module is never imported. It defines,
on ``prometheus_client``'s default registry:

``redislock_wait_seconds`` (histogram; ``name``, ``kind``, ``outcome``)
    How long each acquire waited, ``outcome`` ``acquired`` or ``busy``.
``redislock_hold_seconds`` (histogram; ``name``, ``kind``, ``outcome``)
    How long each lock or permit was held, up to its release (``released``)
    or to the moment its loss was found (``lost``).
``redislock_outcomes_total`` (counter; ``name``, ``kind``, ``outcome``)
    ``acquired``, ``busy``, ``lost``, ``unavailable`` (Redis down, failing
    closed) and ``fail_open`` (Redis down, the code ran unlocked).
``redislock_losses_total`` (counter; ``name``, ``kind``, ``cause``)
    Leases lost, by cause: ``expired``, ``force_released``, ``redis_lost``.
``redislock_idempotency_keys_total``, ``redislock_unique_tasks_total``
    (counters; ``name``, ``outcome``) Idempotency keys by view, unique
    tasks' keys by template: ``claimed``, ``replayed``, ``refused``,
    ``released`` (``signals.count_key``).
``redislock_permits_in_use``, ``redislock_permits_limit``, ``redislock_queue_length``
    (gauges; ``name``) Each global throttling rule's semaphore, read from
    Redis at scrape time by ``SemaphoreCollector``.

``name`` is the lock's template (``"purchase:{product_id}"``), the throttling
rule's name, a ``metric_name`` given in code, or ``"other"``; ``kind`` is
``lock`` or ``semaphore``. Every series of a name exists from the moment it
is declared or first used, at 0 (``ops/metrics.py``). See
``docs/metrics.rst`` for queries and for prometheus_client's multiprocess
mode (gunicorn), which these metrics support.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

from django.http import HttpRequest, HttpResponse
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from .. import signals
from ..core import LockBase, RedisUnavailable
from ..ops.metrics import (
    CAUSES,
    HOLD_OUTCOMES,
    KINDS,
    OTHER,
    WAIT_OUTCOMES,
    Zeroes,
    admitted,
    key_family,
    kind_of,
    label_of,
    levels_within,
    unavailable_label,
    width_of,
)
from ..ops.metrics import OUTCOMES as OUTCOME_VALUES
from ..signals import KEY_OUTCOMES

__all__ = [
    "HOLD",
    "LOSSES",
    "OUTCOMES",
    "WAIT",
    "SemaphoreCollector",
    "install",
    "metrics_view",
    "uninstall",
]

logger = logging.getLogger("django_redislock.metrics")

# An uncontended acquire takes a round trip (well under a millisecond on a
# LAN); a contended one up to its ``wait``, 10 s by default.
WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# Holds run from a fast view to a long task.
HOLD_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)

WAIT = Histogram(
    "redislock_wait_seconds",
    "Time an acquire waited for a lock or permit, by outcome (acquired, busy).",
    ["name", "kind", "outcome"],
    buckets=WAIT_BUCKETS,
)
HOLD = Histogram(
    "redislock_hold_seconds",
    "Time a lock or permit was held, up to its release or the loss found (outcome).",
    ["name", "kind", "outcome"],
    buckets=HOLD_BUCKETS,
)
OUTCOMES = Counter(
    "redislock_outcomes",
    "Acquires by outcome (acquired, busy, unavailable, fail_open) and leases lost.",
    ["name", "kind", "outcome"],
)
LOSSES = Counter(
    "redislock_losses",
    "Leases lost, by cause (expired, force_released, redis_lost).",
    ["name", "kind", "cause"],
)
KEYS = {
    "idempotency": Counter(
        "redislock_idempotency_keys",
        "Idempotency keys by outcome (claimed, replayed, refused, released), per view.",
        ["name", "outcome"],
    ),
    "unique_task": Counter(
        "redislock_unique_tasks",
        "Unique tasks' keys by outcome (claimed, replayed, refused, released), per template.",
        ["name", "outcome"],
    ),
}

# Children by label values: ``labels()`` takes a lock and builds a key on
# every call; a dict read does neither. Bounded like the names themselves.
_children: dict[tuple[Any, ...], Any] = {}


def _child(metric: Any, *values: str) -> Any:
    key = (metric, *values)
    child = _children.get(key)
    if child is None:
        child = _children.setdefault(key, metric.labels(*values))
    return child


# -- every series of a name, from the start ------------------------------------------------
def _make_zeroes(name: str, kind: str) -> None:
    """Every series of ``(name, kind)``, at 0: in multiprocess mode too, where
    prometheus_client writes each child to the process's file as it is made."""
    family = key_family(kind)
    if family is not None:
        for outcome in KEY_OUTCOMES:
            _child(KEYS[family], name, outcome)
        return
    for outcome in OUTCOME_VALUES:
        _child(OUTCOMES, name, kind, outcome)
    for outcome in WAIT_OUTCOMES:
        _child(WAIT, name, kind, outcome)
    for outcome in HOLD_OUTCOMES:
        _child(HOLD, name, kind, outcome)
    for cause in CAUSES:
        _child(LOSSES, name, kind, cause)


zeroes = Zeroes(_make_zeroes)


def _series(lock: LockBase) -> tuple[str, str]:
    name, kind = label_of(lock), kind_of(lock)
    zeroes.ensure(name, kind)
    return name, kind


# -- the sink ----------------------------------------------------------------------------
class _Sink:
    """Hears the lock events (``signals.add_sink``) and counts them."""

    def declared(self, name: str, kind: str) -> None:
        zeroes.declared(name, kind)

    def acquired(self, lock: LockBase, waited: float) -> None:
        name, kind = _series(lock)
        _child(WAIT, name, kind, "acquired").observe(waited)
        _child(OUTCOMES, name, kind, "acquired").inc()

    def busy(self, lock: LockBase, waited: float) -> None:
        name, kind = _series(lock)
        _child(WAIT, name, kind, "busy").observe(waited)
        _child(OUTCOMES, name, kind, "busy").inc()

    def released(self, lock: LockBase, held: float) -> None:
        name, kind = _series(lock)
        _child(HOLD, name, kind, "released").observe(held)

    def lost(self, lock: LockBase, reason: str) -> None:
        name, kind = _series(lock)
        _child(OUTCOMES, name, kind, "lost").inc()
        loss = lock.loss
        if loss is not None:
            # Lost holds are timed too: "should we raise TIMEOUT?" needs them.
            _child(HOLD, name, kind, "lost").observe(loss.held_seconds)
            _child(LOSSES, name, kind, loss.cause).inc()

    def key(self, family: str, name: str, outcome: str) -> None:
        label = admitted(name)
        zeroes.ensure(label, family)
        _child(KEYS[family], label, outcome).inc()

    def unavailable(
        self, sender: Any, name: str, error: BaseException, fail_open: bool, lock: LockBase | None
    ) -> None:
        label, kind = unavailable_label(sender, name, lock)
        zeroes.ensure(label, kind)
        outcome = "fail_open" if fail_open else "unavailable"
        _child(OUTCOMES, label, kind, outcome).inc(width_of(lock))


sink = _Sink()


# -- gauges read at scrape time ---------------------------------------------------------
class SemaphoreCollector:
    """Permits in use, limit and queue length of each global throttling rule.

    Read from Redis when scraped (one read-only script per rule), so the value
    is the same whichever process answers the scrape, and nothing is counted
    per process. A per-client rule is left out (one semaphore per client).
    Redis unreachable: the gauges are left out of that scrape and a warning is
    logged.
    """

    def describe(self) -> list[Metric]:
        # Registering must not read Redis: describe what collect() yields.
        return list(self._families())

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "redislock_permits_in_use",
                "Permits of a throttling rule's semaphore held now (read from Redis).",
                labels=["name"],
            ),
            GaugeMetricFamily(
                "redislock_permits_limit",
                "Permits a throttling rule allows at once.",
                labels=["name"],
            ),
            GaugeMetricFamily(
                "redislock_queue_length",
                "Requests queued for a throttling rule's permit now (read from Redis).",
                labels=["name"],
            ),
        )

    def collect(self) -> Iterator[Metric]:
        try:
            # Within the scrape's own bound, not the socket timeout of lock calls.
            levels = levels_within()
        except RedisUnavailable as exc:
            logger.warning("could not read the throttling semaphores for metrics: %s", exc)
            return
        in_use, limit, queue = self._families()
        for level in levels:
            in_use.add_metric([level.name], level.in_use)
            limit.add_metric([level.name], level.limit)
            queue.add_metric([level.name], level.waiting)
        yield from (in_use, limit, queue)


collector = SemaphoreCollector()
_registered = False


# -- switching on and off -----------------------------------------------------------------
def install() -> None:
    """Add the sink and register the gauges (``metrics.sync`` calls it)."""
    global _registered
    signals.add_sink(sink)
    if not _registered:
        REGISTRY.register(collector)
        _registered = True
    # Ad-hoc locks (no metric_name) count as "other": it exists from the start too.
    for kind in KINDS:
        zeroes.ensure(OTHER, kind)
    for name, kind in signals.declared():
        zeroes.declared(name, kind)


def uninstall() -> None:
    """Remove the sink and unregister the gauges; counts already made stay."""
    global _registered
    signals.remove_sink(sink)
    if _registered:
        REGISTRY.unregister(collector)
        _registered = False


# -- exposition ---------------------------------------------------------------------------
def registry() -> CollectorRegistry:
    """The registry to expose: the default one, or, in multiprocess mode
    (``PROMETHEUS_MULTIPROC_DIR`` set), one that merges every process's files
    and adds the gauges read from Redis."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return REGISTRY
    from prometheus_client import multiprocess

    merged = CollectorRegistry()
    multiprocess.MultiProcessCollector(merged)
    merged.register(SemaphoreCollector())
    return merged


def metrics_view(request: HttpRequest) -> HttpResponse:
    """A Django view in Prometheus' text format; route it where only your
    scraper can reach it: ``path("metrics", metrics_view)``."""
    return HttpResponse(generate_latest(registry()), content_type=CONTENT_TYPE_LATEST)
