"""``manage.py redislocks`` as a Unix tool: a pipe closed early, a terminal, no terminal.

Each test runs the command in a process of its own, as a shell would, with
its standard streams on a real pipe or pseudo-terminal (``os.pipe``,
``os.openpty``): what Django's ``call_command`` cannot show.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from django_redislock.core.drivers.lock import Lock
from django_redislock.core.engine.keys import KeySpace

ROOT = Path(__file__).resolve().parent.parent
KS = KeySpace("redislock")
COMMAND = [sys.executable, "-m", "django", "redislocks"]


def env() -> dict[str, str]:
    # The child reads the same private Redis (its socket is in the environment).
    return dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(ROOT))


def hold(r: redis.Redis, name: str, label: str = "") -> Lock:
    lock = Lock(r, name, ttl=300, wait=0, keyspace=KS, label=label)
    assert lock.acquire()
    return lock


def read_all(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the terminal's other side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("lines_read", [0, 1])
def test_list_into_a_pipe_closed_early_is_quiet(r: redis.Redis, lines_read: int) -> None:
    """``redislocks list | head``: no BrokenPipeError traceback, and the
    status of a tool that SIGPIPE stopped (141, as ``seq 1 100000 | head``)."""
    # Some 300 KB of table: more than a pipe holds, so the command is still
    # writing when its reader goes.
    for i in range(300):
        hold(r, f"cart:{i}", label="x" * 1000)
    read_end, write_end = os.pipe()
    reader = os.fdopen(read_end, "rb")
    if lines_read == 0:
        reader.close()  # gone before the first line: every write fails
    child = subprocess.Popen(
        [*COMMAND, "list"],
        cwd=ROOT,
        env=env(),
        stdin=subprocess.DEVNULL,
        stdout=write_end,
        stderr=subprocess.PIPE,
    )
    os.close(write_end)
    if lines_read:
        assert reader.readline().startswith(b"NAME ")
        reader.close()  # as head does once it has its lines
    _, err = child.communicate(timeout=60)
    assert (child.returncode, err.decode()) == (141, "")


def test_list_into_a_pipe_read_to_the_end_is_unchanged(r: redis.Redis) -> None:
    hold(r, "cart:1")
    done = subprocess.run(
        [*COMMAND, "list"], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert [line.split()[0] for line in done.stdout.splitlines()] == ["NAME", "cart:1"]


def test_clear_with_no_terminal_refuses_with_status_2(r: redis.Redis) -> None:
    """cron, CI, ``ssh host cmd``: stdin is no terminal. The command says
    why and how, releases nothing, and exits 2 (no EOFError traceback)."""
    lock = hold(r, "report:1")
    done = subprocess.run(
        [*COMMAND, "clear", "report:1"],
        cwd=ROOT,
        env=env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        "CommandError: No terminal to confirm on (stdin is not a terminal), so nothing was "
        "released. Run it from a terminal, or pass --no-input to release without asking; "
        "--dry-run shows what would go.\n"
    )
    assert lock.owned()


@pytest.mark.parametrize(("answer", "status"), [("yes", 0), ("no", 1), ("", 1)])
def test_clear_on_a_terminal_asks_and_exits_1_when_declined(
    r: redis.Redis, answer: str, status: int
) -> None:
    lock = hold(r, "report:1")
    controller, terminal = os.openpty()
    try:
        child = subprocess.Popen(
            # Django colours errors on a terminal; the words are what is compared.
            [*COMMAND, "clear", "report:1", "--no-color"],
            cwd=ROOT,
            env=env(),
            stdin=terminal,
            stdout=terminal,
            stderr=terminal,
        )
        os.close(terminal)
        # Typed ahead: the terminal keeps the line until the prompt reads it.
        os.write(controller, answer.encode() + b"\n")
        output = read_all(controller).decode().replace("\r\n", "\n")
        assert child.wait(timeout=60) == status
    finally:
        os.close(controller)
    assert "Type 'yes' to continue, or 'no' to cancel: " in output
    assert "Traceback" not in output
    if status == 0:
        assert "Released lock 'report:1' (" in output
        assert not lock.owned()
    else:
        assert output.endswith("Nothing released.\nCommandError: Declined: nothing was released.\n")
        assert lock.owned()
