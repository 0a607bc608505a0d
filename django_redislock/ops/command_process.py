"""What ``manage.py redislocks`` needs of the process it runs in: who runs it,
Django's common options after a subcommand, the server's clock, and a pipe
closed early."""

from __future__ import annotations

import argparse
import copy
import getpass
import os
import socket
import sys

from django.core.management.base import CommandParser

from ..core import RedisClient

__all__ = [
    "CLOSED_PIPE_STATUS",
    "accept_common_options",
    "closed_pipe",
    "common_options",
    "operator",
    "server_time",
]

# What a process killed by SIGPIPE exits with, as shells report it (128 + 13).
CLOSED_PIPE_STATUS = 141


def operator() -> str:
    """Who runs a ``clear``, for the log and for the holders it releases:
    ``manage.py redislocks clear by alice@web-1 (pid 4242)``."""
    try:
        user = getpass.getuser()
    except Exception:  # no name for this uid (a container), no USER variable
        user = f"uid {os.getuid()}" if hasattr(os, "getuid") else "?"
    return f"manage.py redislocks clear by {user}@{socket.gethostname()} (pid {os.getpid()})"


def common_options(parser: CommandParser) -> list[argparse.Action]:
    """Django's options on every command (``--settings``, ``-v``, ...), already on ``parser``."""
    return [
        action
        for action in parser._actions
        if action.option_strings
        and not isinstance(action, (argparse._HelpAction, argparse._VersionAction))
    ]


def accept_common_options(sub: CommandParser, common: list[argparse.Action]) -> None:
    # argparse hands everything after the subcommand to the subparser, which
    # would refuse ``list --settings=...`` as "unrecognized arguments". Each
    # subparser knows the options too; SUPPRESS keeps an option given before
    # the subcommand (or its default) when it is not repeated after.
    for action in common:
        twin = copy.copy(action)
        twin.default = argparse.SUPPRESS
        sub._add_action(twin)


def server_time(client: RedisClient) -> float | None:
    """The server's clock (epoch seconds), for a listing with no row to carry it."""
    try:
        # Not among the calls RedisClient names: any client of a server has it.
        seconds, micros = getattr(client, "time")()  # noqa: B009
    except Exception:
        return None
    return int(seconds) + int(micros) / 1e6


def closed_pipe() -> None:
    """The reader of stdout went away (``list | head``): stop quietly.

    Python's advice for a closed pipe: point stdout at /dev/null so that the
    interpreter's last flush does not fail again on its way out, then exit
    with the status a Unix tool killed by SIGPIPE reports.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file (tests): nothing to flush
        pass
    raise SystemExit(CLOSED_PIPE_STATUS)
