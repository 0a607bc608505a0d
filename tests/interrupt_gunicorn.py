"""gunicorn's configuration for ``tests/test_interrupts_e2e.py``, and the trace both sides read.

A worker told to quit (SIGQUIT or SIGINT) runs ``worker_int`` in its signal
handler, then raises ``SystemExit`` where its main thread was. The handler
notes it in the trace file first, so the test knows the signal has landed
before it lets a paused Redis answer. Standard library only: gunicorn's
arbiter loads this module.
"""

from __future__ import annotations

import os
from typing import Any


def trace(what: str) -> None:
    """Append ``<what> <pid>`` to the trace file the test named."""
    path = os.environ["REDISLOCK_E2E_TRACE"]
    with open(path, "a", encoding="utf-8") as out:
        out.write(f"{what} {os.getpid()}\n")


def worker_int(worker: Any) -> None:
    trace("quit")
