"""The throttling middleware behind real servers: gunicorn (WSGI) and uvicorn (ASGI).

Each server runs tests/server_settings.py against a private Redis on a free
loopback port. Concurrent clients are threads using http.client. The number of
requests inside a throttled view is measured by the view itself, with a Redis
counter that has nothing to do with the semaphore.

What must be refused is made so by the test, never left to how requests
happen to overlap: it holds as many requests inside a view as the rule
admits, at a gate in Redis (``?rgate=``, tests/testapp/views_throttle.py),
sees them inside through the view's counter, sends one more, and only then
opens the gate. The storms of concurrent requests check the limit's upper
bound alone, whatever the interleaving.
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from django_redislock.core.engine.keys import KeySpace
from tests.servers import RedisServer, free_port

# Bound on a server's readiness: a hang fails the tests, a host loaded by
# other suites does not (starting Django there took over 30 s).
START = 180
pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.timeout(START + 120)]

ROOT = Path(__file__).resolve().parent.parent
KS = KeySpace()


class AppServer:
    """One gunicorn or uvicorn process we start, wait for and stop by its PID."""

    def __init__(self, kind: str, redis_url: str) -> None:
        self.kind = kind
        self.port = free_port()
        self.log = Path(tempfile.mkdtemp(prefix="redislock-srv-")) / f"{kind}.log"
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.server_settings",
            "REDISLOCK_SERVER_REDIS_URL": redis_url,
            "PYTHONPATH": str(ROOT),
        }
        bind = f"127.0.0.1:{self.port}"
        if kind == "gunicorn":
            args = [
                sys.executable,
                "-m",
                "gunicorn",
                "django.core.wsgi:get_wsgi_application()",
                "--bind",
                bind,
                "--workers",
                "2",
                "--threads",
                "4",
                "--worker-class",
                "gthread",
                "--graceful-timeout",
                "2",
                "--timeout",
                "60",
            ]
        else:
            args = [
                sys.executable,
                "-m",
                "uvicorn",
                "--factory",
                "django.core.asgi:get_asgi_application",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--lifespan",
                "off",
                "--log-level",
                "warning",
            ]
        self.out = self.log.open("wb")
        self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=self.out, stderr=self.out)

    def wait_ready(self, timeout: float = START) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited early:\n{self.log.read_text()[-3000:]}")
            try:
                if self.request("/ok/", timeout=30)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.kind} not ready in {timeout}s:\n{self.log.read_text()[-3000:]}")

    def connect(self, timeout: float = 15.0) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, path: str, timeout: float = 15.0) -> tuple[int, dict[str, str], bytes]:
        conn = self.connect(timeout)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.out.close()


@pytest.fixture(scope="module")
def server_redis() -> Iterator[RedisServer]:
    server = RedisServer(port=free_port(), unix=False).start()
    yield server
    server.cleanup()


@pytest.fixture
def sr(server_redis: RedisServer) -> Iterator[redis.Redis]:
    client = server_redis.client(socket_timeout=5)
    client.flushall()
    yield client
    client.close()


def _start(kind: str, server_redis: RedisServer) -> Iterator[AppServer]:
    app = AppServer(kind, server_redis.url)
    try:
        app.wait_ready()
        yield app
    finally:
        app.stop()


@pytest.fixture(scope="module")
def gunicorn(server_redis: RedisServer) -> Iterator[AppServer]:
    yield from _start("gunicorn", server_redis)


@pytest.fixture(scope="module")
def uvicorn(server_redis: RedisServer) -> Iterator[AppServer]:
    yield from _start("uvicorn", server_redis)


def hammer(app: AppServer, paths: list[str], clients: int, rounds: int) -> list[tuple[Any, ...]]:
    """``clients`` threads start together and each GETs every path ``rounds`` times."""
    start = threading.Barrier(clients, timeout=30)
    results: list[tuple[Any, ...]] = []
    lock = threading.Lock()

    def run() -> None:
        start.wait()
        for _ in range(rounds):
            for path in paths:
                try:
                    status, headers, _ = app.request(path, timeout=30)
                    item: tuple[Any, ...] = (path, status, headers.get("Retry-After"))
                except OSError as exc:
                    item = (path, "error", repr(exc))
                with lock:
                    results.append(item)

    threads = [threading.Thread(target=run) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a client thread hung"
    return results


def _check(results: list[tuple[Any, ...]], path: str, refusal: int) -> tuple[int, int]:
    mine = [r for r in results if r[0] == path]
    ok = sum(1 for r in mine if r[1] == 200)
    refused = [r for r in mine if r[1] == refusal]
    assert ok + len(refused) == len(mine), mine
    assert all(r[2] is not None and int(r[2]) >= 1 for r in refused), refused
    return ok, len(refused)


def _inside(sr: redis.Redis, oracle: str) -> int:
    return int(sr.get(f"oracle:{oracle}:in") or 0)


def _refused_beyond_the_limit(
    app: AppServer, sr: redis.Redis, path: str, oracle: str, limit: int, refusal: int
) -> None:
    """``limit`` requests held inside the view; one more is refused; all let go."""
    key = f"{oracle}-{app.kind}"
    sep = "&" if "?" in path else "?"
    answers: list[int] = []

    def held() -> None:
        answers.append(app.request(f"{path}{sep}rgate={key}", timeout=90)[0])

    threads = [threading.Thread(target=held) for _ in range(limit)]
    for thread in threads:
        thread.start()
    try:
        assert _until(lambda: _inside(sr, oracle) == limit, 60), _inside(sr, oracle)
        status, headers, _ = app.request(path, timeout=60)
    finally:
        sr.rpush(f"gate:{key}", *["go"] * limit)
        for thread in threads:
            thread.join(90)
    assert not any(thread.is_alive() for thread in threads)
    assert (status, int(headers.get("Retry-After", "0")) >= 1) == (refusal, True), headers
    assert answers == [200] * limit
    assert int(sr.get(f"oracle:{oracle}:max") or 0) == limit
    assert _until(lambda: _inside(sr, oracle) == 0)


def test_gunicorn_refuses_beyond_the_limit(gunicorn: AppServer, sr: redis.Redis) -> None:
    _refused_beyond_the_limit(gunicorn, sr, "/reports/slow/", "slow", 3, 503)
    _refused_beyond_the_limit(gunicorn, sr, "/named/1/", "named-view", 2, 429)
    for name in ("throttle:slow", "throttle:named:ip:127.0.0.1"):
        assert _until(lambda name=name: sr.zcard(KS.semaphore(name).lease) == 0)


def test_uvicorn_refuses_beyond_the_limit(uvicorn: AppServer, sr: redis.Redis) -> None:
    _refused_beyond_the_limit(uvicorn, sr, "/reports/aslow/?oracle=1", "aslow", 2, 503)
    assert _until(lambda: sr.zcard(KS.semaphore("throttle:aslow").lease) == 0)


def test_gunicorn_never_exceeds_limit(gunicorn: AppServer, sr: redis.Redis) -> None:
    # However the requests of the storm overlap, never more inside than the limit.
    results = hammer(gunicorn, ["/reports/slow/?sleep=0.2", "/named/1/?sleep=0.2"], 10, 4)
    _check(results, "/reports/slow/?sleep=0.2", 503)
    assert 1 <= int(sr.get("oracle:slow:max")) <= 3
    assert int(sr.get("oracle:slow:in")) == 0
    _check(results, "/named/1/?sleep=0.2", 429)
    assert 1 <= int(sr.get("oracle:named-view:max")) <= 2
    # Everything was given back.
    for name in ("throttle:slow", "throttle:named:ip:127.0.0.1"):
        assert sr.zcard(KS.semaphore(name).lease) == 0


def test_uvicorn_never_exceeds_limit(uvicorn: AppServer, sr: redis.Redis) -> None:
    results = hammer(uvicorn, ["/reports/aslow/?oracle=1&sleep=0.2"], 10, 4)
    _check(results, "/reports/aslow/?oracle=1&sleep=0.2", 503)
    assert 1 <= int(sr.get("oracle:aslow:max")) <= 2
    assert sr.zcard(KS.semaphore("throttle:aslow").lease) == 0


@pytest.mark.parametrize("kind", ["gunicorn", "uvicorn"])
def test_streaming_response_holds_permit_until_closed(
    kind: str, request: pytest.FixtureRequest, sr: redis.Redis
) -> None:
    app: AppServer = request.getfixturevalue(kind)
    path = "/stream/" if kind == "gunicorn" else "/astream/"
    lease = KS.semaphore("throttle:stream").lease
    conn = app.connect()
    key = f"stream-{kind}"
    try:
        # The body stops after its first chunk until the test opens the gate.
        conn.request("GET", f"{path}?chunks=3&rgate={key}")
        response = conn.getresponse()
        assert response.status == 200
        assert response.readline() == b"chunk0\n"
        # Mid-stream: the view has returned, the permit is still held.
        assert sr.zcard(lease) == 1
        status, headers, _ = app.request(path)
        assert status == 503 and "Retry-After" in headers
        sr.rpush(f"gate:{key}", "go")
        assert response.read() == b"chunk1\nchunk2\n"
    finally:
        sr.rpush(f"gate:{key}", "go")  # (a second one, unread, if the first was)
        conn.close()
    assert _until(lambda: sr.zcard(lease) == 0)
    assert app.request(f"{path}?chunks=1")[0] == 200


def _until(predicate: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _parent_pid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise AssertionError(f"no PPid for {pid}")


def test_killed_worker_does_not_leak_its_permit(gunicorn: AppServer, sr: redis.Redis) -> None:
    lease = KS.semaphore("throttle:pid").lease
    conn = gunicorn.connect()
    try:
        conn.request("GET", "/pid/?sleep=30")
        response = conn.getresponse()
        assert response.status == 200
        worker = int(response.readline())
        # Only ever kill a worker of the gunicorn this test started.
        assert worker != gunicorn.proc.pid and _parent_pid(worker) == gunicorn.proc.pid
        [(_, expires_ms)] = sr.zrange(lease, 0, -1, withscores=True)
        seconds, micros = sr.time()
        # The rule's permit TTL is 2 s: the permit ends by then, on Redis's clock.
        assert 0 < expires_ms - (seconds * 1000 + micros // 1000) <= 2000
        assert gunicorn.request("/pid/?sleep=0")[0] == 503
        os.kill(worker, signal.SIGKILL)
    finally:
        conn.close()

    # Nothing gives it back: once Redis's clock has passed its end, the next
    # request gets the permit.
    def ended() -> bool:
        seconds, micros = sr.time()
        return seconds * 1000 + micros // 1000 > expires_ms

    assert _until(ended)
    assert gunicorn.request("/pid/?sleep=0")[0] == 200
    # The last (streaming) response gives its permit back when the server
    # closes it, just after the client has read the body.
    assert _until(lambda: sr.zcard(lease) == 0)
