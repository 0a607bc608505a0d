"""Locks on green threads: gevent and eventlet monkey patching.

Under monkey patching the renewal watchdog is a greenlet: it renews while the
holder yields to the hub, and not while the holder computes. The library says
so once, in the process, at the first renewing lock (a WARNING naming
``django_redislock.W004``), and ``manage.py check`` says so when
``REDISLOCK['RENEW']`` is on. A real gunicorn gevent worker sells exactly the
stock; a holder that computes past its lease loses the lock, and the fenced
write refuses it.

Monkey patching cannot be undone, so each patched scenario runs in a
subprocess of its own.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.test import override_settings

from django_redislock import LockLost, get_async_lock
from django_redislock.checks import check_settings
from django_redislock.core.engine.keys import KeySpace
from django_redislock.core.io.background import green_runtime
from tests.helpers import end_process
from tests.servers import RedisServer, free_port
from tests.test_decorators import close_async_clients

pytest.importorskip("gevent")

ROOT = Path(__file__).resolve().parent.parent
# Bounds on starting an interpreter, Django and gevent, and on a server's
# readiness: a hang fails the test, a host loaded by other suites does not.
START = 180
pytestmark = pytest.mark.timeout(2 * START + 120)


def _start(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Run ``code`` in a new interpreter; it prints one JSON object last."""
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _results(*procs: subprocess.Popen[str]) -> list[dict[str, Any]]:
    """What each of ``procs`` printed; every one of them is reaped, whatever happens."""
    outputs: list[tuple[int, str, str]] = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=START)
            outputs.append((proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)
    for returncode, out, err in outputs:
        assert returncode == 0, out + err
    return [json.loads(out.splitlines()[-1]) for _, out, err in outputs]


# -- detection ---------------------------------------------------------------------------
def _eventlet(patched: set[str]) -> types.ModuleType:
    """What green_runtime reads of eventlet (not a test dependency): its patcher."""
    patcher = types.ModuleType("eventlet.patcher")
    patcher.is_monkey_patched = lambda name: name in patched  # type: ignore[attr-defined]
    return patcher


def test_gevent_imported_is_not_gevent_patched() -> None:
    # This process imported gevent (importorskip above) and patched nothing.
    # The subprocesses below: a patched one says "gevent", an unpatched one
    # never imports gevent to find out.
    import gevent.monkey

    assert not gevent.monkey.is_module_patched("threading")
    assert green_runtime() is None


def test_eventlet_is_detected_by_its_thread_patch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert green_runtime() is None
    monkeypatch.setitem(sys.modules, "eventlet.patcher", _eventlet({"socket"}))
    assert green_runtime() is None
    monkeypatch.setitem(sys.modules, "eventlet.patcher", _eventlet({"socket", "thread"}))
    assert green_runtime() == "eventlet"


# -- the system check --------------------------------------------------------------------
def test_w004_renew_on_under_eventlet(monkeypatch: pytest.MonkeyPatch) -> None:
    with override_settings(REDISLOCK={"RENEW": True}):
        assert check_settings() == []
        monkeypatch.setitem(sys.modules, "eventlet.patcher", _eventlet({"thread"}))
        [message] = check_settings()
    assert message.id == "django_redislock.W004"
    assert message.msg.startswith("REDISLOCK['RENEW'] is True. Lease renewal runs on eventlet")
    assert "fenced_update" in message.hint
    with override_settings(REDISLOCK={"RENEW": False}):
        assert check_settings() == []


CHECK = """
import json, sys
from gevent import monkey
monkey.patch_all()
import django
django.setup()
from django.core.management import call_command
from django.test import override_settings
from django.test.utils import setup_test_environment
import io
setup_test_environment()
found = {}
for renew in (True, False):
    out, err = io.StringIO(), io.StringIO()
    with override_settings(REDISLOCK={"RENEW": renew}):
        call_command("check", stdout=out, stderr=err)
    found[str(renew)] = out.getvalue() + err.getvalue()
print(json.dumps(found))
"""


def test_w004_in_manage_py_check_under_gevent() -> None:
    [found] = _results(_start(CHECK, env={"DJANGO_SETTINGS_MODULE": "tests.settings"}))
    assert "django_redislock.W004" in found["True"]
    assert "Lease renewal runs on gevent green threads" in found["True"]
    assert "W004" not in found["False"]


# -- renewal under gevent, and the one-time log --------------------------------------------
RENEWAL = """
import io, json, logging, sys, time
mode, socket_path = sys.argv[1:3]
if mode == "gevent":
    from gevent import monkey
    monkey.patch_all()
import redis
from django_redislock.core import Lock, LockLost
from django_redislock.core.io.background import green_runtime

log = io.StringIO()
handler = logging.StreamHandler(log)
handler.setLevel(logging.WARNING)
logging.getLogger("django_redislock").addHandler(handler)
r = redis.Redis(unix_socket_path=socket_path, socket_timeout=5)

plain = Lock(r, f"green-{mode}-plain", ttl=5, wait=0)  # no renewal: nothing to warn about
assert plain.acquire()
plain.release()
warned_before_renewal = "W004" in log.getvalue()

def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass

found = {
    "runtime": green_runtime(),
    "gevent_imported": "gevent" in sys.modules,
    "warned_before_renewal": warned_before_renewal,
}
# Renewal runs every third of the lease: a 1.5 s lease leaves a renewal 1 s to
# come in on a loaded host. The hold outlasts the lease by a second, so a
# lease nobody renewed has surely run out.
for work, hold in (("sleep", time.sleep), ("spin", spin)):
    lock = Lock(r, f"green-{mode}-{work}", ttl=1.5, wait=0, renew=True)
    assert lock.acquire()
    hold(2.5)
    other = Lock(r, f"green-{mode}-{work}", ttl=5, wait=0)
    found[work] = {"taken_by_another": other.acquire(), "lost": False}
    if found[work]["taken_by_another"]:
        other.release()
    try:
        lock.release()
    except LockLost:
        found[work]["lost"] = True
found["warnings"] = log.getvalue().count("(django_redislock.W004)")
found["log"] = log.getvalue()
print(json.dumps(found))
"""


def test_renewal_runs_on_os_threads_always_on_green_threads_only_while_yielding(
    redis_server: RedisServer,
) -> None:
    socket_path = str(redis_server.socket_path)
    # Both at once: each holds its locks for 5 s.
    green, threads = _results(
        _start(RENEWAL, "gevent", socket_path), _start(RENEWAL, "threads", socket_path)
    )

    assert (green["runtime"], green["gevent_imported"]) == ("gevent", True)
    # Once per process, at the first renewing lock, not before.
    assert not green["warned_before_renewal"]
    assert green["warnings"] == 1, green["log"]
    assert "Lease renewal runs on gevent green threads" in green["log"]
    # Yielding (a patched sleep, socket I/O): renewed, still held.
    assert green["sleep"] == {"taken_by_another": False, "lost": False}
    # Computing: the renewal greenlet never ran, the lease ran out, another
    # holder took the lock, and the first finds out at its release.
    assert green["spin"] == {"taken_by_another": True, "lost": True}

    # OS threads (gunicorn sync and gthread, runserver, Celery prefork and
    # threads): the watchdog renews while the holder computes. Nothing warned,
    # and gevent was never imported to find that out.
    assert (threads["runtime"], threads["gevent_imported"]) == (None, False)
    assert threads["warnings"] == 0, threads["log"]
    assert threads["sleep"] == {"taken_by_another": False, "lost": False}
    assert threads["spin"] == {"taken_by_another": False, "lost": False}


# -- the event loop: the same shape ---------------------------------------------------------
async def test_async_renewal_runs_only_while_the_holder_awaits(r: redis.Redis) -> None:
    # An AsyncLock renews from a task on its event loop: an async view that
    # blocks the loop blocks its renewal, as a greenlet that never yields does.
    try:
        for work, lost in (("await", False), ("block", True)):
            # As above: a renewal has 1 s to come in; the hold outlasts the lease.
            lock = get_async_lock(f"loop-{work}", timeout=1.5, wait=0, renew=True)
            assert await lock.acquire()
            if work == "await":
                await asyncio.sleep(2.5)
            else:
                time.sleep(2.5)  # blocks the loop: the mistake under test
            other = get_async_lock(f"loop-{work}", timeout=5, wait=0)
            assert await other.acquire() is lost
            if lost:
                await other.release()
                with pytest.raises(LockLost):
                    await lock.release()
            else:
                await lock.release()
    finally:
        await close_async_clients()


# -- real gunicorn gevent workers --------------------------------------------------------------
class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix socket: each server has its own, no port to race for."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = str(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.unix_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class GreenServer:
    """One gunicorn with one gevent worker on tests/green_settings.py, stopped by PID.

    One worker, so a request sent to this server is served by that worker:
    which process computes and which takes over is the test's choice.
    """

    def __init__(self, name: str, directory: Path, env: dict[str, str]) -> None:
        self.name = name
        self.socket = directory / f"{name}.sock"
        self.log = directory / f"{name}.log"
        self.out = self.log.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "django.core.wsgi:get_wsgi_application()",
                "--bind",
                f"unix:{self.socket}",
                "--workers",
                "1",
                "--worker-class",
                "gevent",
                "--graceful-timeout",
                "2",
                "--timeout",
                "120",
            ],
            cwd=ROOT,
            env=env,
            stdout=self.out,
            stderr=self.out,
        )

    def wait_ready(self, timeout: float = START) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if self.post("/ok/")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(
            f"{self.name} not ready in {timeout}s:\n{self.log.read_text()[-3000:]}"
        )

    def post(self, path: str) -> tuple[int, dict[str, Any]]:
        conn = _UnixHTTPConnection(self.socket, timeout=120)
        try:
            conn.request("POST", path)
            response = conn.getresponse()
            body = response.read()
            is_json = response.getheader("Content-Type", "").startswith("application/json")
            return response.status, json.loads(body) if is_json else {}
        finally:
            conn.close()

    def stop(self) -> None:
        end_process(self.proc)
        self.out.close()


class GreenSite:
    """Two such servers sharing one Redis and one SQLite database."""

    def __init__(self, redis_url: str, directory: Path) -> None:
        self.redis_url = redis_url
        self.db = directory / "green.sqlite3"
        self.gates = directory / "gates"
        self.gates.mkdir()
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.green_settings",
            "REDISLOCK_GREEN_DB": str(self.db),
            "REDISLOCK_GREEN_REDIS_URL": redis_url,
            "REDISLOCK_GREEN_GATES": str(self.gates),
            "PYTHONPATH": str(ROOT),
        }
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "--run-syncdb", "-v", "0"],
            cwd=ROOT,
            env=env,
            check=True,
            timeout=START,
        )
        self.servers: list[GreenServer] = []
        for name in ("a", "b"):
            self.servers.append(GreenServer(name, directory, env))

    def wait_ready(self) -> None:
        for server in self.servers:
            server.wait_ready()

    def open_gate(self, product_id: int) -> None:
        (self.gates / f"open-{product_id}").touch()

    def sql(self, query: str, *params: object) -> list[tuple[Any, ...]]:
        with sqlite3.connect(self.db, timeout=20) as db:
            return db.execute(query, params).fetchall()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture
def green_site(redis_factory: Any) -> Iterator[GreenSite]:
    server: RedisServer = redis_factory(port=free_port(), unix=False).start()
    with tempfile.TemporaryDirectory(prefix="redislock-green-") as directory:
        site = GreenSite(server.url, Path(directory))
        try:
            site.wait_ready()
            yield site
        finally:
            site.stop()


def _post_all(requests: list[tuple[GreenServer, str]]) -> list[int]:
    """POST every (server, path) at once, one thread each; the statuses, in order."""
    statuses: list[int] = [0] * len(requests)

    def one(index: int) -> None:
        server, path = requests[index]
        statuses[index] = server.post(path)[0]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
        assert not thread.is_alive()
    return statuses


def _wait_for(done: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll until ``done()``; ``timeout`` only bounds a failing test."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.01)


@pytest.mark.server
@pytest.mark.slow
def test_gunicorn_gevent_sells_exactly_the_stock(green_site: GreenSite) -> None:
    site = green_site
    a, b = site.servers
    site.sql("INSERT INTO testapp_product (name, stock, fence) VALUES ('a', 2, 0), ('b', 2, 0)")
    ids = [row[0] for row in site.sql("SELECT id FROM testapp_product ORDER BY id")]

    # Six purchases of each product, three through each server. Each sale
    # waits until another purchase is queued for its lock and its first
    # lease has run out, yielding meanwhile: renewal keeps every lease, and
    # no purchase is refused.
    statuses = _post_all([(server, f"/buy/{pk}/") for pk in ids for server in (a, b, a, b, a, b)])
    assert sorted(statuses) == [200] * 4 + [410] * 8, statuses
    for pk in ids:
        [(stock,)] = site.sql("SELECT stock FROM testapp_product WHERE id = ?", pk)
        [(orders,)] = site.sql("SELECT COUNT(*) FROM testapp_order WHERE product_id = ?", pk)
        assert (stock, orders) == (0, 2)  # 0 oversold

    # A holder that computes (server a's one worker, never yielding until its
    # gate opens) cannot renew: its lease runs out. A purchase through server
    # b then takes the lock and claims the row, and once a goes on, its
    # write is refused (503).
    site.sql("INSERT INTO testapp_product (name, stock, fence) VALUES ('c', 5, 0)")
    [(pk,)] = site.sql("SELECT id FROM testapp_product WHERE name = 'c'")
    lease = KeySpace().lock(f"green:{pk}").lease
    outcome: dict[str, Any] = {}
    first = threading.Thread(target=lambda: outcome.update(cpu=a.post(f"/buy-cpu/{pk}/")))
    first.start()
    try:
        with redis.Redis.from_url(site.redis_url, socket_timeout=5) as server:
            _wait_for(lambda: server.exists(lease), "the computing purchase took its lock")
            _wait_for(lambda: not server.exists(lease), "its lease ran out")
        outcome["second"] = b.post(f"/buy-now/{pk}/")
    finally:
        site.open_gate(pk)
        first.join(120)
    assert not first.is_alive()
    assert outcome["cpu"][0] == 503, outcome
    assert outcome["second"][0] == 200, outcome
    [(stock, fence)] = site.sql("SELECT stock, fence FROM testapp_product WHERE id = ?", pk)
    [(orders,)] = site.sql("SELECT COUNT(*) FROM testapp_order WHERE product_id = ?", pk)
    assert (stock, orders, fence) == (4, 1, outcome["second"][1]["fence"])

    # Each worker process said once, at its first renewing lock, what holds here.
    site.stop()
    for server in site.servers:
        log = server.log.read_text()
        assert log.count("(django_redislock.W004)") == 1, log[-3000:]
