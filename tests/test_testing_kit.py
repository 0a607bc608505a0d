"""``django_redislock.testing``: the test kit for projects, and its pytest plugin.

The kit's promises are checked here in-process; the plugin is also loaded the
way pytest loads it for users (its ``pytest11`` entry point, read from
setup.cfg) in a pytest of its own, and the documentation's examples
(docs/examples/testing) run in pytest and in Django's test runner.
"""

from __future__ import annotations

import asyncio
import configparser
import os
import re
import socket
import subprocess
import sys
import threading
import time
import unittest
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.test import override_settings

from django_redislock import LockNotAcquired, current_lock, get_lock, redis_lock, redis_locked
from django_redislock.conf import conf
from django_redislock.locking.factories import get_semaphore
from django_redislock.testing import (
    RedisLockTestMixin,
    assert_no_locks_left,
    hold_lock,
    hold_permits,
    isolated_prefix,
    leftovers,
    locks_disabled,
    redislock_settings,
    unique_prefix,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "docs" / "examples" / "testing"
PLUGIN = "django_redislock.testing.plugin"
# Bound on every pytest or test runner started here.
RUN_TIMEOUT = 120


@pytest.fixture(autouse=True)
def _no_stray_caps() -> Iterator[None]:
    """Every hold takes its wait cap away when it ends, however it ends."""
    from django_redislock.locking import factories as locks

    yield
    assert locks._wait_caps == {}


# -- holding a lock from elsewhere ---------------------------------------------------------
def test_a_held_lock_is_busy_for_the_test_thread(redislock_prefix: str) -> None:
    @redis_locked("job:{n}", wait=5)
    def job(n: int) -> str:
        return "ran"

    with hold_lock("job:1") as lock:
        assert lock.name == "job:1" and lock.held
        assert current_lock() is None  # never made current: nothing re-enters it
        with pytest.raises(LockNotAcquired):
            job(1)
        with pytest.raises(LockNotAcquired), redis_lock("job:1"):
            pass
        assert job(2) == "ran"
    assert job(1) == "ran"
    assert_no_locks_left()


def test_a_lock_held_with_redis_lock_is_reentered_instead(redislock_prefix: str) -> None:
    # The trap the kit exists for: the same thread runs the code under it.
    @redis_locked("job:{n}", wait=0)
    def job(n: int) -> str:
        return "ran"

    with redis_lock("job:1"):
        assert job(1) == "ran"


def test_the_hold_caps_waits_for_its_name_only(redislock_prefix: str) -> None:
    assert get_lock("job:1", wait=30).wait == 30
    with hold_lock("job:1"):
        assert get_lock("job:1", wait=30).wait == 0
        assert get_lock("job:1").wait == 0
        assert get_lock("job:2", wait=30).wait == 30
        assert get_semaphore("job:1", 2, wait=30).wait == 30  # another kind
    assert get_lock("job:1", wait=30).wait == 30
    with hold_lock("job:1", wait=0.5):
        assert get_lock("job:1", wait=30).wait == 0.5
        assert get_lock("job:1", wait=0.1).wait == 0.1
    with hold_lock("job:1", wait=None):
        assert get_lock("job:1", wait=30).wait == 30


def test_the_hold_fails_clearly_when_the_lock_is_taken(redislock_prefix: str) -> None:
    other = get_lock("job:1", wait=0, label="shop.views.checkout")
    assert other.acquire()
    try:
        with pytest.raises(AssertionError, match=r"already held \(held by shop\.views\.checkout"):
            hold_lock("job:1").__enter__()
    finally:
        other.release()


def test_the_hold_is_released_even_if_the_test_released_it(redislock_prefix: str) -> None:
    with hold_lock("job:1") as lock:
        lock.release()
    with hold_lock("job:1"):
        pass
    assert_no_locks_left()


async def test_async_with_hold_lock(redislock_prefix: str) -> None:
    @redis_locked("job:{n}", wait=5)
    async def job(n: int) -> str:
        return "ran"

    async with hold_lock("job:1"):
        with pytest.raises(LockNotAcquired):
            await job(1)
    assert await job(1) == "ran"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"name": ""}, TypeError, "name must be a non-empty str"),
        ({"name": "x", "timeout": 0}, ValueError, r"hold_lock\(\): timeout must be"),
        ({"name": "x", "wait": -1}, ValueError, r"hold_lock\(\): wait must be"),
        ({"name": "x", "wait": "0"}, TypeError, r"hold_lock\(\): wait must be a number"),
    ],
)
def test_hold_lock_arguments(kwargs: dict, error: type, message: str) -> None:
    name = kwargs.pop("name")
    with pytest.raises(error, match=message):
        hold_lock(name, **kwargs)


def test_hold_permits_fills_the_semaphore(redislock_prefix: str) -> None:
    with hold_permits("pool", 3) as permits:
        assert len(permits) == 3
        assert not get_semaphore("pool", 3, wait=10).acquire()
    with hold_permits("pool", 3, count=2):
        sem = get_semaphore("pool", 3, wait=0)
        assert sem.acquire()
        sem.release()
    assert_no_locks_left()
    with pytest.raises(ValueError, match=r"count \(4\) is more than the limit \(3\)"):
        hold_permits("pool", 3, count=4)


# -- prefixes --------------------------------------------------------------------------------
def test_prefixes_are_unique_and_name_the_xdist_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    prefixes = {unique_prefix() for _ in range(200)}
    assert len(prefixes) == 200
    assert all(p.startswith(f"{conf.PREFIX}:test:gw3:") for p in prefixes)
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert unique_prefix("app").startswith("app:test:main:")
    assert unique_prefix("x" * 60).startswith("test:main:")  # base too long: left out


def test_a_prefix_hides_other_prefixes_locks() -> None:
    with isolated_prefix() as first, hold_lock("job:1"):
        assert first == conf.PREFIX
        with isolated_prefix() as second:
            assert second != first
            lock = get_lock("job:1", wait=0, label="inner")
            assert lock.acquire()  # not the same lock: other keys
            (line,) = leftovers()  # and only this prefix's are seen
            assert line.startswith("lock 'job:1': held by inner on ")
            lock.release()
            assert leftovers() == []
        assert first == conf.PREFIX


def test_prefix_keeps_the_other_settings_and_nests() -> None:
    with override_settings(REDISLOCK={"WAIT": 3, "BUSY_STATUS": 423}):
        with isolated_prefix("mine") as prefix:
            assert prefix == "mine"
            assert (conf.PREFIX, conf.WAIT, conf.BUSY_STATUS) == ("mine", 3, 423)
            with redislock_settings(WAIT=0):
                assert (conf.PREFIX, conf.WAIT, conf.BUSY_STATUS) == ("mine", 0, 423)
            assert conf.WAIT == 3
        assert settings.REDISLOCK == {"WAIT": 3, "BUSY_STATUS": 423}


@isolated_prefix()
async def test_isolated_prefix_decorates_coroutines() -> None:
    # The prefix is in force while the coroutine runs, not only while it is made.
    assert ":test:" in conf.PREFIX
    await asyncio.sleep(0)
    assert ":test:" in conf.PREFIX


def test_bad_prefix_and_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="invalid key prefix"), isolated_prefix("a{b}"):
        pass
    with pytest.raises(TypeError, match=r"unknown REDISLOCK setting\(s\) WIAT; valid names"):
        redislock_settings(WIAT=0)
    with pytest.raises(TypeError, match="use RedisLockTestMixin"):
        redislock_settings(WAIT=0)(unittest.TestCase)


# -- leftovers -------------------------------------------------------------------------------
def test_leftovers_name_what_was_left(redislock_prefix: str) -> None:
    assert_no_locks_left()
    lock = get_lock("order:7", wait=0, label="shop.tasks.ship")
    assert lock.acquire()
    sem = get_semaphore("reports", 2, wait=0, label="shop.views.report")
    assert sem.acquire()
    with pytest.raises(AssertionError) as failed:
        assert_no_locks_left()
    message = str(failed.value)
    assert message.startswith(
        f"2 lock(s), permit(s) or waiter(s) left behind under prefix {redislock_prefix!r}:\n"
    )
    assert (
        f"lock 'order:7': held by shop.tasks.ship on {socket.gethostname()} pid {os.getpid()}"
        in message
    )
    assert "semaphore 'reports' (limit 2): permit held by shop.views.report" in message
    lock.release()
    sem.release()
    assert_no_locks_left()


def test_leftovers_include_waiters_but_not_the_tests_own_holds(redislock_prefix: str) -> None:
    got, done = threading.Event(), threading.Event()

    def wait_for_it() -> None:
        waiter = get_lock("job:1", wait=30, label="waiter")
        if waiter.acquire():
            got.set()
            done.wait(10)
            waiter.release()

    thread = threading.Thread(target=wait_for_it)
    with hold_lock("job:1", wait=None):
        assert leftovers() == []  # the hold is the test's own
        thread.start()
        deadline = time.monotonic() + 10
        while not leftovers() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert leftovers() == ["lock 'job:1': 1 queued waiter(s)"]
    try:
        # The hold's release handed the lock to the waiter: no longer ours.
        assert got.wait(10)
        (line,) = leftovers()
        assert line.startswith("lock 'job:1': held by waiter on ")
    finally:
        done.set()
        thread.join(10)
    assert_no_locks_left()


# -- locks off -------------------------------------------------------------------------------
def test_locks_disabled_runs_code_unlocked(redislock_prefix: str) -> None:
    @redis_locked("job:{n}", wait=0)
    def job(n: int) -> object:
        return current_lock()

    with hold_lock("job:1"), locks_disabled():
        assert job(1) is None
        with redis_lock("job:1") as lock:
            assert lock is None
    assert job(1) is not None


@locks_disabled()
async def test_locks_disabled_decorates_coroutines() -> None:
    assert conf.ENABLED is False

    @redis_locked("job:{n}", wait=0)
    async def job(n: int) -> object:
        return current_lock()

    assert await job(1) is None


# -- the unittest mixin --------------------------------------------------------------------------
class _Leaky(RedisLockTestMixin, unittest.TestCase):
    __test__ = False  # run by the test below, which expects one to fail

    def test_leaks(self) -> None:
        assert conf.PREFIX == self.redislock_prefix != "redislock"
        assert get_lock("leaked", wait=0, label="leaky").acquire()

    def test_tidy(self) -> None:
        with hold_lock("held"), redis_lock("tidy"):
            pass


def test_mixin_isolates_and_checks_leftovers() -> None:
    before = conf.PREFIX
    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(_Leaky).run(result)
    assert result.testsRun == 2
    assert [test.id().rsplit(".", 1)[1] for test, _ in result.failures] == ["test_leaks"]
    assert result.errors == []
    (_, trace) = result.failures[0]
    assert "1 lock(s), permit(s) or waiter(s) left behind under prefix" in trace
    assert "lock 'leaked': held by leaky on" in trace
    assert before == conf.PREFIX


# -- the plugin as pytest loads it, and the documentation's examples ------------------------------
@pytest.fixture
def entry_point_path(tmp_path: Path) -> Path:
    """A directory whose dist-info declares setup.cfg's ``pytest11`` entry points,
    as installing the package would: pytest finds the plugin through it."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    section = cfg["options.entry_points"]["pytest11"]
    dist = tmp_path / "site" / "django_redislock_probe-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: django-redislock-probe\nVersion: 0.0\n"
    )
    (dist / "entry_points.txt").write_text(f"[pytest11]\n{section.strip()}\n")
    return dist.parent


def run_pytest(*args: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )


def child_env(*paths: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(ROOT)])
    env.pop("PYTEST_XDIST_WORKER", None)
    return env


def test_entry_point_is_declared_as_the_module() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert cfg["options.entry_points"]["pytest11"].strip() == f"{PLUGIN} = {PLUGIN}"


@pytest.mark.slow  # a pytest or test runner of its own
@pytest.mark.program
def test_documented_pytest_examples_pass_with_the_entry_point(entry_point_path: Path) -> None:
    # No -p: the fixtures come from the entry point alone.
    run = run_pytest(
        "-q",
        "-c",
        str(EXAMPLES / "pytest.ini"),
        # The file names a new project's settings (docs/testing.rst); the
        # examples run against the suite's.
        "--ds",
        "tests.settings",
        str(EXAMPLES / "test_with_pytest.py"),
        env=child_env(entry_point_path),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "6 passed" in run.stdout


@pytest.mark.slow  # a pytest or test runner of its own
@pytest.mark.program
def test_plugin_is_loaded_once_from_entry_point_and_conftest(
    entry_point_path: Path, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "conftest.py").write_text(f"pytest_plugins = [{PLUGIN!r}]\n")
    (project / "test_one.py").write_text(
        "def test_one(request, redislock_prefix):\n"
        f"    assert request.config.pluginmanager.has_plugin({PLUGIN!r})\n"
    )
    run = run_pytest(
        "-q",
        "-p",
        PLUGIN,
        "--rootdir",
        str(project),
        env=child_env(entry_point_path),
        cwd=project,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout


@pytest.mark.slow  # a pytest or test runner of its own
@pytest.mark.program
def test_plugin_is_harmless_without_django(entry_point_path: Path, tmp_path: Path) -> None:
    project = tmp_path / "plain"
    project.mkdir()
    (project / "test_plain.py").write_text(
        "import sys\n"
        "def test_nothing_from_django_was_imported(request):\n"
        f"    assert request.config.pluginmanager.has_plugin({PLUGIN!r})\n"
        "    assert not [m for m in sys.modules if m == 'django' or m.startswith('django.')]\n"
        "    assert 'django_redislock.testing.plugin' in sys.modules\n"
    )
    env = child_env(entry_point_path)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    # pytest-django would import Django itself: this is a project without it.
    run = run_pytest("-q", "-p", "no:django", "--rootdir", str(project), env=env, cwd=project)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout


@pytest.mark.slow  # a pytest or test runner of its own
@pytest.mark.program
def test_no_leftovers_fixture_and_ini_option_fail_a_leaking_test(
    entry_point_path: Path, tmp_path: Path
) -> None:
    project = tmp_path / "leaky"
    project.mkdir()
    (project / "test_leaky.py").write_text(
        "from django_redislock import get_lock\n"
        "def test_leaks(redislock_no_leftovers):\n"
        "    assert get_lock('leaked', wait=0).acquire()\n"
        "def test_leaks_too():\n"
        "    assert get_lock('leaked:too', wait=0).acquire()\n"
        "def test_tidy(redislock_no_leftovers):\n"
        "    pass\n"
    )
    env = child_env(entry_point_path, DJANGO_SETTINGS_MODULE="tests.settings")
    run = run_pytest("-q", "--rootdir", str(project), env=env, cwd=project)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "3 passed, 1 error" in run.stdout
    assert "ERROR test_leaky.py::test_leaks - AssertionError: 1 lock(s)" in run.stdout
    assert "lock 'leaked': held by" in run.stdout
    ini = ("-o", "redislock_check_leftovers=true")
    run = run_pytest("-q", *ini, "--rootdir", str(project), env=env, cwd=project)
    assert "3 passed, 2 errors" in run.stdout, run.stdout + run.stderr
    assert "lock 'leaked:too': held by" in run.stdout


@pytest.mark.slow  # a pytest or test runner of its own
@pytest.mark.program
def test_prefixes_differ_across_xdist_workers(entry_point_path: Path, tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    project = tmp_path / "xdist"
    project.mkdir()
    out = tmp_path / "prefixes"
    out.mkdir()
    (project / "test_many.py").write_text(
        "import os, pytest\n"
        "from django_redislock.testing import hold_lock\n"
        "@pytest.mark.parametrize('n', range(12))\n"
        "def test_hold_the_same_name(n, redislock_prefix):\n"
        "    worker = os.environ['PYTEST_XDIST_WORKER']\n"
        "    assert f':test:{worker}:' in redislock_prefix\n"
        f"    open(os.path.join({str(out)!r}, str(n)), 'w').write(redislock_prefix)\n"
        "    with hold_lock('shared'):\n"
        "        pass\n"
    )
    env = child_env(entry_point_path, DJANGO_SETTINGS_MODULE="tests.settings")
    run = run_pytest("-q", "-n", "2", "--rootdir", str(project), env=env, cwd=project)
    assert run.returncode == 0, run.stdout + run.stderr
    prefixes = [p.read_text() for p in out.iterdir()]
    assert len(prefixes) == 12 == len(set(prefixes))
    assert {p.split(":test:")[1].split(":")[0] for p in prefixes} == {"gw0", "gw1"}


@pytest.mark.slow  # a pytest or test runner of its own
@pytest.mark.program
def test_documented_unittest_examples_pass_in_djangos_runner(tmp_path: Path) -> None:
    # A test database of its own: the suite's sits beside the Redis socket.
    (tmp_path / "child_settings.py").write_text(
        "from tests.settings import *  # noqa: F403\n"
        "DATABASES = {'default': {'ENGINE': 'django.db.backends.sqlite3', "
        f"'NAME': {str(tmp_path / 'db.sqlite3')!r}, "
        f"'TEST': {{'NAME': {str(tmp_path / 'test.sqlite3')!r}}}}}}}\n"
    )
    run = subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            "-m",
            "django",
            "test",
            str(EXAMPLES),
            "--pattern",
            "test_with_unittest.py",
            "-v",
            "2",
        ],
        cwd=ROOT,
        env=child_env(tmp_path, DJANGO_SETTINGS_MODULE="child_settings"),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Ran 7 tests" in run.stderr and "\nOK" in run.stderr


def test_testing_page_shows_only_code_that_runs_here() -> None:
    """docs/testing.rst: every code block is a ``literalinclude`` of a file this
    module runs (the examples and their pytest.ini) or of the test app's views,
    and every ``:pyobject:`` it names exists."""
    page = (ROOT / "docs" / "testing.rst").read_text()
    assert "code-block::" not in page and "::\n\n    " not in page
    includes = re.findall(r"^\.\. literalinclude:: (\S+)\n((?:   :\S+:.*\n)*)", page, re.M)
    assert includes
    run_here = {
        EXAMPLES / "test_with_pytest.py",
        EXAMPLES / "test_with_unittest.py",
        EXAMPLES / "pytest.ini",
        ROOT / "tests" / "testapp" / "views_locked.py",
        # Run by tests/test_unique_tasks_local.py.
        EXAMPLES / "test_unique_tasks.py",
        ROOT / "tests" / "testapp" / "tasks.py",
    }
    shown = set()
    for path, options in includes:
        source = (ROOT / "docs" / path).resolve()
        assert source in run_here, path
        shown.add(source)
        for name in re.findall(r":pyobject: (\S+)", options):
            assert re.search(rf"^(async )?def {name}\(", source.read_text(), re.M), name
    assert shown == run_here
