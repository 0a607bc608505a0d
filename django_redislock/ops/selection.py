"""The admin page's selections: a checkbox value names one row as shown.

Its kind, the ids of the holders shown (``Holder.ident``, comma-separated) and
the name in base64, because a browser rewrites line breaks in form values and
cannot send lone surrogates at all, and lock names may contain both.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable

from ..core import KINDS, HeldLock, Shown, decode_name, encode_name

__all__ = ["merged", "parse_selection", "selection"]

_IDENT = re.compile(r"[0-9a-f]{16}")


def selection(row: HeldLock, idents: list[str] | None = None) -> str:
    """The checkbox value of ``row`` as shown, or of only the holders ``idents``
    (one permit of a semaphore, one reader)."""
    name = base64.urlsafe_b64encode(encode_name(row.name)).decode()
    chosen = sorted(h.ident for h in row.holders) if idents is None else sorted(idents)
    return f"{row.kind}:{','.join(chosen)}:{name}"


def parse_selection(value: str) -> Shown:
    kind, idents, name = value.split(":", 2)
    if kind not in KINDS:
        raise ValueError(kind)
    holders = frozenset(idents.split(",")) if idents else frozenset()
    if not holders or not all(_IDENT.fullmatch(i) for i in holders):
        raise ValueError(idents)
    text = decode_name(base64.urlsafe_b64decode(name.encode("ascii")))
    encode_name(text)  # rejects an empty name, as every lock name is
    return Shown(kind, text, holders)


def merged(items: Iterable[Shown]) -> list[Shown]:
    """One selection per name and kind: a row's box and one of its permits'
    boxes ticked together name the same holders once."""
    holders: dict[tuple[str, str], frozenset[str]] = {}
    for item in items:
        key = (item.kind, item.name)
        holders[key] = holders.get(key, frozenset()) | item.holders
    return [Shown(kind, name, idents) for (kind, name), idents in holders.items()]
