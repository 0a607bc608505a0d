"""Private redis-server processes owned by the test suite.

Each server is started from the ``redis-server`` binary on PATH, on its own
unix socket or free loopback port, with no persistence unless asked for, and
is only ever stopped by the PID we started. Waiting for readiness is bounded.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_binary() -> str:
    path = shutil.which("redis-server")
    if path is None:
        raise RuntimeError(
            "redis-server is not on PATH: install it (Debian: apt-get install redis-server)"
        )
    return path


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
