"""How operators see lock rows: names made printable, widths, durations, tables.

Shared by ``manage.py redislocks`` (which prints the tables and sentences
rendered here) and the admin page. Lock names may hold
anything (control characters, escapes, wide characters); nothing is printed
as it is.
"""

from __future__ import annotations

import unicodedata

from ..core import HeldLock, Holder, TemplateSummary, Waiter

__all__ = [
    "COLUMNS",
    "NO_TEMPLATE",
    "SUMMARY_COLUMNS",
    "describe",
    "duration",
    "owner_text",
    "printable",
    "quoted",
    "render_summary",
    "render_table",
    "render_waiters",
    "renewed_text",
    "waited_text",
    "waiter_owner_text",
    "template_text",
    "width",
]

_NAMED_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str) -> str:
    """``text`` safe for one line of a terminal or a table cell.

    Control and format characters (newlines, escape sequences, bidi
    overrides) and lone surrogates become backslash escapes, and so does the
    backslash itself, so two different names never look the same. Printable
    non-ASCII text is kept as it is.
    """
    out: list[str] = []
    for ch in text:
        if ch in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[ch])
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            code = ord(ch)
            out.append(
                f"\\x{code:02x}"
                if code < 0x100
                else f"\\u{code:04x}"
                if code < 0x10000
                else f"\\U{code:08x}"
            )
        else:
            out.append(ch)
    return "".join(out)


def width(text: str) -> int:
    """Terminal cells taken by printable ``text`` (wide CJK counts 2)."""
    cells = 0
    for ch in text:
        if unicodedata.combining(ch):
            continue
        cells += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return cells


def duration(seconds: float | None) -> str:
    """Whole seconds, readably: ``7s``, ``3m05s``, ``2h04m``, ``3d04h``."""
    if seconds is None:
        return "never"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def quoted(text: str) -> str:
    """A name or label for a message: escaped, in single quotes."""
    return "'" + printable(text).replace("'", "\\'") + "'"


def renewed_text(holder: Holder) -> str:
    """When a lease, permit or turn was last renewed: ``4s ago``; ``off``
    when nobody renews it (renew=False) and it was never extended; ``not yet``
    when it is renewed but has not been so far; `` (late)`` added when a
    renewal is overdue (``Holder.renewal_late``: its process may be gone)."""
    if holder.renewed_ago is not None:
        text = f"{duration(holder.renewed_ago)} ago"
    elif holder.renew:
        text = "not yet"
    else:
        return "off"
    return text + " (late)" if holder.renewal_late else text


def owner_text(row: HeldLock | Holder | Waiter) -> str:
    """``host:pid/thread`` of a holder, escaped for display."""
    pid = "?" if row.pid is None else str(row.pid)
    return printable(f"{row.host or '?'}:{pid}/{row.thread or '?'}")


# What the summary calls the group of locks taken with no template: ad-hoc
# locks with no ``metric_name``, and leases written before templates were
# stored. In parentheses, so it reads as no template rather than as one.
NO_TEMPLATE = "(no template)"


def template_text(template: str | None) -> str:
    """A template for display, or ``NO_TEMPLATE``."""
    return NO_TEMPLATE if template is None else printable(template)


# -- the command's tables and sentences --------------------------------------------------
COLUMNS = (
    "NAME",
    "KIND",
    "HOLDERS",
    "FENCE",
    "HELD FOR",
    "LEASE LEFT",
    "RENEWED",
    "WAITERS",
    "ID",
    "OWNER",
    "LABEL",
)


def table_rows(rows: list[HeldLock]) -> list[tuple[str, ...]]:
    """Cells of the table; a semaphore is followed by one line per permit, and
    a read-write lock held by readers by one line per reader."""
    cells: list[tuple[str, ...]] = []
    for row in rows:
        if row.kind == "rwlock":
            cells.extend(_rwlock_rows(row))
            continue
        if row.kind == "lock":
            cells.append(
                (
                    printable(row.name),
                    "lock",
                    "-",
                    str(row.fence),
                    duration(row.held_for),
                    duration(row.lease_left),
                    renewed_text(row.holders[0]),
                    str(row.waiters),
                    row.holders[0].ident,
                    owner_text(row),
                    printable(row.label),
                )
            )
            continue
        limit = "?" if row.limit is None else str(row.limit)
        count = len(row.holders)
        cells.append(
            (
                printable(row.name),
                "semaphore",
                f"{count}/{limit}",
                "-",
                duration(row.held_for),
                duration(row.lease_left),
                "",
                str(row.waiters),
                "",
                f"{count} holder" + ("" if count == 1 else "s"),
                "",
            )
        )
        cells.extend(_holder_rows(row))
    return cells


def _holder_rows(row: HeldLock) -> list[tuple[str, ...]]:
    """One line per permit of a semaphore, or per reader of a read-write lock."""
    return [
        (
            "",
            "",
            "",
            "",
            duration(h.held_for),
            duration(h.lease_left),
            renewed_text(h),
            "",
            h.ident,
            owner_text(h),
            printable(h.label),
        )
        for h in row.holders
    ]


def _readers(count: int) -> str:
    return f"{count} reader" + ("" if count == 1 else "s")


def _rwlock_rows(row: HeldLock) -> list[tuple[str, ...]]:
    """A writer reads as a lock does; readers as a semaphore's permits."""
    writing = row.fence is not None
    head = (
        printable(row.name),
        "rwlock",
        "writer" if writing else _readers(len(row.holders)),
        "-" if row.fence is None else str(row.fence),
        duration(row.held_for),
        duration(row.lease_left),
        renewed_text(row.holders[0]) if writing else "",
        str(row.waiters),
        row.holders[0].ident if writing else "",
        owner_text(row) if writing else _readers(len(row.holders)),
        printable(row.label) if writing else "",
    )
    if writing:
        return [head]
    return [head, *_holder_rows(row)]


def _aligned(columns: tuple[str, ...], body: list[tuple[str, ...]]) -> list[str]:
    widths = [max(width(line[i]) for line in [columns, *body]) for i in range(len(columns))]
    lines = []
    for line in [columns, *body]:
        padded = [cell + " " * (widths[i] - width(cell)) for i, cell in enumerate(line)]
        lines.append("  ".join(padded).rstrip())
    return lines


def render_table(rows: list[HeldLock]) -> list[str]:
    return _aligned(COLUMNS, table_rows(rows))


WAITER_COLUMNS = ("NAME", "KIND", "WAITED", "GIVES UP IN", "ID", "OWNER", "LABEL")


def waited_text(waiter: Waiter) -> str:
    """How long a waiter has waited, or ``?`` when its entry does not say."""
    return "?" if waiter.waited is None else duration(waiter.waited)


def waiter_owner_text(waiter: Waiter) -> str:
    """A waiter's ``host:pid/thread``, or ``?`` when its entry does not name it
    (queued by an earlier version)."""
    return owner_text(waiter) if waiter.host or waiter.pid is not None else "?"


def waiter_rows(rows: list[HeldLock]) -> list[tuple[str, ...]]:
    """Cells of the waiters table: each name's first waiters, oldest first,
    then a line counting the rest."""
    cells: list[tuple[str, ...]] = []
    for row in rows:
        for w in row.waiting:
            cells.append(
                (
                    printable(row.name),
                    row.kind,
                    waited_text(w),
                    duration(w.gives_up_in),
                    w.ident,
                    waiter_owner_text(w),
                    printable(w.label),
                )
            )
        rest = row.waiters - len(row.waiting)
        if rest > 0:
            cells.append(
                (printable(row.name), row.kind, f"and {rest} more waiting", "", "", "", "")
            )
    return cells


def render_waiters(rows: list[HeldLock]) -> list[str]:
    """The waiters table (no lines when nobody waits)."""
    body = waiter_rows(rows)
    return _aligned(WAITER_COLUMNS, body) if body else []


SUMMARY_COLUMNS = ("TEMPLATE", "KIND", "HELD", "HOLDERS", "LONGEST HELD", "WAITERS", "BUSIEST")


def busiest_text(row: HeldLock) -> str:
    """``name (2 waiting, 7s)``: one of a summary's busiest names."""
    return f"{printable(row.name)} ({row.waiters} waiting, {duration(row.held_for)})"


def summary_rows(summaries: list[TemplateSummary]) -> list[tuple[str, ...]]:
    """Cells of the summary table; HOLDERS counts permits (``-`` for locks)."""
    return [
        (
            template_text(s.template),
            s.kind,
            str(s.held),
            "-" if s.kind == "lock" else str(s.holders),
            duration(s.longest_held),
            str(s.waiters),
            "; ".join(busiest_text(row) for row in s.busiest),
        )
        for s in summaries
    ]


def render_summary(summaries: list[TemplateSummary]) -> list[str]:
    return _aligned(SUMMARY_COLUMNS, summary_rows(summaries))


def describe(row: HeldLock) -> str:
    label = f", label {quoted(row.label)}" if row.label else ""
    if row.kind == "lock":
        return (
            f"lock {quoted(row.name)} (fence {row.fence}, held by {owner_text(row)} "
            f"for {duration(row.held_for)}{label})"
        )
    if row.kind == "rwlock" and row.fence is not None:
        return (
            f"rwlock {quoted(row.name)} (writer, fence {row.fence}, held by {owner_text(row)} "
            f"for {duration(row.held_for)}{label})"
        )
    if row.kind == "rwlock":
        return (
            f"rwlock {quoted(row.name)} ({_readers(len(row.holders))}, longest held by "
            f"{owner_text(row)} for {duration(row.held_for)}{label})"
        )
    limit = "?" if row.limit is None else str(row.limit)
    return (
        f"semaphore {quoted(row.name)} ({len(row.holders)}/{limit} permits, longest held by "
        f"{owner_text(row)} for {duration(row.held_for)}{label})"
    )
