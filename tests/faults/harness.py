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
import redis.asyncio
import redis.asyncio.retry

from django_redislock import connection as library_connection
from django_redislock import retrying
from tests.drive import Drive
from tests.servers import RedisServer, free_port

__all__ = [
    "Bound",
    "FaultServer",
    "ServerPool",
    "bounded_async_client",
    "bounded_client",
    "call_bound",
    "freeze_bound",
    "make_rng",
    "wait_until",
]

# The scenarios judge what users get, so their clients are the ones
# django_redislock.connection builds from settings: the same retry policy (one
# quick retry on a broken connection, never on a timeout, backoff capped at
# 0.1 s), taken from that module rather than copied, and the same timeouts.
# test_faults.test_harness_clients_are_the_librarys checks they stay equal.
RETRIES = 1
BACKOFF_CAP = 0.1
# Scheduling slack allowed on top of the socket timeout when Redis is frozen:
# enough for a loaded 2-core host, far less than a second socket timeout.
FREEZE_SLACK = 0.25


def bounded_client(
    url: str, *, timeout: float = 0.5, connect_timeout: float | None = None
) -> redis.Redis:
    """A client built as ``django_redislock.connection.get_client`` builds one
    for a cache at ``url`` with ``SOCKET_TIMEOUT=timeout``."""
    pool = redis.ConnectionPool.from_url(url)
    kwargs = dict(pool.connection_kwargs)
    kwargs["socket_timeout"] = timeout
    kwargs["socket_connect_timeout"] = connect_timeout if connect_timeout is not None else timeout
    kwargs["retry"] = retrying.bounded_retry()
    kwargs["retry_on_error"] = list(retrying.RETRIED)
    kwargs["decode_responses"] = False
    client = redis.Redis(
        connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs)
    )
    client.auto_close_connection_pool = True  # close() closes the sockets: the pool is ours
    return client


def bounded_async_client(
    url: str, *, timeout: float = 0.5, connect_timeout: float | None = None
) -> redis.asyncio.Redis:
    """The asyncio twin, as ``django_redislock.connection.get_async_client`` builds it."""
    sync = bounded_client(url, timeout=timeout, connect_timeout=connect_timeout)
    policy = sync.connection_pool.connection_kwargs["retry"]
    kwargs = {
        k: v
        for k, v in sync.connection_pool.connection_kwargs.items()
        if k in library_connection._ASYNC_KEEP
    }
    connection_class = library_connection._SYNC_TO_ASYNC[sync.connection_pool.connection_class]
    sync.close()
    kwargs["retry"] = retrying.BoundedAsyncRetry(
        policy._backoff, policy._retries, supported_errors=retrying.RETRIED
    )
    kwargs["retry_on_error"] = list(retrying.RETRIED)
    pool = redis.asyncio.ConnectionPool(connection_class=connection_class, **kwargs)
    client = redis.asyncio.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True
    return client


def bounded_client_for(drive: Drive, url: str, *, timeout: float = 0.5) -> Any:
    """``bounded_client`` or ``bounded_async_client``, as ``drive``'s driver wants."""
    make = bounded_async_client if drive.is_async else bounded_client
    return make(url, timeout=timeout)


def call_bound(timeout: float, connect_timeout: float | None = None) -> float:
    """Longest a single library call may take against a dead or stalled Redis.

    A broken connection is retried once: each of the ``1 + RETRIES`` attempts
    may spend the connect timeout and then the socket timeout, with one
    backoff between them. (A timeout is not retried; this is the worst case
    over every way a connection can fail.)
    """
    connect = connect_timeout if connect_timeout is not None else timeout
    return (1 + RETRIES) * (connect + timeout) + BACKOFF_CAP


def freeze_bound(timeout: float) -> float:
    """Longest a call that needs no wait may take against a frozen (SIGSTOPped) Redis.

    The kernel still accepts connections to a frozen Redis, so nothing fails
    fast and nothing is retried: one socket timeout, plus scheduling slack.
    """
    return timeout + FREEZE_SLACK


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
