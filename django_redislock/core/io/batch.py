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

from typing import Any

from .giveback import Pending

__all__ = ["CallFailed", "Command"]

Command = tuple[Any, ...]


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
