"""One batch of commands on one connection: what it is, and how it fails.

Written once, a reply each (``pool_calls_async.py`` and its generated sync
twin ``pool_calls.py``; ``cluster_calls.py`` on a Cluster):

* the batch is sent again once only when the connection failed before any of
  it was written (connecting, or a pooled connection found dead);
* after a timeout nothing is sent again, and the connection is not closed:
  the batch is still in Redis's buffer and may run when Redis resumes. The
  connection goes to ``giveback``, which reads the late replies and frees the
  connection; a give-back asked for that call goes on after them, so it runs
  after the late script, not before it.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import redis.connection

from .giveback import Pending

# The packer redis-py's connections use when hiredis is installed, and
# hiredis's own function; None (the type of no packer) without either.
_HiredisPacker: Any = getattr(redis.connection, "HiredisRespSerializer", None)
try:
    _pack_command: Any = importlib.import_module("hiredis").pack_command
except ImportError:  # pragma: no cover - without hiredis
    _HiredisPacker = None

__all__ = ["CallFailed", "Command", "packed"]

Command = tuple[Any, ...]


def packed(conn: Any, commands: Sequence[Command]) -> list[bytes]:
    """``commands`` as ``conn`` would write them (``conn.pack_commands``).

    A connection that packs with hiredis has each command packed by hiredis
    directly: redis-py's wrapper first converts byte buffers and splits a
    command name holding a space, neither of which the library sends, at
    more than the packing costs (a lock's acquire: 4.1 us through redis-py,
    1.9 us directly). Anything else is packed by redis-py.
    """
    if type(getattr(conn, "_command_packer", None)) is _HiredisPacker:
        try:
            if len(commands) == 1:
                # One script call, the usual batch: no generator, no join.
                head = commands[0][0]
                if type(head) is str and " " not in head:
                    return [_pack_command(commands[0])]
            elif all(type(c[0]) is str and " " not in c[0] for c in commands):
                return [b"".join([_pack_command(c) for c in commands])]
        except TypeError:  # an argument hiredis does not take: redis-py converts it
            pass
    return list(conn.pack_commands(commands))


class CallFailed(Exception):
    """A batch did not complete. ``may_have_run``: some of it may have run.

    ``pending`` is set when the batch was written but its replies are late: the
    connection now belongs to ``giveback``, which reads them.
    """

    def __init__(self, cause: BaseException, *, may_have_run: bool) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.may_have_run = may_have_run
        self.pending: Pending | None = None
