"""Servers, clients and timing shared by the fault scenarios and the report."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from tests.servers import RedisServer, free_port

__all__ = [
    "Bound",
    "FaultServer",
    "ServerPool",
    "bounded_client",
    "call_bound",
    "make_rng",
    "wait_until",
]

# The retry policy django_redislock.connection gives its own clients: one quick
# retry, backoff capped at 0.1 s. Core scenarios build clients the same way, so
# the bound they check is the one the library promises.
RETRIES = 1
BACKOFF_CAP = 0.1
# What a redis-py Retry retries by default.
RETRIED_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


def bounded_client(
    url: str, *, timeout: float = 0.5, connect_timeout: float | None = None
) -> redis.Redis:
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=connect_timeout if connect_timeout is not None else timeout,
        retry=Retry(ExponentialBackoff(cap=BACKOFF_CAP, base=0.01), RETRIES),
        # redis-py 5.0 (unlike 8) retries only the errors listed here, whatever the Retry says.
        retry_on_error=list(RETRIED_ERRORS),
    )


def call_bound(timeout: float, connect_timeout: float | None = None) -> float:
    """Longest a single library call may take against a dead or stalled Redis.

    Each attempt may spend the connect timeout and then the socket timeout;
    there are ``1 + RETRIES`` attempts and one backoff between them.
    """
    connect = connect_timeout if connect_timeout is not None else timeout
    return (1 + RETRIES) * (connect + timeout) + BACKOFF_CAP


class FaultServer(RedisServer):
    """A private redis-server on a loopback port, with the faults scenarios need."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("port", free_port())
        kwargs.setdefault("unix", False)
        super().__init__(**kwargs)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def admin(self) -> redis.Redis:
        """A client that bypasses any proxy, for setup and audits."""
        return bounded_client(self.url, timeout=5.0)


class ServerPool:
    """Starts servers and proxies and stops every one of them, by its own PID."""

    def __init__(self) -> None:
        self._servers: list[FaultServer] = []
        self._closers: list[Callable[[], None]] = []

    def server(self, **kwargs: Any) -> FaultServer:
        server = FaultServer(**kwargs)
        self._servers.append(server)
        server.start()
        return server

    def proxy(self, server: FaultServer) -> Any:
        from .proxy import FaultProxy

        proxy = FaultProxy(("127.0.0.1", server.port or 0))
        self._closers.append(proxy.close)
        return proxy

    def on_close(self, fn: Callable[[], None]) -> None:
        self._closers.append(fn)

    def close(self) -> None:
        for fn in reversed(self._closers):
            with contextlib.suppress(Exception):
                fn()
        for server in self._servers:
            server.cleanup()
        self._closers.clear()
        self._servers.clear()

    def __enter__(self) -> ServerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_rng(name: str) -> tuple[random.Random, int]:
    """A seeded RNG for one scenario; the seed is printed so a failure can be replayed.

    ``REDISLOCK_FAULT_SEED`` replays a run.
    """
    env = os.environ.get("REDISLOCK_FAULT_SEED")
    seed = int(env) if env else random.SystemRandom().randrange(2**32)
    print(f"[faults] {name}: seed={seed} (replay with REDISLOCK_FAULT_SEED={seed})")
    return random.Random(seed), seed


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Poll a condition the test cannot be notified of (a key expiring in Redis)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)


@dataclass
class Bound:
    """Longest call seen in a scenario against the bound promised for it."""

    promised: float
    calls: int = 0
    longest: float = 0.0
    hangs: int = 0
    samples: list[float] = field(default_factory=list)

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            took = time.monotonic() - started
            self.calls += 1
            self.samples.append(took)
            self.longest = max(self.longest, took)
            if took > self.promised:
                self.hangs += 1

    def merge(self, other: Bound) -> None:
        self.calls += other.calls
        self.longest = max(self.longest, other.longest)
        self.hangs += other.hangs
        self.samples += other.samples


class Worker:
    """A separate Python process running ``tests.faults.worker``, driven by lines.

    A real process, not a thread: it can be SIGSTOPped and SIGKILLed, and it
    owns its own connections and its own renewal thread.
    """

    def __init__(self, *args: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_root(), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.worker", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=_root(),
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def read(self, timeout: float = 10.0) -> dict[str, Any]:
        import json
        import selectors

        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                raise AssertionError(f"worker {self.pid} said nothing for {timeout}s")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"worker {self.pid} exited with {self.proc.wait(5)}")
        return dict(json.loads(line))

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def cont(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)

    def close(self) -> None:
        self.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
