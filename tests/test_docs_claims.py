"""Claims the README and the documentation (docs/) make that no other test pins down.

Each test names the sentence it backs; when the text changes, change the test
with it (and the other way round).
"""

from __future__ import annotations

import ast
import asyncio
import configparser
import importlib
import inspect
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

from django_redislock import connection
from django_redislock.conf import DEFAULTS
from django_redislock.core.drivers.base import DEFAULT_GRACE, STATE_KEEP_MS
from django_redislock.core.drivers.lock import Lock
from django_redislock.core.drivers.lock_async import AsyncLock
from django_redislock.core.drivers.semaphore import Semaphore
from django_redislock.core.engine.keys import KeySpace
from django_redislock.core.exceptions import LockLost
from tests.faults.harness import Worker, wait_until
from tests.helpers import flowing

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.rst").read_text()
KS = KeySpace()


def page(name: str) -> str:
    """The text of ``docs/<name>.rst``."""
    return (ROOT / "docs" / f"{name}.rst").read_text()


def prose(name: str) -> str:
    """The text of ``docs/<name>.rst``, its white space ``flowing``."""
    return flowing(page(name))


def test_state_hash_expires_ten_seconds_after_the_lease(r: redis.Redis) -> None:
    """docs/internals.rst, Keys: "the state hash the lease plus 10 seconds";
    docs/guarantees.rst: "after the state hash expired (10 seconds after the lease ...)"."""
    assert STATE_KEEP_MS == 10_000
    assert "the state hash the lease plus 10 seconds" in prose("internals")
    assert "expired (10 seconds after the lease" in prose("guarantees")
    lock = Lock(r, "state-keep", ttl=1, wait=0)
    assert lock.acquire()
    lease_ms, state_ms = r.pttl(lock.keys.lease), r.pttl(lock.keys.state)
    assert 0 < lease_ms <= 1000
    assert 10_000 < state_ms <= 11_000
    lock.extend(2)
    assert 11_000 < r.pttl(lock.keys.state) <= 12_000
    lock.release()


def test_the_librarys_clients_retry_a_broken_connection_once_never_a_timeout() -> None:
    """docs/settings.rst: "one quick retry on a broken connection, never on a timeout"."""
    assert "one quick retry on a broken connection, never on a timeout" in prose("settings")
    connection.reset()
    try:
        sync_policy = connection.get_client().connection_pool.connection_kwargs["retry"]

        async def async_policy() -> Any:
            return connection.get_async_client().connection_pool.connection_kwargs["retry"]

        for policy in (sync_policy, asyncio.run(async_policy())):
            assert policy._retries == 1
            assert redis.exceptions.ConnectionError in policy._supported_errors
            assert redis.exceptions.TimeoutError not in policy._supported_errors
    finally:
        connection.reset()


def test_settings_table_matches_the_defaults() -> None:
    """docs/settings.rst: every key, under an anchor of its own (``setting-KEY``,
    which the guides link to), with the default it states."""
    section = page("settings")
    rows = re.findall(
        r"^\.\. _setting-([A-Z_]+):\n\n``([A-Z_]+)``\n    [^;]*;\s+default\s+(\S+?)\.\s",
        section,
        re.MULTILINE,
    )
    assert {anchor for anchor, _, _ in rows} == set(DEFAULTS)
    for anchor, key, shown in rows:
        assert anchor == key
        text = shown.strip("`")
        value = ast.literal_eval(text)
        assert value == DEFAULTS[key], (key, shown, DEFAULTS[key])


def test_semaphore_grace_period_is_two_seconds() -> None:
    """docs/semaphores.rst: "reserved for the oldest live waiter for a short grace
    period (2 s)"."""
    assert DEFAULT_GRACE == 2.0
    assert "grace period (2 s)" in prose("semaphores")


def test_a_woken_semaphore_waiter_that_stops_costs_at_most_the_grace(
    redis_server: Any, r: redis.Redis
) -> None:
    """docs/semaphores.rst: a waiter "that dies or stops after being woken costs
    the next waiter at most the grace period"."""
    name = "grace-claim"
    queue = KS.semaphore(name).queue
    holder = Semaphore(r, name, 1, ttl=30, wait=0)
    assert holder.acquire()
    stopped = Worker(redis_server.url)
    got: dict[str, float] = {}
    try:
        stopped.send(json.dumps({"op": "permit", "name": name, "limit": 1, "ttl": 30, "wait": 30}))
        # A bound on a worker process starting up on a loaded host, not a measure.
        wait_until(lambda: r.llen(queue) == 1, 60, "the first waiter to queue")
        stopped.stop()  # woken later, it cannot claim: as if it died after the wake-up
        other = redis_server.client(socket_timeout=5)
        # Its wait ends well before the test does, whatever happens.
        nxt = Semaphore(other, name, 1, ttl=30, wait=DEFAULT_GRACE + 8)

        def second() -> None:
            try:
                if nxt.acquire():
                    got["at"] = time.monotonic()
                    nxt.release()
            finally:
                other.close()

        thread = threading.Thread(target=second, daemon=True)
        thread.start()
        wait_until(lambda: r.llen(queue) == 2, 60, "the second waiter to queue")
        released = time.monotonic()
        holder.release()
        thread.join(DEFAULT_GRACE + 20)
        assert not thread.is_alive()
        assert "at" in got, "the next waiter never got the permit"
        # The grace, plus a generous allowance for a loaded host.
        assert got["at"] - released <= DEFAULT_GRACE + 1.0, got["at"] - released
    finally:
        stopped.close()


def test_held_turns_false_at_once_when_a_loss_is_known(r: redis.Redis) -> None:
    """docs/internals.rst, Renewal: a loss "marks the lock lost: ``held`` turns
    False and ``remaining`` 0 at once"; docs/reliability.rst: "``held`` turning False"."""
    assert "``held`` turns False and ``remaining`` 0 at once" in prose("internals")
    lock = Lock(r, "held-claim", ttl=30, wait=0)
    assert lock.acquire()
    r.delete(lock.keys.lease)
    with pytest.raises(LockLost):
        lock.extend()
    assert lock.lost
    assert lock.held is False
    assert lock.remaining == 0


def test_held_turns_false_when_renewal_finds_the_lease_gone(r: redis.Redis) -> None:
    lost = threading.Event()
    lock = Lock(r, "held-renew-claim", ttl=0.6, wait=0, renew=True, on_lost=lambda _: lost.set())
    assert lock.acquire()
    r.delete(lock.keys.lease)
    assert lost.wait(5), "the renewal never reported the loss"
    assert lock.held is False and lock.remaining == 0
    with pytest.raises(LockLost):
        lock.release()


async def test_async_held_turns_false_at_once_when_a_loss_is_known(
    redis_server: Any, r: redis.Redis
) -> None:
    client = redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=5)
    try:
        lock = AsyncLock(client, "held-async-claim", ttl=30, wait=0)
        assert await lock.acquire()
        r.delete(lock.keys.lease)
        with pytest.raises(LockLost):
            await lock.extend()
        assert lock.held is False and lock.remaining == 0
    finally:
        await client.aclose()


def test_validity_ends_a_hundredth_of_the_ttl_and_2_ms_early(r: redis.Redis) -> None:
    """docs/internals.rst: "``held`` turns false at ``sent + ttl - ttl/100 - 2 ms``"."""
    lock = Lock(r, "validity-claim", ttl=2, wait=0)
    before = time.monotonic()
    assert lock.acquire()
    after = time.monotonic()
    # The end of validity, seen from now, lies between the two send-time bounds.
    end = time.monotonic() + lock.remaining
    assert before + 2 - 0.02 - 0.002 - 0.01 <= end <= after + 2 - 0.02 - 0.002 + 0.01
    assert "``sent + ttl - ttl/100 - 2 ms``" in prose("internals")
    lock.release()


def test_a_repeated_semaphore_release_reports_success(r: redis.Redis) -> None:
    """docs/semaphores.rst: "``LockLost`` at release or refresh means the permit
    had expired or was force-released meanwhile": a release sent again after
    its reply was lost (a retrying client) must not report a false loss."""
    sem = Semaphore(r, "repeat-permit", 1, ttl=5, wait=0)
    assert sem.acquire()
    keys, token = sem._key_tuple, sem.token
    assert token is not None
    assert sem._release_call(token) == 1
    assert sem._release_call(token) == 1  # the same release, run again
    other = Semaphore(r, "repeat-permit", 1, ttl=5, wait=0)
    assert other.acquire()
    assert keys == other._key_tuple and other.owned()
    other.release()


def test_the_extras_the_docs_name_exist() -> None:
    """README and docs/installation.rst: the extras ``[hiredis]``, ``[celery]`` and
    ``[drf]``, and what each installs."""
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    extras = {name: value.strip() for name, value in parser["options.extras_require"].items()}
    assert extras == {
        "hiredis": "redis[hiredis]",
        "celery": "celery>=5.3",
        "drf": "djangorestframework>=3.15,<3.19",
        "prometheus": "prometheus_client>=0.20",
        "opentelemetry": "opentelemetry-api>=1.27",
    }
    installation = page("installation")
    for name in extras:
        assert f"``[{name}]``" in installation, name
        assert f"``{name}``" in README, name
    assert "Celery 5.3 or newer" in installation
    assert "Django REST framework 3.15 to 3.18" in installation
    assert "prometheus_client 0.20 or newer" in installation
    assert "OpenTelemetry API 1.27 or newer" in installation


def test_ci_runs_the_oldest_and_the_newest_drf_it_supports() -> None:
    """README Requirements and tox.ini: the ``drf`` extra's range (3.15 to 3.18);
    the ci label runs its oldest (the ``drf315`` factor) in one environment and
    its newest (no pin below the extra's cap) in another, with none of its own."""
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    extra = setup["options.extras_require"]["drf"].strip()
    assert "* Django REST framework 3.15 to 3.18, if you use it" in README
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    deps = tox["testenv"]["deps"]
    assert f"\n{extra}\n" in f"\n{deps}\n".replace("    ", ""), "every env: the extra's range"
    assert "\ndrf315: djangorestframework>=3.15,<3.16\n" in deps.replace("    ", "") + "\n"
    ci = [env.strip() for env in tox["tox"]["labels"].split("=", 1)[1].split(",")]
    runs_tests = [env for env in ci if env.startswith("py")]
    oldest = [env for env in runs_tests if env.endswith("-drf315")]
    assert oldest == ["py310-django52-redis5-drf315"]
    assert "py313-django61-redis8" in runs_tests  # newest Django, newest DRF
    assert len(ci) == 9


def test_ci_runs_every_redis_py_major_it_supports() -> None:
    """README Requirements and tox.ini: setup.cfg's redis-py range (5.0 to
    8.x); the ci label has a cell of each major, its factor's pin in tox.ini's
    deps, and the README says so."""
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    ranged = re.search(r"^redis>=(\d+)\.0,<(\d+)$", setup["options"]["install_requires"], re.M)
    assert ranged is not None
    majors = set(range(int(ranged.group(1)), int(ranged.group(2))))
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    pins = dict(
        re.findall(r"^\s*(redis\d+): redis(?:\[hiredis\])?>=(\d+)\.", tox["testenv"]["deps"], re.M)
    )
    ci = [env.strip() for env in tox["tox"]["labels"].split("=", 1)[1].split(",")]
    covered = {int(pins[f]) for env in ci for f in env.split("-") if f in pins}
    assert covered == majors, (covered, majors)
    assert "* redis-py 5.0 to 8.x, CI runs each major" in README


def test_the_readme_links_to_pages_that_exist() -> None:
    """README, Documentation: every link into the docs names a page of docs/."""
    links = re.findall(
        r"^\.\. _[^:]+: (https://django-redislock\.readthedocs\.io/\S*)$", README, re.M
    )
    assert len(links) >= 5
    for link in links:
        path = link.split("/en/latest/", 1)[1]
        if path:
            assert path.endswith(".html"), link
            assert (ROOT / "docs" / path.replace(".html", ".rst")).is_file(), link


def test_every_check_id_is_listed_and_every_listed_id_exists() -> None:
    """docs/checks.rst lists the system check IDs the code can report, and no other."""
    source = "\n".join(p.read_text() for p in (ROOT / "django_redislock").rglob("*.py"))
    emitted = set(re.findall(r"django_redislock\.[EW]\d{3}", source))
    # throttle.py builds its rule IDs from a number: _ID.format(20), bad(25, ...).
    numbers = re.findall(r"(?:_ID\.format\(|\bbad\(\s*)(\d+)", source)
    emitted |= {f"django_redislock.E0{n}" for n in numbers}
    listed = set(re.findall(r"^``(django_redislock\.[EW]\d{3})``$", page("checks"), re.M))
    assert len(emitted) > 20
    assert listed == emitted


def _documented_loggers() -> set[str]:
    section = page("operating").split("\nLogging\n=======\n", 1)[1].split("\nFor example", 1)[0]
    return set(re.findall(r"``(django_redislock\.[a-z]+)``", section))


def test_every_logger_is_documented_and_every_documented_one_is_used() -> None:
    """docs/operating.rst, Logging: one entry per logger the library logs to."""
    source = "\n".join(p.read_text() for p in (ROOT / "django_redislock").rglob("*.py"))
    used = set(re.findall(r"getLogger\(\"(django_redislock\.[a-z]+)\"\)", source))
    assert used == _documented_loggers()


def _signal_arguments() -> dict[str, set[str]]:
    section = page("operating").split("\nSignals\n=======\n", 1)[1].split("\nLogging\n", 1)[0]
    documented: dict[str, set[str]] = {}
    for name, text in re.findall(r"^``(\w+)``\n((?:    .*\n)+)", section, re.M):
        documented[name] = set(re.findall(r"``(\w+)``", text)) - {"None"}
    return documented


def test_lock_signals_carry_the_documented_arguments(r: redis.Redis) -> None:
    """docs/operating.rst, Signals: the keyword arguments of each lock signal."""
    from django_redislock import signals
    from django_redislock.locking.factories import get_lock

    documented = _signal_arguments()
    assert set(documented) == {
        "lock_acquired",
        "lock_busy",
        "lock_released",
        "lock_lost",
        "redis_unavailable",
        "request_throttled",
        "task_duplicate",
    }
    seen: dict[str, set[str]] = {}

    def receiver_for(name: str) -> Any:
        def receiver(sender: Any, **kwargs: Any) -> None:
            seen[name] = set(kwargs) - {"signal"}

        return receiver

    receivers = {name: receiver_for(name) for name in documented}
    for name, receiver in receivers.items():
        getattr(signals, name).connect(receiver)
    try:
        lock = get_lock("signals-claim", timeout=30, wait=0)
        assert lock.acquire()
        assert not get_lock("signals-claim", timeout=30, wait=0).acquire()
        lock.release()
        lost = get_lock("signals-claim", timeout=30, wait=0)
        assert lost.acquire()
        r.delete(lost.keys.lease)
        with pytest.raises(LockLost):
            lost.release()
    finally:
        for name, receiver in receivers.items():
            getattr(signals, name).disconnect(receiver)
    for name in ("lock_acquired", "lock_busy", "lock_released", "lock_lost"):
        assert seen[name] == documented[name], name


def test_the_readme_is_short_and_keeps_what_ci_and_readers_rely_on() -> None:
    """README: at most 200 lines; the test command CI runs (.ci/run), verbatim;
    Installation before one "Quick start" section; the demo command."""
    lines = README.splitlines()
    assert len(lines) <= 200, len(lines)
    assert "\n    python3 -m pip install tox && tox -m ci\n" in README
    assert "python3 -m pip install -q tox && tox -m ci" in (ROOT / ".ci" / "run").read_text()
    assert "\n    python3 example_project/demo.py\n" in README
    headings = [lines[i - 1] for i, line in enumerate(lines) if i and re.fullmatch(r"=+", line)]
    assert headings.count("Quick start") == 1
    assert headings.index("Installation") < headings.index("Quick start")
    # The README names every Python the label CI runs needs, and the servers.
    label = re.search(r"^\s*ci = (.*)$", (ROOT / "tox.ini").read_text(), re.M)
    assert label is not None
    pythons = sorted({f"3.{m}" for m in re.findall(r"\bpy3(\d+)-", label.group(1))})
    said = re.search(r"they need Python 3\.(\d+) to 3\.(\d+)", README)
    assert said is not None
    first, last = int(said.group(1)), int(said.group(2))
    assert sorted(f"3.{minor}" for minor in range(first, last + 1)) == pythons, pythons
    for service in ("redis-server", "PostgreSQL", "MariaDB"):
        assert service in README


def _subcommand_options(action: str) -> set[str]:
    import argparse

    from django_redislock.management.commands.redislocks import Command

    parser = Command().create_parser("manage.py", "redislocks")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    # Django's common options (--settings, -v, ...) are accepted after the
    # subcommand too; the page documents them once, as Django's.
    common = {option for a in parser._actions for option in a.option_strings}
    return {
        option
        for a in sub.choices[action]._actions
        for option in a.option_strings
        if option not in common
    }


def test_the_documented_redislocks_options_are_the_real_ones() -> None:
    """docs/operating.rst: the options of ``list`` (one entry each), and those of
    ``clear`` ("--noinput (or --no-input)", "--dry-run", "--all", and four of list's)."""
    text = page("operating")
    section = text.split("Options of ``list``:\n", 1)[1].split("\nIn the table", 1)[0]
    documented = set(re.findall(r"^``(--[a-z-]+)", section, re.M))
    assert documented == _subcommand_options("list")
    clear = _subcommand_options("clear")
    # "``--pattern``, ``--literal``, ``--kind`` and ``--cache`` work as for ``list``."
    assert "``--pattern``, ``--literal``, ``--kind`` and ``--cache`` work as for ``list``" in (
        flowing(text)
    )
    shared = {"--pattern", "--literal", "--kind", "--cache"}
    assert clear == shared | {"--all", "--dry-run", "--noinput", "--no-input", "--holder"}
    for option in (
        "``--noinput`` (or\n``--no-input``)",
        "``--dry-run``",
        "``--all``",
        "``--holder ID``",
    ):
        assert option in text, option


def _documented_signature(text: str, call: str) -> inspect.Signature:
    """The signature written as ``call(...)`` in the docs, as a Signature."""
    match = re.search(r"``" + re.escape(call) + r"\(([^`]+)\)``", text)
    assert match, call
    params = " ".join(match.group(1).split())
    tree = ast.parse(f"def f({params}): pass").body[0]
    assert isinstance(tree, ast.FunctionDef)
    args = tree.args
    out: list[inspect.Parameter] = []
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for arg, default in zip(positional, defaults, strict=True):
        value = inspect.Parameter.empty if default is None else ast.literal_eval(default)
        out.append(
            inspect.Parameter(arg.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=value)
        )
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        value = inspect.Parameter.empty if default is None else ast.literal_eval(default)
        out.append(inspect.Parameter(arg.arg, inspect.Parameter.KEYWORD_ONLY, default=value))
    if args.kwarg:
        out.append(inspect.Parameter(args.kwarg.arg, inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(out)


def _bare(func: Any) -> inspect.Signature:
    sig = inspect.signature(func)
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return inspect.Signature(params)


@pytest.mark.parametrize(
    ("page_name", "call", "target"),
    [
        ("locks", "redis_lock", "django_redislock.redis_lock"),
        ("semaphores", "Semaphore", "django_redislock.Semaphore"),
        ("semaphores", "concurrency_limited", "django_redislock.concurrency_limited"),
        (
            "semaphores",
            "django_redislock.core.drivers.semaphore.clear_semaphore",
            "django_redislock.core.drivers.semaphore.clear_semaphore",
        ),
        ("views", "fenced_update", "django_redislock.fencing.fenced_update"),
        ("rwlocks", "ReadWriteLock", "django_redislock.ReadWriteLock"),
    ],
)
def test_the_signatures_written_in_the_docs_are_the_real_ones(
    page_name: str, call: str, target: str
) -> None:
    """Signatures spelled out in the guides, parameter by parameter, with defaults."""
    module, _, name = target.rpartition(".")
    func = getattr(importlib.import_module(module), name)
    assert _documented_signature(page(page_name), call) == _bare(func)


_PATH = re.compile(r"(?<![\w`])[\w./-]*\w\.(?:py|lua|rst|html|ini|toml|cfg)\b")


def _plain_paths(doc: str) -> list[str]:
    """File paths a docstring shows as plain text, outside ````literal```` markup."""
    return _PATH.findall(re.sub(r"``[^`]*``", "", doc))


def test_docstrings_show_file_paths_as_literals() -> None:
    """The API reference (docs/api.rst, from the docstrings) shows a file path as
    ``literal`` text, as the pages do, never as plain words."""
    assert _plain_paths("see docs/locks.rst and ``core/engine/keys.py``") == ["docs/locks.rst"]
    found = []
    for path in sorted((ROOT / "django_redislock").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False) or ""
                found += [f"{path.name}: {node.name}: {p}" for p in _plain_paths(doc)]
    assert not found, found


GUIDES = ["index", "tutorial", "views", "locks", "semaphores", "rwlocks", "testing", "metrics"]


@pytest.mark.parametrize("name", GUIDES)
def test_the_guides_link_to_the_api_reference_and_the_settings(name: str) -> None:
    """The guides name API objects with roles that link to docs/api.rst, and
    settings with links to their entries in docs/settings.rst (sphinx-build -W
    checks that every link has a target)."""
    text = page(name)
    assert re.search(r":(?:func|class|exc):`~?django_redislock\.", text), name
    if name in {"views", "locks", "semaphores", "testing"}:
        assert re.search(r":ref:`[^`]*<setting-[A-Z_]+>`", text), name


def test_the_index_page_shows_the_quick_starts_view() -> None:
    """docs/index.rst: the decorated purchase view of the Quick start (the
    tutorial's ``buy``, which tests/test_tutorial.py holds equal to it)."""
    assert ".. literalinclude:: tutorial/mysite/shop/views.py\n   :pyobject: buy\n" in page("index")


def _readme_sections() -> set[str]:
    lines = README.splitlines()
    return {lines[i - 1] for i, line in enumerate(lines) if i and re.fullmatch(r"[=-]{3,}", line)}


def _pointers_to_missing_readme_sections(text: str, sections: set[str]) -> list[str]:
    """Sentences of ``text`` that send the reader to a README section it does not have."""
    missing = []
    for sentence in re.split(r"(?<=[.;:])\s", " ".join(text.split())):
        if "README" not in sentence:
            continue
        named = re.findall(r"[\"'“]([^\"'”]+)[\"'”]", sentence)
        if "section" in sentence or "covers" in sentence:
            if not named or any(name not in sections for name in named):
                missing.append(sentence)
        elif any(name not in sections for name in named if name[:1].isupper()):
            missing.append(sentence)
    return missing


def test_the_pages_point_only_at_readme_sections_that_exist() -> None:
    """docs/*.rst: a page that sends the reader to a README section names one the
    README has (the README is short: what it once covered moved to the pages)."""
    sections = _readme_sections()
    assert {"Installation", "Quick start"} <= sections
    assert _pointers_to_missing_readme_sections(
        'See the README\'s "Throttling heavy requests" section.', sections
    )
    assert _pointers_to_missing_readme_sections("The README covers every argument.", sections)
    assert not _pointers_to_missing_readme_sections(
        'The README\'s "Quick start" shows it.', sections
    )
    found = {
        path.name: _pointers_to_missing_readme_sections(path.read_text(), sections)
        for path in sorted((ROOT / "docs").glob("*.rst"))
    }
    assert not any(found.values()), {k: v for k, v in found.items() if v}
