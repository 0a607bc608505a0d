"""This process's id and random tokens, made anew in a forked child.

A handle checks on each call that it is still in the process that made it (a
forked child inherits the handle, never what it holds), the owner metadata
names the process, and a pool's connections belong to the process that made
them. ``os.getpid()`` is a system call each time: a contended critical section
asked it a dozen times. The id changes only at a fork, when this module reads
it again (``os.register_at_fork``), before any code of the child runs.

Tokens (``new_token``) come from the system's random source too, but a
batch at a time: each acquire needs one, and ``os.urandom`` is a system
call. A child starts a batch of its own at the fork, so that no two
processes ever hand out the same bytes.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator

__all__ = ["new_token", "this_process"]

# How many tokens one read of the system's random source makes.
TOKENS_PER_READ = 64


class _Process:
    __slots__ = ("pid",)

    def __init__(self) -> None:
        self.pid = os.getpid()


# ``this_process.pid``: an attribute read, where ``os.getpid()`` is a system call.
this_process = _Process()


_tokens: Iterator[tuple[bytes]] = iter(())


def new_token() -> str:
    """64 random bits as 16 hex digits, from ``os.urandom``, never the same
    bytes twice in this process or any other forked from it."""
    global _tokens
    # One step of a C iterator: two threads never get the same 8 bytes, and
    # two that both find the batch used up each start a new one.
    while (drawn := next(_tokens, None)) is None:
        _tokens = struct.iter_unpack("8s", os.urandom(8 * TOKENS_PER_READ))
    return drawn[0].hex()


def _after_fork_in_child() -> None:
    global _tokens
    this_process.pid = os.getpid()
    # The parent's unused bytes are the parent's: it hands them out itself.
    _tokens = iter(())


os.register_at_fork(after_in_child=_after_fork_in_child)
