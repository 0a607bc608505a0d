"""An async idempotent view whose client leaves while Redis stalls, under uvicorn and daphne.

Each server runs ``tests/idempotency_asgi_app.py`` against a private Redis.
The first request with a key runs its view, which does its work and makes
Redis stall writes; the response is then being stored when the client gives
up (closes its connection). The server tells Django, and Django cancels the
request. The key must come out of it with its outcome recorded: the client's
retry with the same key gets the first answer, replayed, and the view has run
once.

Every step waits on state the test can see, each wait bounded: the store
blocked in Redis (``CLIENT LIST``); then, once the client has gone, the
server's word that the view goes on to its end, or (as before the fix) the
store's connection closed by the cancellation, which makes Redis drop the
queued write. Only then does the test end the stall (``CLIENT UNPAUSE``).
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from django_redislock.core.engine.keys import KeySpace
from tests.helpers_oracles import wait_until
from tests.servers import RedisServer, free_port

pytestmark = [pytest.mark.server, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.idempotency_asgi_app:application"
WAIT = 30  # bound on every wait


class AsgiServer:
    """One uvicorn or daphne process we start, wait for and stop by its PID."""

    def __init__(self, kind: str, redis_url: str, log: Path) -> None:
        self.kind, self.port, self.log = kind, free_port(), log
        env = {**os.environ, "REDISLOCK_SERVER_REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)}
        env.pop("DJANGO_SETTINGS_MODULE", None)  # the app module configures its own
        if kind == "uvicorn":
            args = ["-m", "uvicorn", APP, "--host", "127.0.0.1", "--port", str(self.port)]
            args += ["--lifespan", "off", "--log-level", "warning"]
        else:
            args = ["-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), APP]
        self.out = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, env=env, stdout=self.out, stderr=self.out
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.kind} exited early:\n{self.text()[-3000:]}")
        try:
            return self.post_or_get("GET", "/ok/", None)[0] == 200
        except OSError:
            return False

    def wait_ready(self) -> None:
        # Bounded, and generous: a loaded host takes seconds to import Django.
        wait_until(self._answers, 120, interval=0.1)

    def post_or_get(self, method: str, path: str, key: str | None) -> tuple[int, dict[str, str]]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=WAIT)
        try:
            headers = {"Content-Type": "application/json"}
            if key is not None:
                headers["Idempotency-Key"] = key
            conn.request(method, path, body=b"{}" if method == "POST" else None, headers=headers)
            reply = conn.getresponse()
            reply.read()
            return reply.status, {k.lower(): v for k, v in reply.getheaders()}
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


@pytest.fixture(scope="module", params=["uvicorn", "daphne"])
def asgi(
    request: pytest.FixtureRequest,
    server_redis: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[AsgiServer]:
    log = tmp_path_factory.mktemp("asgi") / f"{request.param}.log"
    app = AsgiServer(str(request.param), server_redis.url, log)
    try:
        app.wait_ready()
        yield app
    finally:
        app.stop()


@pytest.fixture
def sr(server_redis: RedisServer) -> Iterator[redis.Redis]:
    client = server_redis.client(socket_timeout=WAIT)
    client.flushall()
    yield client
    client.execute_command("CLIENT", "UNPAUSE")  # whatever the test did
    client.close()


def _stalled_store(sr: redis.Redis) -> bool:
    """A script (the store) waits in Redis for the stall to end."""
    return any(c["cmd"] in ("evalsha", "eval") and "b" in c["flags"] for c in sr.client_list())


def _leave_during_the_store(asgi: AsgiServer, sr: redis.Redis, path: str, key: str) -> None:
    """Send the first request, and close its connection while its store stalls."""
    name = KeySpace().idempotency("ip:127.0.0.1", key).name
    held = f"the request holding {name} was cancelled"  # the library's log line
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Idempotency-Key: {key}\r\nContent-Length: 2\r\n\r\n{{}}"
    ).encode()
    with socket.create_connection(("127.0.0.1", asgi.port), timeout=WAIT) as client:
        client.sendall(request)
        wait_until(lambda: _stalled_store(sr), WAIT)
    # Gone. The server tells Django, which cancels the request: now the view
    # is said to go on, or the cancellation has cut the store's connection.
    wait_until(lambda: held in asgi.text() or not _stalled_store(sr), WAIT)


@pytest.mark.parametrize("form", ["dec", "mw"])
def test_a_client_that_leaves_while_the_store_stalls_gets_the_replay_on_retry(
    asgi: AsgiServer, sr: redis.Redis, form: str
) -> None:
    """Fails before this change, under both servers and both forms: the
    cancellation reached the store's read, the record stayed "running", and the
    retry ran the view a second time (2 runs, and a 201 that was no replay)."""
    key = f"leave-{form}"
    keys = KeySpace().idempotency("ip:127.0.0.1", key)
    _leave_during_the_store(asgi, sr, f"/{form}/pay/", key)
    sr.execute_command("CLIENT", "UNPAUSE")
    wait_until(lambda: not sr.exists(keys.lease), WAIT)  # the first has let the key go
    status, headers = asgi.post_or_get("POST", f"/{form}/pay/", key)
    runs = int(sr.get("e2e:runs") or 0)
    replayed = headers.get("idempotent-replayed")
    assert (runs, status, replayed) == (1, 201, "true"), asgi.text()[-3000:]
    assert sr.hget(keys.record, "state") == b"done"
