"""Private redis-server processes owned by the test suite.

Each server is started from one server binary, on its own unix socket or free
loopback port, with no persistence unless asked for, and is only ever stopped
by the PID we started. Waiting for readiness is bounded.

Which binary: ``REDISLOCK_SERVER_BIN`` (a path, or a command on PATH), else
``redis-server`` on PATH. Every private server of the suite comes from it:
the session's server, Cluster nodes and Sentinels (the same binary with
``--sentinel``). The matching ``redis-cli`` (which creates a Cluster) is the
binary's sibling, ``valkey-cli`` beside ``valkey-server``; ``REDISLOCK_CLI_BIN``
overrides it. tox.ini runs the suite on Redis 6.2, Redis 7.0 and Valkey 8.1
this way; docs/servers.rst lists what differs between them.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_binary() -> str:
    """The server binary every private server is started from."""
    wanted = os.environ.get("REDISLOCK_SERVER_BIN", "").strip()
    if not wanted:
        path = shutil.which("redis-server")
        if path is None:
            raise RuntimeError(
                "redis-server is not on PATH: install it (Debian: apt-get install "
                "redis-server), or name a server binary in REDISLOCK_SERVER_BIN"
            )
        return path
    path = shutil.which(wanted)
    if path is None:
        raise RuntimeError(
            f"REDISLOCK_SERVER_BIN={wanted!r} is not an executable file nor a command on "
            "PATH: point it at a redis-server or valkey-server binary"
        )
    return path


def cli_binary() -> str:
    """The ``redis-cli`` that matches the server binary (it creates a Cluster)."""
    wanted = os.environ.get("REDISLOCK_CLI_BIN", "").strip()
    if wanted:
        path = shutil.which(wanted)
        if path is None:
            raise RuntimeError(
                f"REDISLOCK_CLI_BIN={wanted!r} is not an executable file nor a command on PATH"
            )
        return path
    server = Path(redis_binary())
    sibling = server.with_name(server.name.replace("server", "cli"))
    if sibling != server and os.access(sibling, os.X_OK):
        return str(sibling)
    path = shutil.which("redis-cli")
    if path is None:
        raise RuntimeError(
            f"no redis-cli beside {server} nor on PATH: it ships with the server; "
            "or name one in REDISLOCK_CLI_BIN"
        )
    return path


@functools.cache
def _version_of(binary: str) -> tuple[str, tuple[int, int, int]]:
    out = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=10, check=True
    ).stdout
    # "Redis server v=7.0.15 sha=..." or "Valkey server v=8.1.8 sha=..."
    match = re.match(r"(\w+) server v=(\d+)\.(\d+)\.(\d+)", out)
    if match is None:
        raise RuntimeError(f"{binary} --version says {out.strip()!r}: not a Redis or Valkey server")
    return match.group(1), (int(match.group(2)), int(match.group(3)), int(match.group(4)))


def server_label() -> str:
    """Names the server in skip reasons and the test header: ``Redis 6.2.14``."""
    product, version = _version_of(redis_binary())
    return f"{product} {'.'.join(map(str, version))}"


def redis_compatible_version() -> tuple[int, int]:
    """The Redis version whose commands the server has.

    Valkey forked from Redis 7.2.4 and reports that as ``redis_version``: every
    Valkey release has at least the commands of Redis 7.2.
    """
    product, version = _version_of(redis_binary())
    if product == "Valkey":
        return (7, 2)
    return version[0], version[1]


def has_sharded_pubsub() -> bool:
    """SSUBSCRIBE and SPUBLISH: new in Redis 7.0."""
    return redis_compatible_version() >= (7, 0)


def requires_redis(major: int, minor: int, feature: str) -> pytest.MarkDecorator:
    """Skip a test on a server without ``feature`` (new in Redis ``major.minor``)."""
    return pytest.mark.skipif(
        redis_compatible_version() < (major, minor),
        reason=f"{feature} needs Redis {major}.{minor} or newer; the suite runs on "
        f"{server_label()}",
    )


class RedisServer:
    """One private redis-server. ``port=None`` listens on a unix socket only."""

    def __init__(
        self,
        *,
        port: int | None = None,
        unix: bool = True,
        persistence: bool = False,
        extra: tuple[str, ...] = (),
        directory: str | None = None,
        password: str | None = None,
    ) -> None:
        self.dir = Path(directory or tempfile.mkdtemp(prefix="redislock-test-"))
        self.port = port
        self.socket_path = str(self.dir / "redis.sock") if unix else None
        self.persistence = persistence
        self.extra = extra
        # requirepass: client() authenticates, ``url`` does not.
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.port is not None:
            return f"redis://127.0.0.1:{self.port}/0"
        return f"unix://{self.socket_path}?db=0"

    def args(self) -> list[str]:
        args = [
            redis_binary(),
            "--port",
            str(self.port or 0),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            "--logfile",
            str(self.dir / "redis.log"),
            "--save",
            "",
            "--appendonly",
            "yes" if self.persistence else "no",
        ]
        if self.persistence:
            args += ["--appendfsync", "always"]
        if self.socket_path:
            args += ["--unixsocket", self.socket_path, "--unixsocketperm", "700"]
        if self.password is not None:
            args += ["--requirepass", self.password]
        return args + list(self.extra)

    def start(self, timeout: float = 10.0) -> RedisServer:
        self.proc = subprocess.Popen(
            self.args(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                with self.client(socket_timeout=0.5) as c:
                    c.ping()
                    if c.info("persistence").get("loading", 0) == 0:
                        return self
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited early: {self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server not ready in {timeout}s: {self.log_tail()}")
            time.sleep(0.02)

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.dir / "redis.log").read_text()[-2000:]
        return ""

    def client(self, **kwargs: object) -> redis.Redis:
        if self.password is not None:
            kwargs.setdefault("password", self.password)
        return redis.Redis.from_url(self.url, **kwargs)  # type: ignore[arg-type]

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: no chance to save anything."""
        if self.proc is not None and self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def restart(self, *, kill: bool = True) -> None:
        self.kill() if kill else self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
