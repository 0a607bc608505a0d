"""docs/testing.rst: its ``pytest.ini``, copied word for word into a new project, runs.

The file once set pytest-asyncio's options, which a project without
pytest-asyncio does not know: with ``filterwarnings = error`` pytest stopped
at once ("Unknown config option: asyncio_default_fixture_loop_scope"). Here
a project made by ``startproject`` gets the file as the page shows it, and
pytest runs in it, with warnings as errors, with and without pytest-asyncio.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import start_project
from tests.servers import RedisServer
from tests.test_testing_kit import child_env, entry_point_path  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parents[1]
INI = ROOT / "docs" / "examples" / "testing" / "pytest.ini"

pytestmark = pytest.mark.program

TESTS = """\
from django_redislock import get_lock


def test_a_lock_given_back(redislock_prefix):
    lock = get_lock("report", wait=0)
    assert lock.acquire()
    lock.release()


def test_a_lock_left_behind_fails():
    assert get_lock("left", timeout=60, wait=0).acquire()
"""


@pytest.fixture
def project(tmp_path: Path, redis_server: RedisServer) -> Path:
    """A new ``mysite`` project with the page's pytest.ini next to manage.py."""
    where = tmp_path / "mysite"
    start_project(where, timeout=60)
    with (where / "mysite" / "settings.py").open("a") as settings:
        settings.write(
            '\nINSTALLED_APPS += ["django_redislock"]\n'
            "CACHES = {'default': {'BACKEND': 'django_redis.cache.RedisCache', "
            f"'LOCATION': {redis_server.url!r}}}}}\n"
        )
    (where / "pytest.ini").write_text(INI.read_text())
    (where / "test_locks.py").write_text(TESTS)
    return where


def _pytest(project: Path, site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = child_env(site)
    env.pop("DJANGO_SETTINGS_MODULE", None)  # the file names the settings
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{project}"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-W", "error", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _outcome(run: subprocess.CompletedProcess[str]) -> str:
    assert "Unknown config option" not in run.stdout + run.stderr, run.stdout + run.stderr
    assert "INTERNALERROR" not in run.stdout + run.stderr, run.stdout + run.stderr
    return run.stdout.strip().splitlines()[-1]


@pytest.mark.slow  # a pytest of its own
def test_the_pages_pytest_ini_runs_in_a_new_project(
    project: Path,
    entry_point_path: Path,  # noqa: F811 - the fixture imported above
) -> None:
    # A project without pytest-asyncio: the file sets no option of its.
    run = _pytest(project, entry_point_path, "-p", "no:asyncio")
    assert run.returncode == 1, run.stdout + run.stderr
    outcome = _outcome(run)
    # redislock_check_leftovers fails the teardown of the test that leaves its lock.
    assert "2 passed, 1 error" in outcome, run.stdout
    assert "test_a_lock_left_behind_fails" in run.stdout


@pytest.mark.slow  # a pytest of its own
@pytest.mark.skipif(importlib.util.find_spec("pytest_asyncio") is None, reason="no pytest-asyncio")
def test_the_pages_pytest_ini_runs_with_pytest_asyncio_and_its_two_lines(
    project: Path,
    entry_point_path: Path,  # noqa: F811 - the fixture imported above
) -> None:
    """The page: add asyncio_mode and asyncio_default_fixture_loop_scope once
    pytest-asyncio is installed."""
    page = " ".join((ROOT / "docs" / "testing.rst").read_text().split())
    assert "``asyncio_mode = auto``" in page
    assert "``asyncio_default_fixture_loop_scope = function``" in page
    ini = project / "pytest.ini"
    ini.write_text(
        ini.read_text() + "asyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    (project / "test_async.py").write_text(
        "from django_redislock import get_async_lock\n\n\n"
        "async def test_an_async_lock(redislock_prefix):\n"
        '    lock = get_async_lock("report", wait=0)\n'
        "    assert await lock.acquire()\n"
        "    await lock.release()\n"
    )
    run = _pytest(project, entry_point_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "3 passed, 1 error" in _outcome(run), run.stdout
