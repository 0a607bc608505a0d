"""What operators are shown of a held lock, semaphore or read-write lock: its row.

A row (``HeldLock``) and its holders (``Holder``) are plain frozen data, read
from Redis by ``reading.py``; a holder is named to people by ``holder_id``,
never by its token.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from fnmatch import fnmatchcase
from typing import Any

__all__ = [
    "HeldLock",
    "Holder",
    "Waiter",
    "holder_id",
    "iso_time",
    "matches",
    "natural_key",
    "row_of_holders",
]

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple[tuple[tuple[int, int | str], ...], str]:
    """Sort key that orders the digits in a name by value: ``cart:2`` before
    ``cart:10``, as a person reads them. Runs of digits compare as numbers
    (then by their text, so ``07`` and ``7`` keep a fixed order), the rest as text."""
    parts = _DIGITS.split(name)
    # Odd parts are the digit runs; a name that is a prefix of another sorts first.
    pieces = tuple((1, int(part)) if i % 2 else (0, part) for i, part in enumerate(parts) if part)
    return pieces, name


def iso_time(epoch: float | None) -> str | None:
    """``2026-11-28T16:00:01.250Z``: an instant for JSON, in UTC to the millisecond."""
    if epoch is None:
        return None
    # Whole milliseconds first: an age counted back from two reads names the same instant.
    ms = round(epoch * 1000)
    moment = datetime.fromtimestamp(ms // 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def holder_id(token: str) -> str:
    """What names one acquisition to people and forms, in place of its token.

    A token is per acquisition (a lease, permit or turn taken, or handed on
    to a task's worker), so its digest tells "the holder that was shown" from
    a holder that came since, whatever the kind; the token itself, which
    releases the lease, is never shown. 64 bits, as many as a token has.
    """
    return hashlib.blake2b(token.encode("latin-1"), digest_size=8).hexdigest()


@dataclass(frozen=True)
class Holder:
    """Who holds a lock or one permit of a semaphore."""

    host: str
    pid: int | None
    thread: str
    label: str
    # Seconds since the lease or permit was taken, by the server's clock.
    held_for: float
    # Seconds until it expires unless renewed; None when it has no expiry.
    lease_left: float | None
    token: str = field(repr=False, compare=False, default="")
    # The template it was taken under (``metric_name``); None for an ad-hoc
    # lock, and for an owner written before templates were stored.
    template: str | None = None
    # A read-write lock's holder: "read" or "write"; None for other kinds.
    # (Not in ``as_dict``: a row's ``fence`` is set exactly when a writer holds.)
    mode: str | None = None
    # Whether its holder renews it in the background (renew=True); False
    # also for an owner written before this was stored.
    renew: bool = False
    # Seconds since it was last renewed or extended, by the server's clock;
    # None when it never was.
    renewed_ago: float | None = None

    @property
    def ident(self) -> str:
        """``holder_id`` of its token: safe to put in a page or a form."""
        return holder_id(self.token)

    @property
    def renewal_late(self) -> bool:
        """A renewed lease whose renewal is overdue: its process may be gone.

        Renewal runs every third of the TTL; this says True once half the
        TTL (as last set: the time since plus the time left) has passed
        without one. A stopped or killed holder turns late before its lease
        runs out; a live one only when it cannot reach Redis.
        """
        if not self.renew or self.lease_left is None:
            return False
        since = self.held_for if self.renewed_ago is None else self.renewed_ago
        return since > (since + self.lease_left) / 2

    def as_dict(self, read_at: float | None = None) -> dict[str, Any]:
        """JSON-ready form; ``read_at`` (the server's clock when it was read,
        epoch seconds) makes ``acquired_at`` and ``expires_at`` absolute."""
        return {
            "id": self.ident,
            "host": self.host,
            "pid": self.pid,
            "thread": self.thread,
            "label": self.label,
            "held_for": self.held_for,
            "lease_left": self.lease_left,
            **_instants(read_at, self.held_for, self.lease_left),
            **_renewal(read_at, self),
        }


def _renewal(read_at: float | None, holder: Holder) -> dict[str, Any]:
    renewed_at = None
    if read_at is not None and holder.renewed_ago is not None:
        renewed_at = iso_time(read_at - holder.renewed_ago)
    return {
        "renew": holder.renew,
        "renewed_ago": holder.renewed_ago,
        "renewed_at": renewed_at,
        "renewal_late": holder.renewal_late,
    }


@dataclass(frozen=True)
class Waiter:
    """One caller queued for a name, as its entry in the queue says."""

    token: str = field(repr=False, compare=False)
    host: str
    pid: int | None
    thread: str
    label: str
    # Seconds since its call began to wait (server clock); None when its
    # entry does not say (written by an earlier version, or a call that
    # did not say how long it would wait).
    waited: float | None
    # Seconds until it gives up waiting.
    gives_up_in: float

    @property
    def ident(self) -> str:
        return holder_id(self.token)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.ident,
            "host": self.host,
            "pid": self.pid,
            "thread": self.thread,
            "label": self.label,
            "waited": self.waited,
            "gives_up_in": self.gives_up_in,
        }


def _instants(read_at: float | None, held_for: float, lease_left: float | None) -> dict[str, Any]:
    if read_at is None:
        return {"acquired_at": None, "expires_at": None}
    return {
        "acquired_at": iso_time(read_at - held_for),
        "expires_at": None if lease_left is None else iso_time(read_at + lease_left),
    }


@dataclass(frozen=True)
class HeldLock:
    """One held lock, one semaphore with at least one live permit, or one
    read-write lock with a writer or at least one reader.

    For a semaphore, the owner fields and ``held_for`` are those of the
    longest-held permit and ``lease_left`` is the soonest expiry; every permit
    is in ``holders``. A read-write lock reads the same, with its readers (or
    its one writer) as holders; its ``fence`` is the writer's while a writer
    holds it, and None while readers do.
    """

    name: str
    kind: str
    host: str
    pid: int | None
    thread: str
    label: str
    fence: int | None
    held_for: float
    lease_left: float | None
    waiters: int
    holders: tuple[Holder, ...]
    limit: int | None
    key: bytes = field(repr=False, compare=False, default=b"")
    # See Holder.template; a semaphore's is that of its longest-held permit
    # that has one.
    template: str | None = None
    # The server's clock when the row was read (epoch seconds; None when not
    # known): what its ages and leases are counted from.
    read_at: float | None = field(compare=False, default=None)
    # The first live waiters, oldest first (at most the number asked for:
    # ``waiters`` counts them all).
    waiting: tuple[Waiter, ...] = field(compare=False, default=())

    @property
    def token(self) -> str:
        """The lock's current token (locks only); never shown to people."""
        return self.holders[0].token if self.kind == "lock" and self.holders else ""

    def only(self, idents: Iterable[str]) -> HeldLock | None:
        """This row with only the holders whose ``ident`` is in ``idents``
        (None when none is): what an operator was shown of it, still held."""
        wanted = set(idents)
        kept = [h for h in self.holders if h.ident in wanted]
        if len(kept) == len(self.holders):
            return self
        # A lock's one holder and a writer are all or nothing: only a
        # semaphore's permits and a read-write lock's readers get here.
        return row_of_holders(
            self.name,
            self.kind,
            self.key,
            kept,
            self.waiters,
            fence=self.fence,
            limit=self.limit,
            read_at=self.read_at,
            listed=self.waiting,
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form; the keys are the same for every kind, always."""
        return {
            "name": self.name,
            "kind": self.kind,
            "host": self.host,
            "pid": self.pid,
            "thread": self.thread,
            "label": self.label,
            "fence": self.fence,
            "held_for": self.held_for,
            "lease_left": self.lease_left,
            "waiters": self.waiters,
            "holders": len(self.holders),
            "limit": self.limit,
            "permits": [h.as_dict(self.read_at) for h in self.holders],
            **_instants(self.read_at, self.held_for, self.lease_left),
            # The longest-held holder's, as the owner fields are.
            **_renewal(self.read_at, self.holders[0]),
            # The first waiters, oldest first; ``waiters`` counts them all.
            "waiting": [w.as_dict() for w in self.waiting],
        }


def matches(name: str, pattern: str | None, *, literal: bool = False) -> bool:
    """Whether ``name`` is selected by ``pattern`` (None selects everything)."""
    if pattern is None:
        return True
    if literal:
        return name == pattern
    return fnmatchcase(name, pattern)


def row_of_holders(
    own: str,
    kind: str,
    key: bytes,
    holders: list[Holder],
    waiting: Any,
    *,
    fence: int | None,
    limit: int | None,
    read_at: float | None = None,
    listed: tuple[Waiter, ...] = (),
) -> HeldLock | None:
    if not holders:
        return None
    # The longest-held speaks for the row: the likeliest to be stuck.
    holders.sort(key=lambda h: -h.held_for)
    first = holders[0]
    lefts = [h.lease_left for h in holders if h.lease_left is not None]
    return HeldLock(
        name=own,
        kind=kind,
        host=first.host,
        pid=first.pid,
        thread=first.thread,
        label=first.label,
        fence=fence,
        held_for=first.held_for,
        lease_left=min(lefts) if lefts else None,
        waiters=int(waiting),
        holders=tuple(holders),
        limit=limit,
        key=key,
        # Holders from before templates were stored have none: the first that has one.
        template=next((h.template for h in holders if h.template is not None), None),
        read_at=read_at,
        waiting=listed,
    )
