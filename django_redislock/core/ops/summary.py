"""A summary of held locks per template: what an operator looks at first.

Rows are grouped by template (the decorator's key template, a throttling
rule's name: what the lock handle had as ``metric_name``, stored with each
lease and permit), never by the name alone, which may carry an id per call.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..validate import MAX_COUNT, check_count
from .rows import HeldLock

__all__ = ["BUSIEST", "TemplateSummary", "summarize"]

# Names shown per template: the ones an operator looks at first.
BUSIEST = 3


@dataclass(frozen=True)
class TemplateSummary:
    """The held locks (or semaphores) of one template, of one kind, together.

    ``template`` is None for ad-hoc locks (no ``metric_name``) and for owners
    written before templates were stored.
    """

    template: str | None
    kind: str
    # Names held, and leases or permits held under them (equal for locks).
    held: int
    holders: int
    # Seconds the longest-held lease or permit among them has been held.
    longest_held: float
    # Callers queued behind them, in total.
    waiters: int
    # The busiest names: most waiters first, then the longest held.
    busiest: tuple[HeldLock, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "template": self.template,
            "kind": self.kind,
            "held": self.held,
            "holders": self.holders,
            "longest_held": self.longest_held,
            "waiters": self.waiters,
            "busiest": [
                {"name": row.name, "waiters": row.waiters, "held_for": row.held_for}
                for row in self.busiest
            ],
        }


def _busier(row: HeldLock) -> tuple[int, float, str]:
    return (-row.waiters, -row.held_for, row.name)


def summarize(rows: Iterable[HeldLock], *, busiest: int = BUSIEST) -> list[TemplateSummary]:
    """One summary per (template, kind) of ``rows``, the most contended first.

    Reads nothing from Redis: the waiters and ages are those ``list_locks``
    read, in the same pipelined scripts as the rows. Ordered by waiters, then
    by names held, then by template (ad-hoc last among equals).
    """
    check_count("busiest", busiest, low=0, high=MAX_COUNT)
    groups: dict[tuple[str | None, str], list[HeldLock]] = {}
    for row in rows:
        groups.setdefault((row.template, row.kind), []).append(row)
    out = [
        TemplateSummary(
            template=template,
            kind=kind,
            held=len(members),
            holders=sum(len(row.holders) for row in members),
            longest_held=max(row.held_for for row in members),
            waiters=sum(row.waiters for row in members),
            busiest=tuple(sorted(members, key=_busier)[:busiest]),
        )
        for (template, kind), members in groups.items()
    ]
    # By counts only: an order that shifts with the clock between two
    # refreshes of a page would make a quiet page look busy.
    out.sort(key=lambda s: (-s.waiters, -s.held, s.template is None, s.template or "", s.kind))
    return out
