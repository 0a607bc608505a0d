"""What can cut an awaited call short besides Redis, as the asyncio sources name it.

The asyncio sources (``calls_async.py``, the drivers) never name
``asyncio`` themselves: they name these, and their generated sync twins get
the names of ``interrupts.py``, which mean the same for threads. A task is
cancelled at an await (``Cancelled``) and an ``asyncio`` wait runs out of time
(``CallTimeout``); a thread is neither, so there both name exceptions that are
never raised, and a clause that catches one never matches.

A signal's ``KeyboardInterrupt`` or ``SystemExit`` is neither of them, in
either world: it is caught nowhere (docs/internals.rst, "Interrupts").
"""

from __future__ import annotations

import asyncio

__all__ = ["CallTimeout", "Cancelled"]

# A cancelled task, and an asyncio wait (``complete``, ``wait_for``) out of time.
Cancelled = asyncio.CancelledError
CallTimeout = asyncio.TimeoutError
