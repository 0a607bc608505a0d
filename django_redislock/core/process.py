"""This process's id, read once and again in a forked child, never per call.

A handle checks on each call that it is still in the process that made it (a
forked child inherits the handle, never what it holds), the owner metadata
names the process, and a pool's connections belong to the process that made
them. ``os.getpid()`` is a system call each time: a contended critical section
asked it a dozen times. The id changes only at a fork, when this module reads
it again (``os.register_at_fork``), before any code of the child runs.
"""

from __future__ import annotations

import os

__all__ = ["this_process"]


class _Process:
    __slots__ = ("pid",)

    def __init__(self) -> None:
        self.pid = os.getpid()


# ``this_process.pid``: an attribute read, where ``os.getpid()`` is a system call.
this_process = _Process()


def _after_fork_in_child() -> None:
    this_process.pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)
