"""The Lua scripts: each one's source, put together from its pieces, and its SHA.

The scripts live in ``lua/`` beside this module. Every lock, semaphore and
read-write lock script is ``_prelude.lua`` (what the three kinds share: the
clock, TTLs, waiter entries and wake-ups, serials and the memory of losses),
then its kind's own piece, then its body: ``_lock.lua`` for a lock;
``_holders.lua`` (what semaphores and read-write locks share) and then
``_semaphore.lua`` or ``_rwlock.lua``. A script that needs no more than
``_holders.lua`` is one script for both kinds (``HOLDERS_REFRESH``).
No I/O: ``io/calls_async.py`` (and its generated twin) runs them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

from .protocol import STATE_KEEP_MS

__all__ = ["PIECES", "Script", "load"]


@dataclass(frozen=True)
class Script:
    name: str
    source: bytes
    sha: str
    # Safe to run twice with the same arguments (release, extend, cancel): a
    # batch cut by a broken connection is sent once more, on a new one, so
    # the caller gets an answer. Never after a timeout (the first may still
    # be on its way), and never for a script that is not.
    repeatable: bool = False


def _read(filename: str) -> str:
    return (resources.files(__package__) / "lua" / filename).read_text("utf-8")


# The pieces before a script's body, per kind (``load``'s ``prelude``).
PIECES: dict[str, tuple[str, ...]] = {
    "shared": ("_prelude.lua",),
    "lock": ("_prelude.lua", "_lock.lua"),
    "holders": ("_prelude.lua", "_holders.lua"),
    "semaphore": ("_prelude.lua", "_holders.lua", "_semaphore.lua"),
    "rwlock": ("_prelude.lua", "_holders.lua", "_rwlock.lua"),
}


# A line of a piece that ends what every run of a script makes (its constants
# and locals) and begins the helpers (the functions). A body that holds the
# line runs what comes before it ahead of every piece's helpers: a fast path
# that returns there makes no closure (see docs/internals.rst, Script cost).
HELPERS = "-- @HELPERS@\n"


def _split(text: str) -> tuple[str, str]:
    """``text`` before and after its HELPERS line (all of it after, without one)."""
    head, found, tail = text.partition(HELPERS)
    return (head, tail) if found else ("", text)


def load(name: str, *, prelude: str | None = "lock", repeatable: bool = False) -> Script:
    """The script ``lua/<name>.lua``, after the pieces of its kind.

    ``prelude`` is the kind (a key of ``PIECES``), or None for a stand-alone
    script.
    """
    body = _read(f"{name}.lua")
    if prelude is None:
        text = body
    else:
        heads, helpers = zip(*(_split(_read(piece)) for piece in PIECES[prelude]), strict=True)
        if HELPERS in body:
            # A run that returns before the marker makes none of the helpers'
            # closures: what they cost is paid only by the runs that need them.
            fast, slow = _split(body)
            text = "\n".join((*heads, fast, *helpers, slow))
        else:
            text = "\n".join(head + helper for head, helper in zip(heads, helpers, strict=True))
            text += "\n" + body
    # The one way the scripts learn the state's keep time (docs/internals.rst).
    source = text.replace("@STATE_KEEP_MS@", str(STATE_KEEP_MS)).encode()
    return Script(name, source, hashlib.sha1(source).hexdigest(), repeatable)


ACQUIRE = load("acquire")
RELEASE = load("release", repeatable=True)
EXTEND = load("extend", repeatable=True)
CANCEL = load("cancel", repeatable=True)
CLEAR = load("clear")
# The barging order (``Lock(..., fair=False)``): the same acquire script (the
# limit it is sent says which order), its own release.
ACQUIRE_BARGING = ACQUIRE
RELEASE_BARGING = load("release_barging", repeatable=True)
# Semaphores and read-write locks refresh a holder alike: one script.
HOLDERS_REFRESH = load("holders_refresh", prelude="holders", repeatable=True)
