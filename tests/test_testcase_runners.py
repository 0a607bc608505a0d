"""A new project's ``TestCase`` tests, under ``manage.py test`` and under pytest-django.

tests/test_testcase_transactions.py checks, in this suite's own process, that a
lock taken inside a test's ``transaction.atomic()`` block is released when the
block ends. Here a project made by ``startproject``, with an app of one model
and one locked function, runs the same scenarios as its developers would: a
``TestCase`` with ``RedisLockTestMixin`` under ``manage.py test``, and tests
marked ``django_db`` under pytest with ``redislock_check_leftovers``. Each
scenario ends with ``hold_lock`` on the name and the leftover check.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import start_project
from tests.servers import RedisServer
from tests.test_testing_kit import child_env, entry_point_path  # noqa: F401 - a fixture

# Each test starts a runner of its own; bounds for a host loaded by other suites.
RUN_TIMEOUT = 300
pytestmark = [pytest.mark.program, pytest.mark.slow, pytest.mark.timeout(2 * RUN_TIMEOUT)]

MODELS = """\
from django.db import models


class Product(models.Model):
    name = models.CharField(max_length=50)
"""

LOCKED = """\
from django_redislock import redis_locked

from .models import Product


@redis_locked("sell:{n}", wait=0)
def sell(n):
    Product.objects.create(name=f"sold-{n}")
"""

UNITTEST = """\
from django.db import transaction
from django.test import TestCase

from django_redislock.testing import RedisLockTestMixin, hold_lock
from shop.locked import sell


class Boom(Exception):
    pass


class SellTests(RedisLockTestMixin, TestCase):
    def test_block_commits(self):
        with transaction.atomic():
            sell(1)
        with hold_lock("sell:1"):
            pass

    def test_block_rolls_back(self):
        with self.assertRaises(Boom), transaction.atomic():
            sell(1)
            raise Boom
        with hold_lock("sell:1"):
            pass

    def test_nested_blocks(self):
        with transaction.atomic():
            with transaction.atomic():
                sell(1)
            sell(1)
        with hold_lock("sell:1"):
            pass

    def test_on_commit_callbacks(self):
        with self.captureOnCommitCallbacks(execute=True) as callbacks:
            with transaction.atomic():
                sell(1)
                transaction.on_commit(lambda: None)
        self.assertEqual(len(callbacks), 1)
        with hold_lock("sell:1"):
            pass

    @transaction.atomic
    def test_decorated_test(self):
        sell(1)
        # The check after the test (the mixin's) finds the lock given back.
"""

PYTEST = """\
import pytest
from django.db import transaction

from django_redislock.testing import hold_lock
from shop.locked import sell


class Boom(Exception):
    pass


@pytest.mark.django_db
def test_block_commits():
    with transaction.atomic():
        sell(1)
    with hold_lock("sell:1"):
        pass


@pytest.mark.django_db
def test_block_rolls_back():
    with pytest.raises(Boom), transaction.atomic():
        sell(1)
        raise Boom
    with hold_lock("sell:1"):
        pass


@pytest.mark.django_db
def test_nested_blocks():
    with transaction.atomic():
        with transaction.atomic():
            sell(1)
        sell(1)
    with hold_lock("sell:1"):
        pass


@pytest.mark.django_db
def test_on_commit_callbacks(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with transaction.atomic():
            sell(1)
            transaction.on_commit(lambda: None)
    assert len(callbacks) == 1
    with hold_lock("sell:1"):
        pass


@pytest.mark.django_db
@transaction.atomic
def test_decorated_test():
    sell(1)
    # redislock_check_leftovers finds the lock given back.
"""

INI = """\
[pytest]
DJANGO_SETTINGS_MODULE = mysite.settings
redislock_isolate = true
redislock_check_leftovers = true
"""


@pytest.fixture
def project(tmp_path: Path, redis_server: RedisServer) -> Path:
    """``startproject mysite`` with an app ``shop``, its tests for both runners."""
    where = tmp_path / "mysite"
    start_project(where, timeout=RUN_TIMEOUT)
    with (where / "mysite" / "settings.py").open("a") as settings:
        settings.write(
            '\nINSTALLED_APPS += ["django_redislock", "shop"]\n'
            "CACHES = {'default': {'BACKEND': 'django_redis.cache.RedisCache', "
            f"'LOCATION': {redis_server.url!r}}}}}\n"
        )
    shop = where / "shop"
    shop.mkdir()
    for name, text in [
        ("__init__.py", ""),
        ("models.py", MODELS),
        ("locked.py", LOCKED),
        ("tests.py", UNITTEST),
    ]:
        (shop / name).write_text(text)
    (where / "test_shop.py").write_text(PYTEST)
    (where / "pytest.ini").write_text(INI)
    return where


def _run(project: Path, site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = child_env(site)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env["PYTHONPATH"] = f"{project}:{env['PYTHONPATH']}"
    return subprocess.run(
        [sys.executable, "-W", "error", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )


def test_manage_py_test(
    project: Path,
    entry_point_path: Path,  # noqa: F811 - the fixture imported above
) -> None:
    run = _run(project, entry_point_path, "manage.py", "test", "shop", "-v", "2")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Ran 5 tests" in run.stderr and "\nOK" in run.stderr, run.stderr


def test_pytest_django_db(
    project: Path,
    entry_point_path: Path,  # noqa: F811 - the fixture imported above
) -> None:
    run = _run(
        project,
        entry_point_path,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:asyncio",
        "test_shop.py",
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "5 passed" in run.stdout.strip().splitlines()[-1], run.stdout
