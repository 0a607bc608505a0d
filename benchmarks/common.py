"""Pieces shared by the benchmarks: a private Redis, statistics, machine facts, output."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.client
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import redis

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """The argument parser of ``python -m benchmarks.<name>``: its module
    docstring as the help text, kept as written."""
    return argparse.ArgumentParser(
        prog=f"python -m benchmarks.{name}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRedis:
    """A redis-server owned by the benchmark: started from PATH, stopped by its PID.

    It listens on a unix socket in a temporary directory (or, with ``tcp=True``,
    on a free loopback port), keeps nothing on disk, and never touches any
    other Redis on the machine.
    """

    def __init__(self, *, tcp: bool = False) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not on PATH; install Redis to run the benchmarks")
        self.binary = binary
        self.dir = Path(tempfile.mkdtemp(prefix="redislock-bench-"))
        self.port = free_port() if tcp else 0
        self.socket_path = None if tcp else str(self.dir / "redis.sock")
        self.proc: subprocess.Popen[bytes] | None = None
        # A command the server runs under (valgrind, say): prepended as is.
        self.wrapper: list[str] = []
        # More command-line options (a Cluster node's, say): appended as is.
        self.extra: list[str] = []

    @property
    def url(self) -> str:
        if self.socket_path:
            return f"unix://{self.socket_path}?db=0"
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs: Any) -> redis.Redis:
        kwargs.setdefault("socket_timeout", 5.0)
        kwargs.setdefault("socket_connect_timeout", 5.0)
        return redis.Redis.from_url(self.url, **kwargs)

    def start(self, timeout: float = 10.0) -> PrivateRedis:
        args = [
            *self.wrapper,
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--daemonize",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
            "--loglevel",
            "warning",
            "--logfile",
            str(self.dir / "redis.log"),
            "--maxclients",
            "2000",
            *self.extra,
        ]
        if self.socket_path:
            args += ["--unixsocket", self.socket_path, "--unixsocketperm", "700"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with self.client(socket_timeout=0.5) as c:
                    c.ping()
                    return self
            except (redis.ConnectionError, redis.TimeoutError, FileNotFoundError):
                pass
            if self.proc.poll() is not None:
                raise SystemExit(f"redis-server exited at start: {self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"redis-server not ready within {timeout}s: {self.log_tail()}")
            time.sleep(0.02)

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.dir / "redis.log").read_text()[-2000:]
        return ""

    def version(self) -> str:
        with self.client() as c:
            return str(c.info("server").get("redis_version", "?"))

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def private_redis(*, tcp: bool = False) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tcp=tcp).start()
    try:
        yield server
    finally:
        server.stop()


def _bus_free_port(taken: set[int]) -> int:
    for _ in range(200):
        port = free_port()
        if port + 10000 > 65535 or {port, port + 10000} & taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise SystemExit("no free port pair for a Cluster node")


def _cluster_ok(node: PrivateRedis) -> bool:
    with node.client() as c:
        info = c.execute_command("CLUSTER INFO")
    # Parsed into a dict by redis-py's callback; raw text without one.
    state = info.get("cluster_state") if isinstance(info, dict) else info
    return state in ("ok", b"ok") or (isinstance(state, bytes) and b"cluster_state:ok" in state)


class PrivateCluster:
    """A Redis Cluster of ``primaries`` private nodes on loopback, no replicas.

    Each node is a ``PrivateRedis`` (stopped by its PID); ``redis-cli --cluster
    create`` spreads the slots evenly.
    """

    def __init__(self, primaries: int) -> None:
        self.nodes = [PrivateRedis(tcp=True) for _ in range(primaries)]
        taken: set[int] = set()
        for node in self.nodes:
            # The bus listens 10000 above: both must be free, and below 65536.
            node.port = _bus_free_port(taken)
            taken |= {node.port, node.port + 10000}
            node.extra = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]

    def start(self, timeout: float = 30.0) -> PrivateCluster:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise SystemExit("redis-cli is not on PATH; it creates the Cluster")
        try:
            for node in self.nodes:
                node.start()
            subprocess.run(
                [cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes)]
                + ["--cluster-replicas", "0", "--cluster-yes"],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=timeout,
            )
            deadline = time.monotonic() + timeout
            while not all(_cluster_ok(n) for n in self.nodes):
                if time.monotonic() > deadline:
                    raise SystemExit(f"the Cluster was not ready within {timeout}s")
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        return self

    def client(self, **kwargs: Any) -> redis.RedisCluster:
        kwargs.setdefault("socket_timeout", 5.0)
        return redis.RedisCluster(host="127.0.0.1", port=self.nodes[0].port, **kwargs)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


# -- CPU ----------------------------------------------------------------------
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_table() -> dict[int, tuple[int, float, float]]:
    """Every process's ``(parent, own CPU s, reaped children's CPU s)`` (Linux)."""
    table: dict[int, tuple[int, float, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue  # gone since the listing
        fields = raw[raw.rindex(b")") + 2 :].split()
        # After the command: state, ppid, ..., utime (14th field), stime,
        # cutime, cstime (fields 14-17 of proc(5), counted from the pid).
        parent = int(fields[1])
        own = (int(fields[11]) + int(fields[12])) / _TICK
        reaped = (int(fields[13]) + int(fields[14])) / _TICK
        table[int(entry)] = (parent, own, reaped)
    return table


def tree_cpu(roots: dict[str, int]) -> dict[str, float]:
    """CPU seconds used so far by each named process tree: its live processes'
    own time plus what their exited children left them (a short-lived
    PostgreSQL backend's time lands on the postmaster when it is reaped)."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    out: dict[str, float] = {}
    for name, root in roots.items():
        total, stack = 0.0, [root]
        while stack:
            pid = stack.pop()
            if pid in table:
                total += table[pid][1] + table[pid][2]
                stack.extend(children.get(pid, ()))
        out[name] = total
    return out


# -- statistics ---------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of unsorted values; nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def ratio(a: float, b: float) -> float:
    if not b or math.isnan(a) or math.isnan(b):
        return math.nan
    return a / b


# -- machine ------------------------------------------------------------------
def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def uptime_line() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout
        return out.strip()
    return ""


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def machine_facts(redis_version: str) -> dict[str, Any]:
    try:
        import hiredis  # noqa: F401

        hiredis_version = getattr(sys.modules["hiredis"], "__version__", "yes")
    except ImportError:
        hiredis_version = None
    from redis.utils import HIREDIS_AVAILABLE

    return {
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "redis_server": redis_version,
        "redis_py": redis.__version__,
        "hiredis": hiredis_version,
        "hiredis_in_use": bool(HIREDIS_AVAILABLE),
    }


# -- output -------------------------------------------------------------------
def fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.{digits}f}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, text_last: bool = False) -> str:
    """A plain-text table: the first column left-aligned, the others right-aligned
    (numbers), and with ``text_last`` the last column left-aligned too (prose)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    last = len(headers) - 1
    lines = []
    for n, row in enumerate(cells):
        pairs = enumerate(zip(row, widths, strict=True))
        padded = (
            c.ljust(w) if i == 0 or (text_last and i == last) else c.rjust(w) for i, (c, w) in pairs
        )
        lines.append("  ".join(padded).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def show(headers: Sequence[str], rows: Sequence[Sequence[Any]], rst: bool) -> None:
    """Print ``rows`` as a text table, and with ``rst`` as reStructuredText too."""
    print(table(headers, rows))
    if rst:
        print("\n" + rst_table(headers, rows))


def rst_table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], *, text_last: bool = False
) -> str:
    """The same table as an RST simple table, for pasting into the docs."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    rule = "  ".join("=" * w for w in widths)

    def line(row: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()

    out = [rule, line(cells[0]), rule] + [line(row) for row in cells[1:]]
    out.append(rule)
    return "\n".join(out)


def write_results(kind: str, data: dict[str, Any]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS_DIR / f"{kind}-{stamp}.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str))
    return path


REPO = Path(__file__).resolve().parent.parent


def http_request(port: int, method: str, path: str, timeout: float = 10) -> tuple[int, bytes]:
    """One request to a loopback server: (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


class Gunicorn:
    """A gunicorn (gthread workers) serving a benchmark site on a free loopback port."""

    def __init__(
        self, app: str, env: dict[str, str], workers: int, threads: int, *, keep_alive: int
    ) -> None:
        self.port = free_port()
        self.env = env
        self.args = [
            sys.executable,
            "-m",
            "gunicorn",
            app,
            "--bind",
            f"127.0.0.1:{self.port}",
            "--workers",
            str(workers),
            "--threads",
            str(threads),
            "--worker-class",
            "gthread",
            "--keep-alive",
            str(keep_alive),
            "--log-level",
            "warning",
            "--chdir",
            str(REPO),
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready: Callable[[int], bool], timeout: float = 30.0) -> Gunicorn:
        """Start it and wait until ``ready(port)`` says the site answers."""
        self.proc = subprocess.Popen(self.args, env=self.env, cwd=REPO)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"gunicorn exited at start (status {self.proc.returncode})")
            try:
                if ready(self.port):
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise SystemExit(f"gunicorn did not answer within {timeout}s")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the master stops its own workers
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
