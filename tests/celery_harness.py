"""A real Celery worker for the unique-task tests: its broker, its process, and what they report.

A test module defines its Celery ``app`` (and a ``ping`` task), calls
``configure`` when ``BROKER_ENV`` names a broker (that is how the worker,
which imports the module, finds it), and starts one ``Worker`` per module
(``broker`` and ``Worker`` below). The broker and result backend are a
private redis-server of the module; the locks live in the session's private
Redis, as for every test, and tasks report to the test through lists there.

The module must have set Django up before importing this one (a worker
imports the test module before anything else).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu.exceptions import VersionMismatch

from django_redislock import get_lock
from tests.helpers import end_process
from tests.servers import RedisServer, free_port

ROOT = Path(__file__).resolve().parent.parent
BROKER_ENV = "REDISLOCK_TEST_CELERY_BROKER"
# The bound on every wait for a worker's report, and on its start (a loaded
# host, two cores shared by several test runs, takes tens of seconds).
BOUND = 30.0
START = 120.0


def configure(app: Any, broker: str) -> None:
    app.conf.update(
        broker_url=broker,
        result_backend=broker.rsplit("/", 1)[0] + "/1",
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=False,
        worker_hijack_root_logger=False,
        result_expires=300,
        # How long the main process waits for the result of a pool process
        # that died before it reports WorkerLostError (10 s by default): a
        # scenario's short lease must outlast it.
        worker_lost_wait=1.0,
    )
    # The app builds its result backend once, on first use: a test of the
    # module that ran before this (in the same xdist worker) may have built
    # it unconfigured, and results would then say "No result backend".
    app._backend_cache = None
    vars(app._local).pop("backend", None)


def in_worker() -> bool:
    """Whether this process is the worker (it was given the broker's address)."""
    return bool(os.environ.get(BROKER_ENV))


def start_broker(app: Any) -> Iterator[RedisServer]:
    """The body of a module-scoped ``broker`` fixture."""
    server = RedisServer(port=free_port(), unix=False).start()
    configure(app, server.url)
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1)
    except VersionMismatch as exc:
        # kombu 5.6+ wants redis-py 6.1+ for its Redis transport (the redis5 envs).
        server.cleanup()
        pytest.skip(f"Celery's Redis broker cannot run with this redis-py: {exc}")
    yield server
    # Results unsubscribe from the backend when collected: while it still runs.
    gc.collect()
    app.close()
    server.cleanup()


def locks() -> redis.Redis:
    """The session's lock Redis, where tasks report to the test."""
    return redis.Redis(unix_socket_path=os.environ["REDISLOCK_TEST_SOCKET"], socket_timeout=40)


def holder(name: str) -> str | None:
    """The token that holds the lock ``name``, if any."""
    token = locks().hget(get_lock(name).keys.lease, "t")
    return token.decode() if token else None


class Worker:
    """A ``celery worker`` subprocess that this test process starts and stops by its PID."""

    def __init__(
        self,
        app: str,
        broker: RedisServer,
        redis_socket: str,
        *,
        queue: str,
        ping: Any,
        pool: str = "solo",
    ) -> None:
        self.queue = queue
        self.name = f"unique-{os.getpid()}-{time.monotonic_ns()}@localhost"
        self.log = broker.dir / f"worker-{time.monotonic_ns()}.log"
        env = {
            **os.environ,
            BROKER_ENV: broker.url,
            "REDISLOCK_TEST_SOCKET": redis_socket,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONPATH": str(ROOT),
        }
        pool_args = ["-P", pool] + (["-c", "1"] if pool == "prefork" else [])
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    app,
                    "worker",
                    *pool_args,
                    "-Q",
                    queue,
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                    "--loglevel",
                    "INFO",
                    "-n",
                    self.name,
                ],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            # Ready when it answers a task (the start is included in the bound).
            assert ping.apply_async(queue=queue).get(timeout=START) == "pong"
        except BaseException:
            self.stop()
            raise

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        end_process(self.proc)


def pop(r: redis.Redis, key: str, worker: Worker) -> bytes:
    """The next report on the list ``key``; fails (with the worker's log) after the bound."""
    found = r.blpop([key], timeout=BOUND)
    assert found is not None, f"nothing on {key!r}; worker log:\n{worker.tail()}"
    return found[1]  # type: ignore[no-any-return]


def pop_json(r: redis.Redis, key: str, worker: Worker) -> Any:
    return json.loads(pop(r, key, worker))


def free_within(r: redis.Redis, name: str, bound: float) -> float:
    """Seconds until ``name``'s lease is gone, at most ``bound`` (then it fails)."""
    key = get_lock(name).keys.lease
    start = time.monotonic()
    while r.exists(key):
        assert time.monotonic() - start < bound, f"{name!r} still held after {bound}s"
        time.sleep(0.02)
    return time.monotonic() - start
