"""``manage.py redislocks``: Django's common options are accepted anywhere on the line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
import redis
from django.core.management import call_command

from django_redislock.core.drivers.lock import Lock
from django_redislock.core.engine.keys import KeySpace

ROOT = Path(__file__).resolve().parent.parent

MANAGE_PY = """\
import sys

from django.core.management import execute_from_command_line

execute_from_command_line(sys.argv)
"""


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("redislocks", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    "options",
    [
        ["-v", "2"],
        ["--verbosity=0"],
        ["--traceback"],
        ["--no-color"],
        ["--force-color"],
        ["--skip-checks"],
        ["--settings=tests.settings"],
        [f"--pythonpath={ROOT}"],
        ["-v", "2", "--traceback", "--no-color", "--skip-checks"],
    ],
)
@pytest.mark.parametrize(
    "action", [["list"], ["list", "--summary"], ["clear", "--all", "--noinput"]]
)
def test_common_options_after_the_subcommand(action: list[str], options: list[str]) -> None:
    expected = "No locks held.\n" if action[0] == "list" else "Nothing to release.\n"
    assert run(*action, *options) == (expected, "")


def test_common_options_before_the_subcommand_still_work() -> None:
    assert run("-v", "2", "--no-color", "list") == ("No locks held.\n", "")


def test_an_option_after_the_subcommand_reaches_the_command() -> None:
    # Not just accepted: the value is the one the command sees.
    from django_redislock.management.commands.redislocks import Command

    parser = Command().create_parser("manage.py", "redislocks")
    options = vars(parser.parse_args(["list", "-v", "3", "--traceback", "--no-color"]))
    assert (options["verbosity"], options["traceback"], options["no_color"]) == (3, True, True)
    options = vars(parser.parse_args(["-v", "0", "list"]))
    assert (options["verbosity"], options["traceback"]) == (0, False)


@pytest.fixture
def manage_py(tmp_path: Path) -> Path:
    script = tmp_path / "manage.py"
    script.write_text(MANAGE_PY)
    return script


def _manage(manage_py: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")}
    return subprocess.run(
        [sys.executable, str(manage_py), *args],
        cwd=manage_py.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_manage_py_with_settings_and_pythonpath_after_list(manage_py: Path, r: redis.Redis) -> None:
    lock = Lock(r, "report:7", ttl=300, wait=0, keyspace=KeySpace("redislock"), label="nightly")
    assert lock.acquire()
    done = _manage(
        manage_py,
        "redislocks",
        "list",
        "--format",
        "json",
        "--settings=tests.settings",
        f"--pythonpath={ROOT}",
        "-v",
        "2",
        "--traceback",
        "--no-color",
        "--skip-checks",
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    rows = json.loads(done.stdout)["locks"]
    assert [(row["name"], row["fence"], row["label"]) for row in rows] == [
        ("report:7", lock.fence, "nightly")
    ]


def test_manage_py_clear_with_settings_after_the_names(manage_py: Path, r: redis.Redis) -> None:
    lock = Lock(r, "job:a", ttl=300, wait=0, keyspace=KeySpace("redislock"))
    assert lock.acquire()
    done = _manage(
        manage_py,
        "redislocks",
        "clear",
        "job:a",
        "--noinput",
        "--settings=tests.settings",
        f"--pythonpath={ROOT}",
        "--force-color",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Released lock 'job:a' (fence ")
    assert not lock.owned()
