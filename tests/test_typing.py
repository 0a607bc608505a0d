"""The package's names have real types for a type checker, not ``Any``.

Most public names are loaded lazily by a module ``__getattr__`` (their modules
import Django), which type checkers never run: django_redislock/__init__.py
declares each of them again under ``TYPE_CHECKING``. These tests keep the two
lists and ``__all__`` in step, and ask mypy what it sees.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import django_redislock

ROOT = Path(__file__).resolve().parents[1]
INIT = ROOT / "django_redislock" / "__init__.py"


def _imports(body: list[ast.stmt]) -> dict[str, str]:
    """``{name: module}`` for the ``from .module import name`` statements of ``body``."""
    found: dict[str, str] = {}
    for node in body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for alias in node.names:
                found[alias.asname or alias.name] = node.module
    return found


def _declared() -> tuple[dict[str, str], dict[str, str]]:
    """(names imported at import time, names imported under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(INIT.read_text())
    checking = next(
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
    )
    return _imports(tree.body), _imports(checking.body)


def test_every_lazy_name_is_declared_for_type_checkers() -> None:
    eager, checking = _declared()
    lazy = django_redislock._LAZY
    assert checking == lazy
    assert set(django_redislock.__all__) == set(eager) | set(lazy)
    assert len(django_redislock.__all__) == len(set(django_redislock.__all__))


@pytest.mark.parametrize("name", sorted(django_redislock.__all__))
def test_each_exported_name_is_the_object_its_module_defines(name: str) -> None:
    eager, checking = _declared()
    module = importlib.import_module(f"django_redislock.{(eager | checking)[name]}")
    assert getattr(django_redislock, name) is getattr(module, name)


def test_the_declaration_check_can_fail() -> None:
    source = "if TYPE_CHECKING:\n    from .locks import get_lock\n"
    assert _imports(ast.parse(source).body) == {}
    assert _imports(ast.parse(source).body[0].body) == {"get_lock": "locks"}  # type: ignore[attr-defined]


SNIPPET = """\
from django_redislock import (
    Semaphore,
    StaleFence,
    current_fence,
    fenced_get,
    fenced_update,
    get_lock,
    get_semaphore,
    redis_locked,
)

reveal_type(redis_locked)
reveal_type(current_fence)
reveal_type(fenced_get)
reveal_type(fenced_update)
reveal_type(get_lock)
reveal_type(get_semaphore)
reveal_type(Semaphore)
reveal_type(StaleFence)
"""


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed")
def test_mypy_sees_the_lazy_names_with_their_types(tmp_path: Path) -> None:
    """What mypy reveals of the names the Quick start imports (the lint run's
    settings, plus ``--no-implicit-reexport``, as a strict project has)."""
    snippet = tmp_path / "uses_the_package.py"
    snippet.write_text(SNIPPET)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--no-implicit-reexport",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(snippet),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    revealed = [
        line.split('Revealed type is "', 1)[1].rstrip('"')
        for line in done.stdout.splitlines()
        if "Revealed type is" in line
    ]
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(revealed) == SNIPPET.count("reveal_type("), done.stdout
    assert all(shown != "Any" for shown in revealed), done.stdout
    assert revealed[4].endswith("-> django_redislock.core.lock.Lock"), revealed[4]
    assert revealed[5].endswith("-> django_redislock.core.semaphore.Semaphore"), revealed[5]
    assert "def (queryset: django.db.models.query.QuerySet" in revealed[3], revealed[3]
    assert revealed[7].endswith("-> django_redislock.locking.fencing.StaleFence"), revealed[7]
