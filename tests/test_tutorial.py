"""The tutorial (docs/tutorial.rst) and the README's Quick start, done as a reader does them.

Each test reads the page, then applies its steps in order in a fresh temporary
directory: every ``literalinclude`` becomes the file it names (copied from
docs/tutorial/, or appended when its caption says "Add to the end of"), and
every ``$ command`` of a ``console`` block runs, its output compared line for
line with the output the page shows under it. A ``text`` block is an example
and is not compared. What the test does differently from a reader, and why:

* ``git clone`` of the project's repository (the ``Source`` URL of setup.cfg)
  links this checkout in its place. ``python3 -m venv .venv`` makes the venv
  without pip, with a ``.pth`` file that puts this checkout's
  ``django_redislock`` and the running environment's packages on its path;
  ``pip install ./django-redislock gunicorn`` then checks that the directory
  is the clone and that both import. No network, and the working tree is what
  is tested.
* ``django-admin`` runs as ``python -m django`` (the same program; the venv has
  no scripts of its own).
* The Redis is a private ``redis-server`` on a free port, passed in
  ``REDIS_URL``, which the tutorial's settings read; port 8000 becomes a free
  port, in commands and in the output compared; ``load.py`` (whose default is
  port 8000) gets ``--server`` with that port.
* ``gunicorn`` and ``runserver`` run in the background (``runserver`` with
  ``--noreload``, so that stopping its PID stops it, and on the free port
  when the page gives no address); starting one stops the one before, as the
  reader does with Ctrl-C. ``createsuperuser`` gets ``--noinput`` and its
  answers from the environment.
* The Quick start's project runs on PostgreSQL when one answers: a
  ``DATABASES`` setting, not on the page, follows the page's settings.
* Between steps, the test checks what the page says happened, in the
  database and over HTTP (see ``Reader.after``).
"""

from __future__ import annotations

import ast
import configparser
import contextlib
import http.cookiejar
import os
import re
import shlex
import site
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from django_redislock.core.engine.keys import KeySpace
from tests.helpers import end_process
from tests.servers import RedisServer, free_port

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
TUTORIAL = DOCS / "tutorial.rst"
TREE = DOCS / "tutorial"
README = ROOT / "README.rst"
APPEND = "Add to the end of "

pytestmark = [pytest.mark.server, pytest.mark.slow]


# -- reading the pages --------------------------------------------------------------------
@dataclass
class Write:
    """A file the page shows: written to ``dest`` (relative to the project), or appended."""

    dest: str
    text: str
    append: bool
    source: str  # where the page takes it from, for messages


@dataclass
class Command:
    line: str
    output: list[str] = field(default_factory=list)  # as shown on the page


Step = Write | Command


@dataclass
class Directive:
    name: str
    argument: str
    options: dict[str, str]
    body: list[str]
    indent: int
    start: int  # line index


def directives(lines: list[str]) -> Iterator[Directive]:
    """Every ``.. name:: argument`` with its options and (dedented) body, in order."""
    pattern = re.compile(r"^(\s*)\.\. ([\w-]+):: ?(.*)$")
    i = 0
    while i < len(lines):
        match = pattern.match(lines[i])
        if not match:
            i += 1
            continue
        indent = len(match.group(1))
        start, i = i, i + 1
        options: dict[str, str] = {}
        while i < len(lines) and (option := re.match(r"^\s+:([\w-]+):\s?(.*)$", lines[i])):
            options[option.group(1)] = option.group(2)
            i += 1
        body: list[str] = []
        while i < len(lines) and (
            not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent
        ):
            body.append(lines[i])
            i += 1
        while body and not body[-1].strip():
            body.pop()
        while body and not body[0].strip():
            body.pop(0)
        margin = min((len(b) - len(b.lstrip()) for b in body if b.strip()), default=0)
        yield Directive(
            match.group(2),
            match.group(3).strip(),
            options,
            [b[margin:] for b in body],
            indent,
            start,
        )


def console_commands(body: list[str]) -> list[Command]:
    commands: list[Command] = []
    for line in body:
        if line.startswith("$ "):
            commands.append(Command(line[2:]))
        elif not commands:
            raise AssertionError(f"console block starts with output, not a command: {line!r}")
        else:
            commands[-1].output.append(line)
    return commands


def include_text(path: Path, options: dict[str, str]) -> str:
    """What ``literalinclude`` shows of ``path``: the options the pages use, no others."""
    unknown = set(options) - {"caption", "start-after", "pyobject"}
    assert not unknown, f"{path}: teach the test the literalinclude options {unknown}"
    text = path.read_text()
    if "start-after" in options:
        marker = options["start-after"]
        assert marker in text, f"{path}: start-after marker {marker!r} not found"
        text = text.split(marker, 1)[1].lstrip("\n")
    return text


def tutorial_steps() -> list[Step]:
    lines = TUTORIAL.read_text().splitlines()
    steps: list[Step] = []
    for d in directives(lines):
        if d.name == "literalinclude":
            path = (DOCS / d.argument).resolve()
            assert path.is_file(), f"tutorial.rst includes {d.argument}, which does not exist"
            caption = d.options.get("caption", "")
            text = include_text(path, d.options)
            if caption.startswith(APPEND):
                steps.append(Write(caption[len(APPEND) :], text, True, d.argument))
                continue
            # A file of the project: shown under its path, kept at that path in the tree.
            relative = path.relative_to(TREE / "mysite").as_posix()
            assert caption == relative, f"{d.argument}: caption {caption!r}, not {relative!r}"
            if "pyobject" in d.options:  # a second look at part of a file already written
                assert any(isinstance(s, Write) and s.dest == relative for s in steps), d.argument
                continue
            steps.append(Write(relative, text, False, d.argument))
        elif d.name == "code-block" and d.argument == "console":
            steps.extend(console_commands(d.body))
    return steps


def source_url() -> str:
    """The repository a reader clones: setup.cfg's ``Source`` project URL."""
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    urls = dict(
        line.split(" = ", 1) for line in parser["metadata"]["project_urls"].strip().splitlines()
    )
    return urls["Source"]


def readme_quick_start() -> str:
    text = README.read_text()
    match = re.search(r"\nQuick start\n=+\n(.*?)\n[^\n]+\n=+\n", text, re.S)
    assert match, "README.rst has no 'Quick start' section"
    return match.group(1)


def quick_start_steps() -> list[Step]:
    """The Quick start's files (named by the paragraph before each) and commands."""
    lines = readme_quick_start().splitlines()
    steps: list[Step] = []
    for d in directives(lines):
        if d.name != "code-block":
            continue
        if d.argument == "console":
            steps.extend(console_commands(d.body))
            continue
        assert d.argument == "python", f"Quick start: a {d.argument} block the test cannot place"
        before = "\n".join(lines[: d.start]).rstrip().rsplit("\n\n", 1)[-1]
        names = re.findall(r"``([\w./]+\.py)``", before)
        assert names, f"Quick start: no file named before the block at line {d.start}"
        text = "\n".join(d.body) + "\n"
        steps.append(Write(names[-1], text, "end of" in before, f"README, {names[-1]}"))
    return steps


# -- doing them -------------------------------------------------------------------------------
def _http(
    method: str,
    url: str,
    opener: urllib.request.OpenerDirector | None = None,
    data: bytes | None = None,
) -> tuple[int, dict[str, str], str]:
    request = urllib.request.Request(url, method=method, data=data)
    try:
        with (opener or urllib.request.build_opener()).open(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


class Reader:
    """Follows a page's steps in a directory of its own."""

    def __init__(
        self,
        workdir: Path,
        redis: RedisServer,
        database: dict[str, str] | None = None,
        *,
        tutorial: bool = True,
    ) -> None:
        self.cwd = workdir
        self.tutorial = tutorial  # check what the tutorial says happened (see after)
        self.redis = redis
        self.database = database  # a PostgreSQL database to use instead of SQLite
        self.port = free_port()
        self.venv: Path | None = None
        self.server: subprocess.Popen[bytes] | None = None
        self.server_log = workdir / "server.log"
        self.env = {
            key: value
            for key, value in os.environ.items()
            if key not in {"DJANGO_SETTINGS_MODULE", "PYTHONPATH", "REDIS_URL", "VIRTUAL_ENV"}
        }
        self.env["REDIS_URL"] = redis.url
        self.done: list[str] = []

    # substitutions the module docstring lists
    def localize(self, text: str) -> str:
        return text.replace("127.0.0.1:8000", f"127.0.0.1:{self.port}")

    def delocalize(self, text: str) -> str:
        return text.replace(f"127.0.0.1:{self.port}", "127.0.0.1:8000")

    @property
    def python(self) -> str:
        assert self.venv is not None, "a python command before the venv was made"
        return str(self.venv / "bin" / "python")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write(self, step: Write) -> None:
        target = self.cwd / step.dest
        assert target.parent.is_dir(), f"{step.source}: {target.parent} does not exist yet"
        if step.append:
            assert target.is_file(), f"{step.source}: nothing to append to at {target}"
            with target.open("a") as out:
                out.write("\n" + step.text)
        else:
            target.write_text(step.text)
        self.after(step)

    def run(self, command: Command) -> None:
        argv = shlex.split(self.localize(command.line))
        output = self.execute(argv, command.line)
        if command.output:
            shown = [self.delocalize(line).rstrip() for line in output.splitlines()]
            assert shown == [line.rstrip() for line in command.output], (
                f"$ {command.line}\nthe page shows:\n"
                + "\n".join(command.output)
                + "\nit printed:\n"
                + "\n".join(shown)
            )
        self.done.append(command.line)
        self.after(command, output)

    def execute(self, argv: list[str], line: str) -> str:
        program, args = argv[0], argv[1:]
        if argv == ["redis-cli", "ping"]:
            with self.redis.client() as client:
                return "PONG\n" if client.ping() else ""
        if argv[:3] == ["python3", "-m", "venv"]:
            self.make_venv(self.cwd / args[-1])
            return ""
        if program in {"source", "."}:
            assert self.venv is not None and Path(args[0]) == Path(".venv/bin/activate"), line
            self.env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{self.env['PATH']}"
            self.env["VIRTUAL_ENV"] = str(self.venv)
            return ""
        if argv[:2] == ["git", "clone"]:
            assert args[1:] == [source_url()], f"{line}: not the project's repository"
            (self.cwd / Path(args[1]).name).symlink_to(ROOT)
            return ""
        if argv[:4] == ["python", "-m", "pip", "install"]:
            names = []
            for name in args[3:]:
                if name.startswith("."):  # a checkout: the clone made above
                    assert (self.cwd / name).resolve() == ROOT, f"{line}: no checkout at {name}"
                    names.append("django_redislock")
                else:
                    names.append({"gunicorn": "gunicorn"}[name])
            self.call([self.python, "-c", f"import {', '.join(names)}"], line)
            return ""
        if program == "cd":
            self.cwd = self.cwd / args[0]
            assert self.cwd.is_dir(), line
            return ""
        if program == "django-admin":
            return self.call([self.python, "-m", "django", *args], line)
        if program == "gunicorn":
            self.serve([self.python, "-m", "gunicorn", *args])
            return ""
        if program == "python" and args[1:2] == ["runserver"]:
            address = [] if args[2:] else [f"127.0.0.1:{self.port}"]
            self.serve([self.python, *args, *address, "--noreload"])
            return ""
        if program == "python" and args[1:2] == ["createsuperuser"]:
            env = {
                "DJANGO_SUPERUSER_USERNAME": "admin",
                "DJANGO_SUPERUSER_EMAIL": "admin@example.com",
                "DJANGO_SUPERUSER_PASSWORD": "tutorial-only",
            }
            self.call([self.python, *args, "--noinput"], line, env)
            return ""
        if program == "python" and args[:1] == ["load.py"]:
            return self.call([self.python, *args, "--server", self.base_url], line)
        if program == "python":
            return self.call([self.python, *args], line)
        if program == "curl":
            assert args[:2] == ["-X", "POST"] and len(args) == 3, f"teach the test: {line}"
            status, _, body = _http("POST", args[2])
            assert status == 200, (line, status, body)
            return body + "\n"
        raise AssertionError(f"the page runs a command this test does not know: {line}")

    def call(self, argv: list[str], line: str, extra_env: dict[str, str] | None = None) -> str:
        done = subprocess.run(
            argv,
            cwd=self.cwd,
            env={**self.env, **(extra_env or {})},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, f"$ {line}\n{done.stdout}{done.stderr}"
        return done.stdout

    def make_venv(self, path: Path) -> None:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
        self.venv = path
        purelib = subprocess.run(
            [
                str(path / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_path('purelib'))",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        # This checkout's package alone (not its tests/ or example_project/), then what
        # the running environment has installed (Django, redis, django-redis, gunicorn).
        package_dir = path.parent / ".checkout"
        package_dir.mkdir()
        (package_dir / "django_redislock").symlink_to(ROOT / "django_redislock")
        paths = [str(package_dir), *site.getsitepackages()]
        (Path(purelib) / "checkout.pth").write_text("\n".join(paths) + "\n")

    # servers
    def serve(self, argv: list[str]) -> None:
        self.stop_server()
        with self.server_log.open("ab") as log:
            self.server = subprocess.Popen(
                argv, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                status, _, _ = _http("GET", self.base_url + "/")
                if status < 500:
                    return
            assert self.server.poll() is None, self.server_log.read_text()[-3000:]
            assert time.monotonic() < deadline, self.server_log.read_text()[-3000:]
            time.sleep(0.1)

    def stop_server(self) -> None:
        if self.server is not None:
            end_process(self.server)
        self.server = None

    # what the pages say happened
    def counts(self, product: int = 1) -> tuple[int, int]:
        """(stock, orders) of a product, read by the test itself."""
        queries = (
            f"SELECT stock FROM shop_product WHERE id = {product}",
            f"SELECT count(*) FROM shop_order WHERE product_id = {product}",
        )
        if self.database is None:
            with contextlib.closing(sqlite3.connect(self.cwd / "db.sqlite3")) as db:
                return tuple(db.execute(q).fetchone()[0] for q in queries)  # type: ignore[return-value]
        import psycopg

        with psycopg.connect(**self.database) as db:
            return tuple(db.execute(q).fetchone()[0] for q in queries)  # type: ignore[index,return-value]

    def after(self, step: Step, output: str = "") -> None:
        if isinstance(step, Write):
            if step.dest == "mysite/settings.py" and self.database and "CACHES" in step.text:
                # Not on the page: the same project on PostgreSQL.
                with (self.cwd / step.dest).open("a") as out:
                    out.write(f"\nDATABASES = {{'default': {self.database_setting()!r}}}\n")
            return
        line = step.line
        if not self.tutorial:
            return
        if line.startswith("python load.py buy"):
            assert self.counts() == (0, 20)
        elif line.startswith("python load.py report"):
            statuses = dict(re.findall(r"^  (\d{3}): (\d+)$", output, re.M))
            assert set(statuses) <= {"200", "503"}, output
            # Ten requests at once, two admitted at a time and each taking half a second:
            # some are turned away, each with Retry-After.
            throttled = int(statuses.get("503", 0))
            assert 1 <= throttled <= 8 and int(statuses["200"]) + throttled == 10, output
            assert f"Throttled (503): {throttled}, {throttled} of them with Retry-After." in output
        elif line.startswith("python manage.py redislocks list"):
            rows = [row.split() for row in output.splitlines()[1:]]
            assert [row[:3] for row in rows] == [["purchase:1", "lock", "-"]], output
        elif line.startswith("python manage.py runserver"):
            page = self.admin_page("/admin/django_redislock/locks/")
            assert "purchase:1" in page, page[-3000:]
        elif line.startswith("python manage.py redislocks clear"):
            assert output.startswith("Released lock 'purchase:1'"), output
            with self.redis.client() as client:
                assert not client.exists(KeySpace().lock("purchase:1").lease)

    def database_setting(self) -> dict[str, str]:
        assert self.database is not None
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": self.database["dbname"],
            "HOST": self.database["host"],
            "PORT": self.database["port"],
            "USER": self.database["user"],
        }

    def admin_page(self, path: str) -> str:
        """``path`` as the superuser sees it, after logging in through the login form."""
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        login = f"{self.base_url}/admin/login/?next={path}"
        status, _, form = _http("GET", login, opener)
        assert status == 200, form
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
        assert token, form
        fields = {
            "csrfmiddlewaretoken": token.group(1),
            "username": "admin",
            "password": "tutorial-only",
            "next": path,
        }
        data = urllib.parse.urlencode(fields).encode()
        status, _, page = _http("POST", login, opener, data=data)
        assert status == 200, page[-3000:]
        return page


@pytest.fixture
def redis(redis_factory: type[RedisServer]) -> RedisServer:
    return redis_factory(port=free_port(), unix=False).start()


@pytest.fixture
def database() -> Iterator[dict[str, str] | None]:
    """A PostgreSQL database of its own on the suite's server, dropped afterwards.

    ``None`` (SQLite) when no PostgreSQL answers, which CI does not allow
    (REDISLOCK_REQUIRE_POSTGRES=1, see conftest.py).
    """
    from django.conf import settings

    if "postgres" not in settings.DATABASES:
        yield None
        return
    import psycopg

    pg = settings.DATABASES["postgres"]
    server = {"host": pg["HOST"], "port": str(pg["PORT"]), "user": pg["USER"]}
    name = f"tutorial_{os.getpid()}_{time.monotonic_ns()}"
    with psycopg.connect(dbname=pg["NAME"], autocommit=True, **server) as admin:  # type: ignore[arg-type]
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield {**server, "dbname": name}
    finally:
        with psycopg.connect(dbname=pg["NAME"], autocommit=True, **server) as admin:  # type: ignore[arg-type]
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def follow(steps: list[Step], reader: Reader, *, stop_server: bool = True) -> None:
    try:
        for step in steps:
            if isinstance(step, Write):
                reader.write(step)
            else:
                reader.run(step)
    finally:
        if stop_server:
            reader.stop_server()


def test_the_tutorial_tree_is_what_the_page_shows() -> None:
    """Every file under docs/tutorial/ is shown on the page, and nothing else is needed."""
    shown = {
        (DOCS / d.argument).resolve()
        for d in directives(TUTORIAL.read_text().splitlines())
        if d.name == "literalinclude"
    }
    tree = {
        path.resolve()
        for path in TREE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert shown == tree


# Every wait inside is bounded (commands 60 s, server start 30 s); a whole run takes
# about a minute of CPU, which a loaded machine can stretch past the suite's 120 s.
@pytest.mark.timeout(300)
def test_the_tutorial_on_sqlite(tmp_path: Path, redis: RedisServer) -> None:
    reader = Reader(tmp_path, redis)
    follow(tutorial_steps(), reader)
    assert reader.done[-1].startswith("python manage.py redislocks clear"), reader.done


def _function(source: str, name: str) -> str:
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    segment = ast.get_source_segment(source, node)
    assert segment is not None
    decorators = [ast.get_source_segment(source, d) for d in node.decorator_list]
    return "\n".join(f"@{d}" for d in decorators) + "\n" + segment


def test_the_quick_start_is_the_tutorials_code() -> None:
    """README, Quick start: the same settings, models and view as the tutorial."""
    written = {s.dest: s.text for s in quick_start_steps() if isinstance(s, Write)}
    assert set(written) == {
        "mysite/settings.py",
        "shop/models.py",
        "shop/views.py",
        "mysite/urls.py",
    }
    settings = include_text(
        TREE / "settings" / "locks.py", {"start-after": f"# {APPEND}mysite/settings.py:"}
    )
    assert written["mysite/settings.py"] == settings
    assert written["shop/models.py"] == (TREE / "mysite" / "shop" / "models.py").read_text()
    tutorial_views = (TREE / "mysite" / "shop" / "views.py").read_text()
    assert _function(written["shop/views.py"], "buy") == _function(tutorial_views, "buy")


@pytest.mark.timeout(300)
def test_the_quick_start_pastes_into_a_new_project(
    tmp_path: Path, redis: RedisServer, database: dict[str, str] | None
) -> None:
    """README, Quick start: it works as shown, then sells out without overselling.

    On PostgreSQL when one answers (the tutorial's test covers SQLite), with
    the database set after the Quick start's settings, as a project would.
    """
    reader = Reader(tmp_path, redis, database, tutorial=False)
    steps: list[Step] = [Command("python3 -m venv .venv"), Command("source .venv/bin/activate")]
    try:
        follow(steps + quick_start_steps(), reader, stop_server=False)
        assert reader.done[-1].startswith("curl "), reader.done
        assert reader.counts() == (19, 1)
        # 40 more buyers at once for the 19 units left: 19 sales, 21 told it is sold out.
        url = f"{reader.base_url}/products/1/buy"
        with ThreadPoolExecutor(20) as pool:
            statuses = sorted(
                status for status, _, _ in pool.map(lambda _: _http("POST", url), range(40))
            )
        assert statuses == [200] * 19 + [410] * 21
        assert reader.counts() == (0, 20)
    finally:
        reader.stop_server()
