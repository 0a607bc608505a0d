"""Why a lease was lost, decided with no I/O: what on-call needs to triage it.

A holder learns that its lease is gone at its next renewal, extend or release,
whose scripts answer only "not yours any more". Three causes look alike
there, and call for different fixes:

``expired``
    The lease ran out before the holder renewed or released it: the work
    outlasted the TTL (raise ``TIMEOUT``, renew, or find what was slow), or
    Redis was out of reach while it should have been renewed.
``force_released``
    An operator released it (``manage.py redislocks clear``, the admin page,
    ``core.ops.force``). The force-release leaves a mark for the holder: one
    hash per name, ``FORCED_KEY`` in ``keys.py``, a field per token released,
    saying who and when, kept ``FORCED_KEEP_MS`` beyond the lease.
``redis_lost``
    Redis no longer has a lease the holder still counted as valid, and no
    operator released it: a restart without persistence, a failover to a
    replica that had not received it, eviction, a ``FLUSHALL``, or a key
    deleted by hand.

So on a loss the holder reads, in one round trip (``inquiry``), the mark of
its token and the name's state (whether it exists, and the last fence it
issued), and ``cause_of`` decides with the holder's own clock:

1. its token is marked: ``force_released``;
2. the state is gone while it must still exist (the state outlives every
   lease by ``STATE_KEEP_MS``), or it remembers a fence older than this
   lease's (Redis went back in time): ``redis_lost``;
3. the holder's conservative validity had ended: ``expired``;
4. otherwise the lease vanished before its time with no mark: ``redis_lost``.

Without the read (Redis out of reach) only the clock speaks: ``expired`` when
the validity had ended, else ``redis_lost``.

The scripts of the hot path could say all of it in their own reply (see
docs/internals.rst, "Why a lease was lost"), with no read after the loss.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .keys import LockKeys
from .protocol import STATE_KEEP_MS

__all__ = [
    "CAUSES",
    "EXPIRED",
    "FORCED_KEEP_MS",
    "FORCE_RELEASED",
    "REDIS_LOST",
    "Loss",
    "Trace",
    "cause_of",
    "forced_mark",
    "inquiry",
    "trace_of",
]

EXPIRED = "expired"
FORCE_RELEASED = "force_released"
REDIS_LOST = "redis_lost"
CAUSES = (EXPIRED, FORCE_RELEASED, REDIS_LOST)

# How long a force-release's mark outlives the lease it released: the holder
# finds out at its next renewal (a third of its TTL) or at its release, which
# may come long after for work that does not renew. An hour covers a job that
# runs well past its lease; a mark is a hundred bytes, one per name released.
FORCED_KEEP_MS = 3_600_000


@dataclass(frozen=True)
class Loss:
    """A lease found lost, as the holder saw it (``LockBase.loss``)."""

    cause: str  # EXPIRED, FORCE_RELEASED or REDIS_LOST
    reason: str  # the sentence logged and sent with ``lock_lost``
    # Seconds from the acquire to the moment the loss was found.
    held_seconds: float
    # The lease's TTL, in seconds, as last set (acquire, extend or renewal).
    ttl_seconds: float
    # Who force-released it, and when (epoch seconds): FORCE_RELEASED only.
    forced_by: str | None = None
    forced_at: float | None = None

    def fields(self) -> dict[str, Any]:
        """What logs, signals and spans carry of it."""
        return {
            "cause": self.cause,
            "held_seconds": round(self.held_seconds, 6),
            "ttl_seconds": self.ttl_seconds,
            "forced_by": self.forced_by,
        }


@dataclass(frozen=True)
class Trace:
    """What the read after a loss found."""

    # The force-release mark of the holder's token (JSON), or None.
    forced: bytes | None
    state_exists: bool
    # The state's last fence (locks), or None.
    last_fence: int | None


def forced_mark(by: str, at: float) -> str:
    """The value a force-release writes for each token it releases."""
    return json.dumps({"by": by, "at": round(at, 3)}, ensure_ascii=False, separators=(",", ":"))


def inquiry(keys: LockKeys, forced: bytes, token: str) -> list[tuple[Any, ...]]:
    """The read that follows a loss: one batch, the name's keys share a slot."""
    return [("HGET", forced, token), ("EXISTS", keys.state), ("HGET", keys.state, "f")]


def trace_of(replies: list[Any]) -> Trace | None:
    """The ``Trace`` in the replies of ``inquiry``; None if any is an error."""
    if len(replies) != 3 or any(isinstance(reply, Exception) for reply in replies):
        return None
    forced, exists, fence = replies
    try:
        last = int(fence) if fence is not None else None
    except (TypeError, ValueError):
        last = None
    return Trace(forced=forced or None, state_exists=bool(int(exists)), last_fence=last)


def _mark(raw: bytes | str) -> tuple[str, float | None]:
    try:
        data = json.loads(raw)
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    at = data.get("at")
    return str(data.get("by") or "an operator"), at if isinstance(at, (int, float)) else None


def cause_of(
    trace: Trace | None,
    *,
    now: float,
    valid_until: float,
    fence: int | None,
) -> tuple[str, str, str | None, float | None]:
    """``(cause, why, forced_by, forced_at)`` of a loss found at ``now``.

    ``valid_until`` is the end of the holder's conservative validity on the
    same (monotonic) clock as ``now``; ``fence`` is the lease's fencing token
    (locks and writers), or None; ``why`` completes the logged sentence.
    """
    ran_out = now >= valid_until
    if trace is not None:
        if trace.forced is not None:
            by, at = _mark(trace.forced)
            return FORCE_RELEASED, f"force-released by {by}", by, at
        # The state outlives the lease by STATE_KEEP_MS: gone well before that
        # is Redis losing it. Half of it spares clock rates that differ a little.
        if not trace.state_exists and now < valid_until + STATE_KEEP_MS / 2000:
            why = "Redis no longer has the name's state (restarted, failed over or flushed)"
            return REDIS_LOST, why, None, None
        if fence is not None and trace.last_fence is not None and trace.last_fence < fence:
            return (
                REDIS_LOST,
                f"Redis went back to an older state (last fence {trace.last_fence}): "
                "restarted from an old snapshot, or failed over to a replica that had not "
                "received the lease",
                None,
                None,
            )
    if ran_out:
        return EXPIRED, "the lease ran out before it was renewed or released", None, None
    return (
        REDIS_LOST,
        "the lease vanished before it could have run out, with no force-release recorded "
        "(eviction, failover, a restart, or a key deleted by hand)",
        None,
        None,
    )
