"""The library prints nothing through Python's last-resort handler.

A logger with no handler anywhere up its hierarchy (Django configures
``django``, not the root logger) hands ``WARNING`` records to
``logging.lastResort``, which writes them to stderr: ``manage.py redislocks
clear`` printed its audit record ("force-released lock ...") under its own
answer. The package's logger has a ``NullHandler``, as the logging HOWTO asks
of libraries; a project that configures ``LOGGING`` still gets every record.
Run in a process of its own: pytest's log capture would stand in for the
missing handler.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import logging, sys
import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django_redislock"],
    CACHES={{"default": {{"BACKEND": "django_redis.cache.RedisCache", "LOCATION": {url!r}}}}},
    LOGGING={logging_setting},
)
django.setup()

from django.core.management import call_command
from django_redislock import get_lock

assert get_lock("held-by-a-crashed-worker", timeout=60).acquire()
call_command("redislocks", "clear", "held-by-a-crashed-worker", "--noinput")
"""


def _run(redis_server: RedisServer, logging_setting: str) -> subprocess.CompletedProcess[str]:
    script = SCRIPT.format(url=redis_server.url, logging_setting=logging_setting)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_clear_command_prints_its_answer_and_nothing_else(redis_server: RedisServer) -> None:
    run = _run(redis_server, "{}")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("Released lock 'held-by-a-crashed-worker'"), run.stdout
    assert run.stderr == ""


def test_a_project_that_configures_logging_gets_the_record(redis_server: RedisServer) -> None:
    configured = (
        '{"version": 1, "handlers": {"err": {"class": "logging.StreamHandler"}}, '
        '"loggers": {"django_redislock": {"handlers": ["err"], "level": "INFO"}}}'
    )
    run = _run(redis_server, configured)
    assert run.returncode == 0, run.stderr
    assert "force-released lock 'held-by-a-crashed-worker'" in run.stderr
