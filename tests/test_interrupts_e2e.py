"""A real gunicorn sync worker told to quit while it uses a lock: it exits, and the name is free.

gunicorn's quick shutdown (SIGQUIT or SIGINT to a worker) raises ``SystemExit``
in the worker's main thread, wherever it is. ``tests/interrupt_app.py`` serves
one ``@redis_locked`` view (``FAIL_OPEN`` on) with one sync worker; each
scenario tells that worker to quit at one point of a locked call, and the
arbiter starts the next worker for the next scenario:

* waiting for the acquire's reply (Redis paused);
* holding the lock, in the view's body;
* waiting for the lock, which the test holds;
* waiting for the release's reply (the body paused Redis).

Each time: the worker exits, no body runs after the interrupt (nor because of
it), the request gets no "done", and the name is free again within its
lease. The test and the worker meet through Redis (the view's notes, the
queue) and the trace file (``reading <pid>`` as the library waits for a
script's reply, ``quit <pid>`` as the worker's signal handler runs): no
sleeps, every wait bounded.
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_redislock.core import Lock
from django_redislock.core.engine.keys import KeySpace
from tests.helpers import end_process
from tests.helpers_oracles import wait_until
from tests.servers import RedisServer, free_port

pytestmark = [pytest.mark.server, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
NAME = "e2e-interrupt"  # interrupt_app.NAME
LEASE = 10  # interrupt_app.LEASE
WAIT = 60  # bound on every wait of the test
KEYS = KeySpace().lock(NAME)


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie not yet reaped counts)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone before, or while, it was read
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


class Site:
    """gunicorn with one sync worker on tests/interrupt_app.py, started and stopped by PID."""

    def __init__(self, server: RedisServer, directory: Path) -> None:
        self.server = server
        self.redis = server.client(socket_timeout=WAIT)
        self.port = free_port()
        self.trace = directory / "trace"
        self.trace.touch()
        self.log = directory / "gunicorn.log"
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "REDISLOCK_E2E_REDIS_URL": server.url,
            "REDISLOCK_E2E_REDIS_PID": str(server.proc.pid if server.proc else 0),
            "REDISLOCK_E2E_TRACE": str(self.trace),
        }
        env.pop("DJANGO_SETTINGS_MODULE", None)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gunicorn",
                    "tests.interrupt_app:application",
                    "--config",
                    "python:tests.interrupt_gunicorn",
                    "--bind",
                    f"127.0.0.1:{self.port}",
                    "--workers",
                    "1",
                    "--worker-class",
                    "sync",
                    "--timeout",
                    "120",
                    "--log-level",
                    "warning",
                ],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def worker(self) -> int:
        """The PID of the next worker, once it has loaded the site."""
        got = self.redis.blpop(["e2e:workers"], timeout=WAIT)
        assert got is not None, self.log.read_text()[-3000:]
        return int(got[1])

    def request(self, phase: str, out: dict[str, Any]) -> threading.Thread:
        def get() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=WAIT + LEASE)
            try:
                conn.request("GET", f"/locked/{phase}/")
                reply = conn.getresponse()
                out[phase] = (reply.status, reply.read())
            except (OSError, http.client.HTTPException) as exc:
                out[phase] = (None, repr(exc))
            finally:
                conn.close()

        thread = threading.Thread(target=get, name=f"client-{phase}")
        thread.start()
        return thread

    def traced(self, line: str, after: int) -> None:
        """Wait for ``line`` in the trace file, past byte ``after``."""
        wait_until(lambda: line in self.trace.read_text()[after:].splitlines(), WAIT)

    def events(self) -> list[str]:
        return [e.decode() for e in self.redis.lrange("e2e:events", 0, -1)]

    def quit(self, pid: int) -> None:
        os.kill(pid, signal.SIGQUIT)

    def exited(self, pid: int) -> None:
        wait_until(lambda: _gone(pid), WAIT)

    def stop(self) -> None:
        self.server.resume()
        end_process(self.proc, grace=30, kill_wait=30)
        self.redis.close()


@pytest.fixture
def site(redis_factory: type[RedisServer], tmp_path: Path) -> Iterator[Site]:
    server = redis_factory(port=free_port(), unix=False).start()
    site = Site(server, tmp_path)
    try:
        yield site
    finally:
        site.stop()


def _warm(site: Site, replies: dict[str, Any]) -> None:
    """One locked call, so the worker's connections are open before Redis pauses."""
    site.request("warm", replies).join(WAIT)
    assert replies.pop("warm") == (200, b"done")
    assert site.redis.lpop("e2e:events") == b"body:warm"


def _free_within_the_lease(site: Site) -> None:
    lock = Lock(site.redis, NAME, ttl=1, wait=LEASE)
    assert lock.acquire(), "the name stayed taken past its lease"
    lock.release()


def test_a_gunicorn_worker_told_to_quit_mid_lock_exits_and_frees_the_name(site: Site) -> None:
    replies: dict[str, Any] = {}

    # 1. Waiting for the acquire's reply: Redis is paused, the worker reads.
    pid = site.worker()
    _warm(site, replies)
    site.server.pause()
    mark = len(site.trace.read_text())
    client = site.request("acquire", replies)
    site.traced(f"reading {pid}", mark)
    site.quit(pid)
    site.traced(f"quit {pid}", mark)  # the signal landed: Redis may answer now
    site.server.resume()
    site.exited(pid)
    client.join(WAIT)
    assert replies["acquire"][1] != b"done"
    assert site.events() == []  # failing open, the body would have run
    _free_within_the_lease(site)

    # 2. Holding the lock, in the body.
    pid = site.worker()
    _warm(site, replies)
    client = site.request("hold", replies)
    assert site.redis.blpop(["e2e:events"], timeout=WAIT) == (b"e2e:events", b"body:hold")
    assert site.redis.exists(KEYS.lease)
    site.quit(pid)
    site.exited(pid)
    client.join(WAIT)
    assert replies["hold"][1] != b"done"
    assert site.events() == []  # nothing after the interrupt
    _free_within_the_lease(site)

    # 3. Waiting for the lock, which the test holds.
    pid = site.worker()
    _warm(site, replies)
    held = Lock(site.redis, NAME, ttl=WAIT, wait=0)
    assert held.acquire()
    client = site.request("wait", replies)
    wait_until(lambda: site.redis.llen(KEYS.queue) == 1, WAIT)  # it queued
    site.quit(pid)
    site.exited(pid)
    client.join(WAIT)
    assert site.redis.llen(KEYS.queue) == 0  # it left the queue on its way out
    held.release()
    assert replies["wait"][1] != b"done"
    assert site.events() == []
    _free_within_the_lease(site)

    # 4. Waiting for the release's reply: the body paused Redis.
    pid = site.worker()
    _warm(site, replies)
    mark = len(site.trace.read_text())
    client = site.request("release", replies)
    site.traced(f"reading {pid}", mark)  # the acquire's reply
    wait_until(lambda: site.trace.read_text()[mark:].count(f"reading {pid}") == 2, WAIT)
    site.quit(pid)
    site.traced(f"quit {pid}", mark)
    site.server.resume()
    site.exited(pid)
    client.join(WAIT)
    assert site.events() == ["body:release"]
    assert replies["release"][1] != b"done"  # the interrupted release did not return
    _free_within_the_lease(site)
