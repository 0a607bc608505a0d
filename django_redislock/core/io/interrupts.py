"""The sync meaning of ``interrupts_async.py``'s names: nothing that ever happens.

A thread is not cancelled at a call, and a sync call is bounded by its socket
timeout, which the transport reports as a failed call: the generated sync code
keeps its asyncio source's clauses, and they never match. A signal's
``KeyboardInterrupt`` or ``SystemExit`` is not one of these: it passes
through every clause (docs/internals.rst, "Interrupts").
"""

from __future__ import annotations

__all__ = ["CallTimeout", "Cancelled"]


class Cancelled(BaseException):
    """Never raised: a thread is not cancelled at a call."""


class CallTimeout(Exception):
    """Never raised: a sync call is bounded by its socket timeout, which the
    transport turns into ``RedisUnavailable``."""
