"""The package's layout rules (docs/internals.rst, "Package layout"), checked on its source."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.helpers import gen_sync

PACKAGE = Path(__file__).resolve().parent.parent / "django_redislock"
# Folders built on locking/: it never imports them.
ABOVE_LOCKING = ("throttling", "tasks", "ops", "idempotency", "contrib", "testing")


def modules() -> list[Path]:
    """The Django layer's modules: every one outside ``core/``."""
    return sorted(p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] != "core")


def dotted(path: Path) -> list[str]:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(absolute module, imported names, line) of each ``from ... import`` of the package."""
    found = []
    package = dotted(path) if path.name == "__init__.py" else dotted(path)[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[: len(package) - node.level + 1]
            module = ".".join([*base, *([node.module] if node.module else [])])
        else:
            module = node.module or ""
        if module.split(".")[0] == "django_redislock":
            found.append((module, [alias.name for alias in node.names], node.lineno))
    return found


@pytest.mark.parametrize(
    "path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_no_module_imports_another_modules_underscore_names(path: Path) -> None:
    private = [
        f"line {line}: {name} from {module}"
        for module, names, line in imports(path)
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert private == []


@pytest.mark.parametrize("path", sorted((PACKAGE / "locking").rglob("*.py")), ids=lambda p: p.name)
def test_locking_imports_no_folder_built_on_it(path: Path) -> None:
    upward = [
        f"line {line}: {module}"
        for module, _names, line in imports(path)
        if module.split(".")[1:2] and module.split(".")[1] in ABOVE_LOCKING
    ]
    assert upward == []


def test_the_core_imports_nothing_of_the_django_layer() -> None:
    outward = [
        f"{path.relative_to(PACKAGE)} line {line}: {module}"
        for path in sorted((PACKAGE / "core").rglob("*.py"))
        for module, _names, line in imports(path)
        if module != "django_redislock" and not module.startswith("django_redislock.core")
    ]
    assert outward == []


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_django_layer_imports_the_core_through_its_seam_only(path: Path) -> None:
    """``core/__init__.py`` names everything the Django layer uses: no module of
    the layer reaches into one of the core's own."""
    past = [
        f"line {line}: {module}"
        for module, _names, line in imports(path)
        if module.startswith("django_redislock.core.")
    ]
    assert past == []


def test_the_seam_exports_only_what_the_django_layer_uses() -> None:
    """The seam's names are the layer's: each is imported from it somewhere
    outside the core, or is documented under ``django_redislock.core`` in the
    API reference (the maxima)."""
    import django_redislock.core as core

    api = (PACKAGE.parent / "docs" / "api.rst").read_text(encoding="utf-8")
    documented = set(re.findall(r"django_redislock\.core\.(\w+)$", api, re.M))

    used = {
        name
        for path in modules()
        for module, names, _line in imports(path)
        if module == "django_redislock.core"
        for name in names
    }
    assert sorted(set(core.__all__) - used - documented) == []


@pytest.mark.parametrize(
    "path",
    sorted((PACKAGE / "core" / "engine").rglob("*.py")),
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_the_engine_does_no_io(path: Path) -> None:
    """``core/engine/`` decides without I/O: it imports none of the folders
    that talk to Redis (``io/``), hold handles (``drivers/``) or read for
    operators (``ops/``)."""
    io = [
        f"line {line}: {module}"
        for module, _names, line in imports(path)
        if module.split(".")[2:3] and module.split(".")[2] in ("io", "drivers", "ops")
    ]
    assert io == []


def test_no_hand_written_module_runs_past_400_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE)): lines
        for path in modules()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > 400
    }
    assert long == {}


@pytest.mark.parametrize(
    "path", sorted((PACKAGE / "core").rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_in_the_core_only_ops_imports_the_drivers_and_nothing_imports_ops(path: Path) -> None:
    folder = path.relative_to(PACKAGE / "core").parts[0]
    forbidden = {"ops"} if folder in ("drivers", "ops") else {"drivers", "ops"}
    if path == PACKAGE / "core" / "__init__.py":
        forbidden = set()  # the seam: it exports what the Django layer uses, from any folder
    wrong = [
        f"line {line}: {module}"
        for module, _names, line in imports(path)
        if module.split(".")[2:3] and module.split(".")[2] in forbidden - {folder}
    ]
    assert wrong == []


def _hand_written_twins(path: Path) -> list[str]:
    """The functions ``x_async`` (coroutines, or functions that start a task)
    of ``path`` beside a ``def x`` of the same module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    functions = [
        n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    sync = {n.name for n in functions if isinstance(n, ast.FunctionDef)}
    return sorted(
        n.name
        for n in functions
        if n.name.endswith("_async") and n.name.removesuffix("_async") in sync
    )


@pytest.mark.parametrize(
    "path", sorted((PACKAGE / "core" / "io").glob("*.py")), ids=lambda p: p.name
)
def test_no_io_module_writes_a_sync_and_an_asyncio_twin_side_by_side(path: Path) -> None:
    """A call with both shells is written once, for asyncio, and its sync twin
    generated (``tools/gen_sync.py``); what truly differs lives in a primitives
    module of each shell, never as two hand-written twins in one file."""
    assert _hand_written_twins(path) == []


def test_each_io_module_with_both_shells_is_an_asyncio_source_with_a_generated_twin() -> None:
    """The bounded calls (``calls_async.py``) and a Cluster's wake-ups
    (``wakeups_sharded_async.py``) are pairs of ``tools/gen_sync.py``, and every
    generated module of ``core/io`` says so and has its source beside it: what
    threads do differently is in the primitives, never in a generated file."""
    generator = gen_sync()
    io = PACKAGE / "core" / "io"
    pairs = {
        (PACKAGE.parent / source).name: (PACKAGE.parent / target).name
        for source, target in generator.PAIRS
        if (PACKAGE.parent / source).parent == io
    }
    assert pairs.get("calls_async.py") == "calls.py"
    assert pairs.get("wakeups_sharded_async.py") == "wakeups_sharded.py"
    generated = {
        p.name: p.read_text(encoding="utf-8").splitlines()[0]
        for p in io.glob("*.py")
        if p.read_text(encoding="utf-8").startswith("# generated from")
    }
    assert generated == {
        target: f"# generated from {source} by tools/gen_sync.py; do not edit"
        for source, target in pairs.items()
    }


WAKEUPS = PACKAGE / "core" / "io"
# The notifiers, each a shell around wakeups_base.py's I/O-free decisions.
NOTIFIERS = ("wakeups.py", "wakeups_async.py", "wakeups_sharded_async.py", "wakeups_sharded.py")


@pytest.mark.parametrize("name", NOTIFIERS)
def test_a_notifier_imports_no_other_notifier_but_the_cluster_one(name: str) -> None:
    """Below every notifier is ``wakeups_base.py`` (addresses, reconnection,
    liveness, events, a Cluster's tags and messages): a notifier takes what it
    shares from there, never from another notifier; only the registries of
    ``wakeups.py`` and ``wakeups_async.py`` make the Cluster notifier."""
    allowed = {
        "wakeups.py": {"wakeups_sharded"},
        "wakeups_async.py": {"wakeups_sharded_async"},
    }.get(name, set())
    others = {n.removesuffix(".py") for n in NOTIFIERS} - allowed - {name.removesuffix(".py")}
    wrong = [
        f"line {line}: {module}"
        for module, _names, line in imports(WAKEUPS / name)
        if module.rpartition(".")[2] in others
    ]
    assert wrong == []
