"""How operators see lock rows: names made printable, widths, durations.

Shared by ``manage.py redislocks`` and the admin page. Lock names may hold
anything (control characters, escapes, wide characters); nothing is printed
as it is.
"""

from __future__ import annotations

import unicodedata

from ..core.inspect import HeldLock, Holder

__all__ = ["NO_TEMPLATE", "duration", "owner_text", "printable", "quoted", "template_text", "width"]

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


def owner_text(row: HeldLock | Holder) -> str:
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
