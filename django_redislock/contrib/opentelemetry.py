"""OpenTelemetry spans and metrics of lock contention, fed by the lock events (``signals.py``).

Turned on by ``REDISLOCK = {"METRICS": ["opentelemetry"]}`` (and the
``opentelemetry`` extra, which needs only ``opentelemetry-api``); until then
this module is never imported. It speaks to whatever tracer and meter
providers the application configures with the OpenTelemetry SDK; with none,
the API's no-op providers make every call here nearly free.

OpenTelemetry has no semantic convention for locks, so the attributes live in
a ``redislock.`` namespace of their own; ``error.type`` (a general convention)
names the exception when Redis cannot be reached.

Spans (instrumentation scope ``django_redislock``, kind ``INTERNAL``):

``acquire {name}``
    Around each acquire, from its start to its outcome (ended when the
    outcome is known, with the start it had): ``redislock.name``,
    ``redislock.kind``, ``redislock.outcome`` (``acquired``, ``busy``,
    ``unavailable``, ``fail_open``), ``redislock.waited_seconds`` and,
    when acquired, ``redislock.fence``. Redis unreachable sets the status to
    ERROR; a busy lock is an outcome, not an error.
``hold {name}``
    From the acquire to the release: ``redislock.name``, ``redislock.kind``,
    ``redislock.fence``, ``redislock.held_seconds``. A lost lease ends it
    with status ERROR, ``redislock.held_seconds`` up to the moment the loss
    was found, what the loss's log record says (``redislock.cause``,
    ``redislock.ttl_seconds``, ``redislock.owner``, ``redislock.label``,
    ``redislock.forced_by``) and a ``redislock.lost`` event with the reason.

``REDISLOCK["OTEL_LOCK_NAMES"] = True`` adds ``redislock.lock_name``, the
lock's own name (``purchase:42``), to both spans: off by default, because a
trace backend that indexes attributes pays for each distinct value.

Both are children of the span current where the lock is taken (the request's
span, with the Django instrumentation). The hold span is not made current:
the code under the lock stays a child of the request.

Metrics (same attributes ``redislock.name``, ``redislock.kind``,
``redislock.outcome``): histograms ``redislock.wait.duration`` and
``redislock.hold.duration`` (unit ``s``; a hold's outcome is ``released`` or
``lost``), counters ``redislock.outcomes`` (``acquired``, ``busy``,
``lost``, ``unavailable``, ``fail_open``) and ``redislock.losses``
(attribute ``redislock.cause``), and observable gauges
``redislock.permits.in_use``, ``redislock.permits.limit`` and
``redislock.queue.length`` for global throttling rules, read from Redis at
collection time. The counters of a name declared or first seen start at 0.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import SpanKind, Status, StatusCode

from .. import __version__, signals
from ..conf import conf
from ..core import LockBase, RedisUnavailable
from ..ops.metrics import (
    CAUSES,
    KINDS,
    OTHER,
    OUTCOMES,
    Level,
    Zeroes,
    admitted,
    key_family,
    kind_of,
    label_of,
    levels_within,
    unavailable_label,
    width_of,
)
from ..signals import KEY_OUTCOMES

__all__ = ["install", "uninstall"]

logger = logging.getLogger("django_redislock.metrics")

SCOPE = "django_redislock"
NAME = "redislock.name"
KIND = "redislock.kind"
OUTCOME = "redislock.outcome"
# Durations name their unit: an attribute has none of its own.
WAITED = "redislock.waited_seconds"
FENCE = "redislock.fence"
HELD = "redislock.held_seconds"
CAUSE = "redislock.cause"
# The lock's own name: only with REDISLOCK["OTEL_LOCK_NAMES"] (cardinality).
LOCK_NAME = "redislock.lock_name"

# The same boundaries as the Prometheus histograms.
WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
HOLD_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)

# Proxies until the application sets its providers, then the real ones.
tracer = trace.get_tracer(SCOPE, __version__)
meter = metrics.get_meter(SCOPE, __version__)

wait_duration = meter.create_histogram(
    "redislock.wait.duration",
    unit="s",
    description="Time an acquire waited for a lock or permit.",
    explicit_bucket_boundaries_advisory=WAIT_BUCKETS,
)
hold_duration = meter.create_histogram(
    "redislock.hold.duration",
    unit="s",
    description="Time a lock or permit was held, up to its release.",
    explicit_bucket_boundaries_advisory=HOLD_BUCKETS,
)
outcomes = meter.create_counter(
    "redislock.outcomes",
    unit="{event}",
    description="Acquires by outcome (acquired, busy, unavailable, fail_open) and leases lost.",
)
losses = meter.create_counter(
    "redislock.losses",
    unit="{lease}",
    description="Leases lost, by cause (expired, force_released, redis_lost).",
)
keys = {
    "idempotency": meter.create_counter(
        "redislock.idempotency.keys",
        unit="{key}",
        description="Idempotency keys by outcome (claimed, replayed, refused, released).",
    ),
    "unique_task": meter.create_counter(
        "redislock.unique_tasks",
        unit="{key}",
        description="Unique tasks' keys by outcome (claimed, replayed, refused, released).",
    ),
}


def _make_zeroes(name: str, kind: str) -> None:
    """The counters of ``(name, kind)`` at 0: adding 0 makes the data point.
    (A histogram has no point until its first value.)"""
    family = key_family(kind)
    if family is not None:
        for outcome in KEY_OUTCOMES:
            keys[family].add(0, {NAME: name, OUTCOME: outcome})
        return
    for outcome in OUTCOMES:
        outcomes.add(0, {NAME: name, KIND: kind, OUTCOME: outcome})
    for cause in CAUSES:
        losses.add(0, {NAME: name, KIND: kind, CAUSE: cause})


zeroes = Zeroes(_make_zeroes)


def _base(lock: LockBase) -> dict[str, Any]:
    name, kind = label_of(lock), kind_of(lock)
    zeroes.ensure(name, kind)
    return {NAME: name, KIND: kind}


def _named(attributes: dict[str, Any], lock: LockBase) -> dict[str, Any]:
    """A span's attributes, with the lock's own name when the setting asks."""
    if conf.OTEL_LOCK_NAMES:
        attributes[LOCK_NAME] = lock.name
    return attributes


# The hold span of each handle that holds something, until its release or loss.
# Weak: a handle nobody releases (a permit given back by token when a
# streaming response closes) takes its unfinished span with it.
_holds: weakref.WeakKeyDictionary[LockBase, trace.Span] = weakref.WeakKeyDictionary()
_holds_mutex = threading.Lock()


def _ns_ago(seconds: float) -> int:
    return time.time_ns() - int(seconds * 1e9)


def _acquire_span(attributes: dict[str, Any], waited: float, status: Status | None = None) -> None:
    span = tracer.start_span(
        f"acquire {attributes[NAME]}",
        kind=SpanKind.INTERNAL,
        start_time=_ns_ago(waited),
        attributes=attributes,
    )
    if status is not None:
        span.set_status(status)
    span.end()


# -- the sink ----------------------------------------------------------------------------
def _acquired(lock: LockBase, waited: float) -> None:
    base = _base(lock)
    wait_duration.record(waited, {**base, OUTCOME: "acquired"})
    outcomes.add(1, {**base, OUTCOME: "acquired"})
    held: dict[str, Any] = _named(dict(base), lock)
    acquire: dict[str, Any] = _named({**base, OUTCOME: "acquired", WAITED: waited}, lock)
    if lock.fence is not None:
        held[FENCE] = acquire[FENCE] = lock.fence
    _acquire_span(acquire, waited)
    span = tracer.start_span(f"hold {base[NAME]}", kind=SpanKind.INTERNAL, attributes=held)
    with _holds_mutex:
        _holds[lock] = span


def _busy(lock: LockBase, waited: float) -> None:
    base = _base(lock)
    wait_duration.record(waited, {**base, OUTCOME: "busy"})
    outcomes.add(1, {**base, OUTCOME: "busy"})
    _acquire_span(_named({**base, OUTCOME: "busy", WAITED: waited}, lock), waited)


def _end_hold(lock: LockBase) -> trace.Span | None:
    with _holds_mutex:
        return _holds.pop(lock, None)


def _released(lock: LockBase, held: float) -> None:
    hold_duration.record(held, {**_base(lock), OUTCOME: "released"})
    span = _end_hold(lock)
    if span is not None:
        span.set_attribute(HELD, held)
        span.end()


def _lost(lock: LockBase, reason: str) -> None:
    base = _base(lock)
    outcomes.add(1, {**base, OUTCOME: "lost"})
    loss = lock.loss
    if loss is not None:
        hold_duration.record(loss.held_seconds, {**base, OUTCOME: "lost"})
        losses.add(1, {**base, CAUSE: loss.cause})
    span = _end_hold(lock)
    if span is not None:
        if loss is not None:
            fields = lock.log_fields(**loss.fields())
            # What the loss's log record carries (OpenTelemetry takes no None).
            for key in ("cause", "held_seconds", "ttl_seconds", "owner", "label", "forced_by"):
                if fields.get(key) is not None:
                    span.set_attribute(f"redislock.{key}", fields[key])
        span.add_event("redislock.lost", {"redislock.reason": reason})
        span.set_status(Status(StatusCode.ERROR, f"lease lost: {reason}"))
        span.end()


def _unavailable(
    sender: Any,
    name: str,
    error: BaseException,
    fail_open: bool,
    lock: LockBase | None,
) -> None:
    label, kind = unavailable_label(sender, name, lock)
    zeroes.ensure(label, kind)
    outcome = "fail_open" if fail_open else "unavailable"
    outcomes.add(width_of(lock), {NAME: label, KIND: kind, OUTCOME: outcome})
    # How long the failed call took is not reported: the span marks the moment.
    _acquire_span(
        {NAME: label, KIND: kind, OUTCOME: outcome, "error.type": type(error).__qualname__},
        0.0,
        Status(StatusCode.ERROR, str(error)),
    )


def _key(family: str, name: str, outcome: str) -> None:
    label = admitted(name)
    zeroes.ensure(label, family)
    keys[family].add(1, {NAME: label, OUTCOME: outcome})


class _Sink:
    """Hears the lock events (``signals.add_sink``)."""

    key = staticmethod(_key)
    declared = staticmethod(zeroes.declared)
    acquired = staticmethod(_acquired)
    busy = staticmethod(_busy)
    released = staticmethod(_released)
    lost = staticmethod(_lost)
    unavailable = staticmethod(_unavailable)


sink = _Sink()


# -- gauges read at collection time -------------------------------------------------------
_active = False
# One Redis read serves the three gauges of one collection.
_levels: tuple[float, list[Level]] = (0.0, [])
_levels_mutex = threading.Lock()
LEVELS_FRESH = 1.0


def _read_levels() -> list[Level]:
    global _levels
    if not _active:
        return []
    with _levels_mutex:
        at, levels = _levels
        if time.monotonic() - at < LEVELS_FRESH:
            return levels
        try:
            # Within the collection's own bound, not the socket timeout of lock calls.
            levels = levels_within()
        except RedisUnavailable as exc:
            logger.warning("could not read the throttling semaphores for metrics: %s", exc)
            levels = []
        _levels = (time.monotonic(), levels)
        return levels


def _observe(field: str) -> Any:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(getattr(level, field), {NAME: level.name}) for level in _read_levels()]

    return callback


meter.create_observable_gauge(
    "redislock.permits.in_use",
    callbacks=[_observe("in_use")],
    unit="{permit}",
    description="Permits of a throttling rule's semaphore held now (read from Redis).",
)
meter.create_observable_gauge(
    "redislock.permits.limit",
    callbacks=[_observe("limit")],
    unit="{permit}",
    description="Permits a throttling rule allows at once.",
)
meter.create_observable_gauge(
    "redislock.queue.length",
    callbacks=[_observe("waiting")],
    unit="{request}",
    description="Requests queued for a throttling rule's permit now (read from Redis).",
)


# -- switching on and off -----------------------------------------------------------------
def install() -> None:
    """Add the sink (``metrics.sync`` calls it)."""
    global _active
    signals.add_sink(sink)
    _active = True
    for kind in KINDS:
        zeroes.ensure(OTHER, kind)
    for name, kind in signals.declared():
        zeroes.declared(name, kind)


def uninstall() -> None:
    """Remove the sink; the gauges report nothing more."""
    global _active, _levels
    signals.remove_sink(sink)
    _active = False
    _levels = (0.0, [])
