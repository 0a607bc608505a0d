"""Every code block in README.rst and docs/*.rst runs, or at least compiles.

Python blocks (``.. code-block:: python``, and ``::`` literal blocks whose text
is Python) are compiled, then:

* a block with no marker must be self-contained: it is run against the test
  settings (a ``redis.Redis()`` built without an address reaches the suite's
  private server, not the machine's). Only the names in ``STAND_INS`` (the
  reader's own work, such as ``build_report``) may be used without being
  defined;
* a block preceded by the RST comment ``.. test: settings`` is a settings
  snippet: it is run in a fresh namespace, must define upper-case names, and
  its ``REDISLOCK`` (and ``CACHES``) must pass the library's system checks;
* a block preceded by ``.. test: fragment`` needs names from its
  surroundings (a model, a view decorator, a Celery ``app``): it is only
  compiled.

Shell blocks (``console``, ``shell``, ``bash``, and ``::`` blocks of commands)
are checked command by command: ``manage.py redislocks ...`` is parsed by the
command's own argument parser, other ``manage.py`` commands must exist,
``python -m module`` must name an importable module, a script path must exist,
and ``tox -e``/``-m`` must name an environment or label of tox.ini.

Pages a reader follows step by step (the tutorial, and the README's Quick
start) are not checked here: tests/test_tutorial.py does every step of them in
a new project, commands and files alike, and compares what they print.

Larger examples are better pulled from tested files with ``literalinclude``;
those files must exist, with the object they name.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import configparser
import importlib.util
import inspect
import itertools
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.management import CommandError, get_commands
from django.test import override_settings

from django_redislock.checks import check_settings
from django_redislock.management.commands.redislocks import Command as RedislocksCommand
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "README.rst", *sorted((ROOT / "docs").glob("*.rst"))]

PYTHON = {"python", "python3", "py", "pycon3"}
SHELL = {"console", "shell", "bash", "sh", "shell-session"}
MARKERS = {"settings", "fragment"}

DIRECTIVE = re.compile(r"^(\s*)\.\. (?:code-block|code|sourcecode)::\s*(\S*)\s*$")
MARKER = re.compile(r"^\s*\.\. test: (\S+)\s*$")
INCLUDE = re.compile(r"^(\s*)\.\. literalinclude:: (\S+)\s*$")


def _calls_anything(*args: Any, **kwargs: Any) -> None:
    """Stands in for the reader's own work in an example."""


# Names an example may use without defining them: the reader's own functions.
STAND_INS: dict[str, Any] = {
    "build_report": _calls_anything,
    "write_report": _calls_anything,
    "run_export": _calls_anything,
}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the block's first line of text
    language: str  # "python", "shell", "text" or a Pygments name
    marker: str | None
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _body(lines: list[str], start: int, outer: int) -> tuple[int, str]:
    """The indented body beginning after line ``start`` (0-based), deeper than ``outer``."""
    i = start + 1
    # Directive options (":language: python") sit right under the directive.
    while i < len(lines) and lines[i].strip().startswith(":") and _indent(lines[i]) > outer:
        i += 1
    body: list[str] = []
    first = None
    while i < len(lines):
        line = lines[i]
        if line.strip() and _indent(line) <= outer:
            break
        if line.strip() and first is None:
            first = i
        if first is not None:
            body.append(line)
        i += 1
    while body and not body[-1].strip():
        body.pop()
    depth = min((_indent(x) for x in body if x.strip()), default=0)
    text = "\n".join(x[depth:] for x in body) + "\n"
    return (first if first is not None else start) + 1, text


def _marker(lines: list[str], i: int) -> str | None:
    """The ``.. test: X`` comment on the nearest non-blank line before line ``i``."""
    j = i - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    match = MARKER.match(lines[j]) if j >= 0 else None
    if match is None:
        return None
    assert match.group(1) in MARKERS, f"unknown marker {match.group(1)!r}"
    return match.group(1)


def _literal_language(text: str) -> str:
    """What a ``::`` literal block holds: commands, Python, or other text."""
    first = [line for line in text.splitlines() if line.strip()]
    if any(line.startswith("$ ") for line in first):
        return "shell"
    words = {line.split()[0] for line in first}
    if words <= {"python", "python3", "tox", "pip"} or any("/bin/" in w for w in words):
        return "shell"
    try:
        ast.parse(text)
    except SyntaxError:
        return "text"
    return "python"


def blocks(path: Path) -> Iterator[Block]:
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        directive = DIRECTIVE.match(line)
        if directive:
            language = directive.group(2).lower()
            if language in PYTHON:
                language = "python"
            elif language in SHELL:
                language = "shell"
            start, text = _body(lines, i, _indent(line))
            yield Block(path, start, language, _marker(lines, i), text)
            continue
        stripped = line.strip()
        if stripped.endswith("::") and not stripped.startswith(".."):
            start, text = _body(lines, i, _indent(line))
            if text.strip():
                yield Block(path, start, _literal_language(text), None, text)


def includes(path: Path) -> Iterator[tuple[Path, list[str], int]]:
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        match = INCLUDE.match(line)
        if match:
            options = []
            j = i + 1
            while j < len(lines) and lines[j].strip().startswith(":"):
                options.append(lines[j].strip())
                j += 1
            yield (path.parent / match.group(2)).resolve(), options, i + 1


def _walked(block: Block) -> bool:
    """A block of a page that tests/test_tutorial.py follows as a reader does."""
    if block.path == ROOT / "docs" / "tutorial.rst":
        return True
    if block.path != ROOT / "README.rst":
        return False
    lines = block.path.read_text().splitlines()
    start = lines.index("Quick start")
    end = next(i for i in range(start + 2, len(lines)) if re.fullmatch(r"=+", lines[i]))
    return start < block.line - 1 < end


ALL = [block for source in SOURCES for block in blocks(source) if not _walked(block)]
PY = [b for b in ALL if b.language == "python"]
SH = [b for b in ALL if b.language == "shell"]


def _ids(items: list[Block]) -> list[str]:
    return [b.where for b in items]


def _compile(block: Block) -> Any:
    try:
        return compile(
            block.text, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
        )
    except SyntaxError as exc:
        pytest.fail(f"{block.where}: the block does not compile: {exc}")


def _free_names(tree: ast.AST) -> set[str]:
    """Names the block reads but never binds (scopes flattened: a fair approximation)."""
    loaded: set[str] = set()
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return loaded - bound - set(dir(builtins))


def test_the_sources_have_blocks() -> None:
    # A parser that finds nothing would pass everything.
    assert len(PY) >= 15 and len(SH) >= 4
    markers = {b.marker for b in PY}
    assert {"settings", "fragment", None} <= markers


@pytest.fixture
def private_redis(
    monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer
) -> Iterator[list[Any]]:
    """``redis.Redis()`` with no address reaches the suite's server, not localhost:6379.

    Returns the clients the block built that way."""
    socket_path = redis_server.socket_path
    built: list[Any] = []

    class PrivateRedis(redis.Redis):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            addressed = args or {"host", "port", "unix_socket_path", "connection_pool"} & set(
                kwargs
            )
            if not addressed:
                kwargs["unix_socket_path"] = socket_path
                built.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(redis, "Redis", PrivateRedis)
    yield built
    for client in built:
        client.close()


@pytest.mark.parametrize("block", PY, ids=_ids(PY))
def test_python_block(block: Block, request: pytest.FixtureRequest) -> None:
    code = _compile(block)
    if block.marker == "fragment":
        return
    namespace: dict[str, Any] = {"__name__": "docs_block"}
    if block.marker == "settings":
        _run(code, namespace)
        _check_settings(block, namespace)
        return
    free = _free_names(ast.parse(block.text))
    missing = free - set(STAND_INS)
    assert not missing, (
        f"{block.where}: the block uses {sorted(missing)} without defining them; make it "
        "self-contained, or mark it with '.. test: fragment' before the code-block directive"
    )
    built = request.getfixturevalue("private_redis")
    namespace.update({name: STAND_INS[name] for name in free})
    _run(code, namespace)
    if "redis.Redis(" in block.text:
        # The block's own client went to the private server.
        socket_path = request.getfixturevalue("redis_server").socket_path
        assert built
        assert all(c.connection_pool.connection_kwargs["path"] == socket_path for c in built)


def _run(code: Any, namespace: dict[str, Any]) -> None:
    result = eval(code, namespace)  # noqa: S307 - the project's own documentation
    if inspect.iscoroutine(result):
        asyncio.run(result)


def _check_settings(block: Block, namespace: dict[str, Any]) -> None:
    names = {k for k in namespace if k.isupper()}
    assert names, f"{block.where}: a settings block must define settings"
    overrides = {k: namespace[k] for k in names & {"REDISLOCK", "CACHES"}}
    if not overrides:
        return
    with override_settings(**overrides):
        problems = [m for m in check_settings() if m.is_serious() or m.level >= 30]
    assert not problems, f"{block.where}: {problems}"


# -- shell blocks ------------------------------------------------------------------------------


def _tox() -> tuple[set[str], set[str]]:
    """Environments and labels tox.ini defines."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "tox.ini")
    envs = {s.split(":", 1)[1] for s in parser.sections() if s.startswith("testenv:")}
    for pattern in parser["tox"]["env_list"].split():
        parts = re.split(r"\{([^}]*)\}", pattern)
        choices = [p.split(",") if i % 2 else [p] for i, p in enumerate(parts)]
        envs |= {"".join(c) for c in itertools.product(*choices)}
    labels = {
        line.split("=", 1)[0].strip()
        for line in parser["tox"]["labels"].splitlines()
        if "=" in line
    }
    return envs, labels


def _commands(block: Block) -> Iterator[list[str]]:
    lines = [line for line in block.text.splitlines() if line.strip()]
    prompted = [line[2:] for line in lines if line.startswith("$ ")]
    for line in prompted or lines:
        words = shlex.split(line, comments=True)
        command: list[str] = []
        for word in [*words, "&&"]:
            if word in {"&&", "||", ";", "|"}:
                if command:
                    yield command
                command = []
            else:
                command.append(word)


def _check_command(words: list[str], where: str) -> None:
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words = words[1:]  # VAR=value before the command
    program, args = Path(words[0]).name or words[0], words[1:]
    if program in {"pip", "apt-get", ".", "source", "git", "cd"}:
        return
    if program.startswith("python"):
        if args[:1] == ["-m"]:
            module = args[1]
            if module in {"pip", "venv", "build"}:
                return
            assert importlib.util.find_spec(module) is not None, f"{where}: no module {module}"
            return
        script = args[0]
        if Path(script).name == "manage.py":
            _check_manage(args[1:], where)
            return
        assert (ROOT / script).is_file(), f"{where}: no file {script}"
        return
    if program == "tox":
        envs, labels = _tox()
        if args[:1] == ["exec"]:
            args = args[1:]
        rest: list[str] = []
        if "--" in args:
            args, rest = args[: args.index("--")], args[args.index("--") + 1 :]
        for flag, value in zip(args, args[1:], strict=False):
            if flag == "-e":
                assert value in envs, f"{where}: tox.ini has no environment {value}"
            if flag == "-m":
                assert value in labels, f"{where}: tox.ini has no label {value}"
        if rest and not rest[0].startswith("tests/"):
            _check_command(rest, where)
        return
    pytest.fail(f"{where}: no check for the command {words!r}; teach test_docs_blocks.py one")


def _check_manage(args: list[str], where: str) -> None:
    name, options = args[0], args[1:]
    if name != "redislocks":
        assert name in get_commands(), f"{where}: no manage.py command {name!r}"
        return
    parser = RedislocksCommand().create_parser("manage.py", "redislocks")
    try:
        parser.parse_args(options)
    except (CommandError, SystemExit) as exc:
        pytest.fail(f"{where}: manage.py redislocks {shlex.join(options)}: {exc}")


@pytest.mark.parametrize("block", SH, ids=_ids(SH))
def test_shell_block(block: Block) -> None:
    commands = list(_commands(block))
    assert commands, f"{block.where}: a shell block without commands"
    for words in commands:
        _check_command(words, block.where)


def test_the_block_checks_can_fail() -> None:
    settings_block = Block(ROOT / "README.rst", 1, "python", "settings", "")
    with pytest.raises(AssertionError):
        _check_settings(settings_block, {"REDISLOCK": {"TIMEOUT": -1}})
    with pytest.raises(AssertionError):
        _check_settings(settings_block, {"REDISLOCK": {"THROTTLE": [{"name": "no-limit"}]}})
    with pytest.raises(AssertionError):
        _check_settings(settings_block, {"lowercase": 1})
    assert _free_names(ast.parse("import os\nos.getcwd(product)\n")) == {"product"}
    assert _free_names(ast.parse("def f(request):\n    return request\n")) == set()


def test_the_command_checks_can_fail() -> None:
    with pytest.raises(pytest.fail.Exception):
        _check_manage(["redislocks", "list", "--kind", "mutex"], "here")
    with pytest.raises(pytest.fail.Exception):
        _check_manage(["redislocks", "purge"], "here")
    with pytest.raises(AssertionError):
        _check_command(["tox", "-e", "py39-django42-redis8"], "here")
    with pytest.raises(AssertionError):
        _check_command(["python", "-m", "benchmarks.nothing"], "here")


INCLUDES = [item for source in SOURCES for item in includes(source)]


@pytest.mark.parametrize(
    ("path", "options"), [(p, o) for p, o, _ in INCLUDES], ids=[str(p) for p, _, _ in INCLUDES]
)
def test_literalinclude_names_a_file_and_object_that_exist(path: Path, options: list[str]) -> None:
    assert path.is_file(), path
    for option in options:
        if option.startswith(":pyobject:"):
            name = option.split(":", 2)[2].strip()
            tree = ast.parse(path.read_text())
            defined = {
                node.name
                for node in tree.body
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            }
            assert name in defined, f"{path}: no top-level {name}"
