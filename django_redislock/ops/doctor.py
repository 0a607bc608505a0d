"""``manage.py redislocks doctor``: what docs/guarantees.rst asks of the Redis the locks use.

Mutual exclusion holds on a Redis that does not lose the keys: no eviction,
a restart that keeps them, replication that does not drop the last grant.
The doctor reads what the server says of itself (``INFO``, ``CONFIG GET``,
``TIME``, a few ``PING``) and says, one line each, what is OK, what to
watch (``warn``) and what breaks a promise (``problem``), with the fix. It
only reads: it never changes a setting.

Reading (``gather``) and judging (``judge``) are apart: the judgement is
plain functions of the numbers, tested with numbers.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from ..conf import conf
from ..core import is_cluster

__all__ = ["OK", "PROBLEM", "WARN", "Finding", "Server", "examine", "gather", "judge"]

OK, WARN, PROBLEM = "OK", "warn", "problem"

# The oldest server the library supports (docs/servers.rst).
MINIMUM_VERSION = (6, 2)
# PINGs timed for the latency line.
PINGS = 20


@dataclass(frozen=True)
class Finding:
    """One line of the report."""

    level: str  # OK, WARN or PROBLEM
    topic: str  # version, eviction, persistence, replicas, latency, clock
    text: str  # what was found, and for warn or problem, the fix


@dataclass
class Server:
    """What one server says of itself: the input of ``judge``."""

    address: str
    info: dict[str, Any] = field(default_factory=dict)
    # CONFIG GET answers, or None when CONFIG is refused (managed Redis).
    config: dict[str, str] | None = None
    # PING round trips, seconds.
    pings: list[float] = field(default_factory=list)
    # The server's clock minus this machine's, seconds (None: not read).
    clock_offset: float | None = None


def _version(info: dict[str, Any]) -> tuple[str, tuple[int, ...]]:
    name = "Valkey" if info.get("valkey_version") else "Redis"
    text = str(info.get("valkey_version") or info.get("redis_version") or "?")
    try:
        numbers = tuple(int(part) for part in text.split(".")[:3])
    except ValueError:
        numbers = ()
    return f"{name} {text}", numbers


def _bytes(value: str) -> str:
    amount = int(value or 0)
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if amount >= size:
            return f"{amount / size:.1f} {unit}"
    return f"{amount} B"


def judge_version(server: Server) -> Finding:
    shown, numbers = _version(server.info)
    if numbers and numbers[:2] >= MINIMUM_VERSION:
        return Finding(OK, "version", f"{shown} (6.2 or newer is needed)")
    return Finding(
        PROBLEM,
        "version",
        f"{shown}: the library needs Redis 6.2 or newer, or Valkey. Fix: upgrade the server.",
    )


def judge_eviction(server: Server) -> Finding:
    if server.config is None:
        return Finding(
            WARN,
            "eviction",
            "CONFIG is refused (a managed Redis?): cannot read maxmemory-policy. Check in "
            "your provider's console that it is noeviction.",
        )
    policy = server.config.get("maxmemory-policy", "?")
    limit = server.config.get("maxmemory", "0")
    if policy == "noeviction":
        return Finding(OK, "eviction", "maxmemory-policy noeviction: no lease is ever evicted")
    if int(limit or 0) == 0:
        return Finding(
            WARN,
            "eviction",
            f"maxmemory-policy {policy}, no maxmemory: nothing is evicted now, but a limit set "
            "later would evict leases. Fix: CONFIG SET maxmemory-policy noeviction (and in "
            "redis.conf).",
        )
    return Finding(
        PROBLEM,
        "eviction",
        f"maxmemory-policy {policy} with maxmemory {_bytes(limit)}: under memory pressure "
        "Redis deletes leases, and a lock is free while its holder works. Fix: CONFIG SET "
        "maxmemory-policy noeviction (and in redis.conf), or a Redis of its own for locks.",
    )


def judge_persistence(server: Server) -> Finding:
    info = server.info
    if int(info.get("aof_enabled", 0) or 0):
        fsync = (server.config or {}).get("appendfsync", "?")
        lost = {
            "always": "nothing",
            "everysec": "up to the last second",
            "no": "what the OS had not written",
        }
        return Finding(
            OK,
            "persistence",
            f"AOF on (appendfsync {fsync}): a restart keeps the leases, losing "
            f"{lost.get(fsync, 'what was not yet written')}",
        )
    save = (server.config or {}).get("save", "")
    if save.strip():
        return Finding(
            WARN,
            "persistence",
            f"RDB snapshots only (save {save}): a restart brings back the last snapshot, "
            "freeing locks taken since. Fix: appendonly yes, if a restart must not free locks.",
        )
    return Finding(
        WARN,
        "persistence",
        "no persistence (no AOF, no RDB): a restart frees every lock while its holders work. "
        "Fix: appendonly yes, if a restart must not free locks.",
    )


def judge_replicas(server: Server, wanted: int) -> Finding:
    info = server.info
    role = str(info.get("role", "?"))
    if role not in ("master", "?"):
        return Finding(
            PROBLEM,
            "replicas",
            f"this server is a {role}: it refuses writes (READONLY). Fix: point the cache at "
            "the primary, or use Sentinel.",
        )
    count = int(info.get("connected_slaves", 0) or 0)
    if wanted > count:
        return Finding(
            PROBLEM,
            "replicas",
            f"REPLICAS = {wanted} but {count} replica(s) connected: every acquire waits "
            "REPLICAS_TIMEOUT and raises ReplicationTimeout. Fix: attach replicas, or lower "
            "REPLICAS.",
        )
    if count == 0:
        return Finding(OK, "replicas", "no replicas: no failover can lose a lease (nor take over)")
    if wanted == 0:
        return Finding(
            WARN,
            "replicas",
            f"{count} replica(s), replication asynchronous: a failover can lose the last "
            "leases granted. Fix: REPLICAS = 1 narrows the window (docs/guarantees.rst); "
            "fencing tokens guard what is written.",
        )
    return Finding(
        OK, "replicas", f"{count} replica(s); each new lease waits for {wanted} (REPLICAS)"
    )


def judge_latency(server: Server, socket_timeout: float) -> Finding:
    if not server.pings:
        return Finding(WARN, "latency", "no PING answered")
    median = statistics.median(server.pings)
    worst = max(server.pings)
    shown = (
        f"PING {median * 1000:.1f} ms median, {worst * 1000:.1f} ms worst of "
        f"{len(server.pings)} (SOCKET_TIMEOUT {socket_timeout:g} s)"
    )
    if median >= socket_timeout / 2:
        return Finding(
            PROBLEM,
            "latency",
            f"{shown}: calls run into their timeout. Fix: a Redis nearer the app, or a "
            "larger SOCKET_TIMEOUT.",
        )
    if worst >= socket_timeout / 4:
        return Finding(
            WARN,
            "latency",
            f"{shown}: a slow answer comes near the timeout. Fix: look for slow commands "
            "(SLOWLOG GET) or a busy host; SOCKET_TIMEOUT bounds every call.",
        )
    return Finding(OK, "latency", shown)


def judge_clock(server: Server) -> Finding:
    if server.clock_offset is None:
        return Finding(WARN, "clock", "TIME not answered")
    offset = server.clock_offset
    shown = f"server clock {offset:+.3f} s from this machine's"
    if abs(offset) >= 1.0:
        return Finding(
            WARN,
            "clock",
            f"{shown}: leases expire and fences count by the server's clock. Fix: NTP on "
            "both, slewing rather than stepping (docs/guarantees.rst).",
        )
    return Finding(OK, "clock", shown)


def judge(server: Server, *, replicas: int, socket_timeout: float) -> list[Finding]:
    """What ``docs/guarantees.rst`` asks of one server, line by line."""
    return [
        judge_version(server),
        judge_eviction(server),
        judge_persistence(server),
        judge_replicas(server, replicas),
        judge_latency(server, socket_timeout),
        judge_clock(server),
    ]


# -- reading ---------------------------------------------------------------------------------
def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _config(client: Any) -> dict[str, str] | None:
    try:
        found: dict[str, str] = {}
        for name in ("maxmemory-policy", "maxmemory", "appendfsync", "save"):
            for key, value in client.config_get(name).items():
                found[_text(key)] = _text(value)
        return found
    except RedisError:  # CONFIG renamed away or refused by an ACL
        return None


def read_server(client: Any, address: str, clock: Callable[[], float] = time.time) -> Server:
    """What one server says of itself; raises ``RedisError`` if it cannot be read."""
    server = Server(address=address, info=dict(client.info()))
    server.config = _config(client)
    for _ in range(PINGS):
        sent = time.perf_counter()
        client.ping()
        server.pings.append(time.perf_counter() - sent)
    before = clock()
    seconds, micros = client.time()
    after = clock()
    server.clock_offset = int(seconds) + int(micros) / 1e6 - (before + after) / 2
    return server


def gather(client: Any) -> list[Server]:
    """Every server the locks are written to: the one primary, or each of a Cluster's."""
    if is_cluster(client):
        return [
            read_server(node.redis_connection, f"{node.host}:{node.port}")
            for node in client.get_primaries()
        ]
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", {}) or {}
    address = kwargs.get("path") or f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"
    return [read_server(client, str(address))]


def examine(client: Any) -> list[tuple[Server, list[Finding]]]:
    """``gather`` and ``judge`` with the settings in force."""
    return [
        (server, judge(server, replicas=conf.REPLICAS, socket_timeout=conf.SOCKET_TIMEOUT))
        for server in gather(client)
    ]


def render(examined: list[tuple[Server, list[Finding]]]) -> list[str]:
    """One screen: a heading per server, a line per finding."""
    lines: list[str] = []
    for server, findings in examined:
        shown, _ = _version(server.info)
        lines.append(f"{server.address} ({shown}, {server.info.get('role', '?')})")
        for finding in findings:
            lines.append(f"  {finding.level:<8} {finding.topic:<12} {finding.text}")
    return lines
