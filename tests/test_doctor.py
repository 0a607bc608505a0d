"""``manage.py redislocks doctor``: servers configured each way docs/guarantees.rst names.

Each test starts a redis-server with one setting changed (eviction, no
persistence, snapshots only, a replica, CONFIG refused, a replica as the
target) and compares what the command prints, line by line, with the numbers
that vary (addresses, versions, round trips, clock offsets) written as ``#``.
The judgement of latency and clock is tested with numbers.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_redislock import connection
from django_redislock.ops.doctor import (
    OK,
    PROBLEM,
    WARN,
    Server,
    judge_clock,
    judge_latency,
    judge_version,
)
from tests.servers import RedisServer, free_port

VERSION_LINE = "  OK       version      Redis # (6.2 or newer is needed)"
CLOCK_LINE = "  OK       clock        server clock # s from this machine's"
LATENCY_LINE = "  OK       latency      PING # ms median, # ms worst of 20 (SOCKET_TIMEOUT 2 s)"


def shape(line: str) -> str:
    """The line with its varying numbers as ``#``."""
    line = re.sub(r"(Redis|Valkey) [\d.]+", r"\1 #", line)
    line = re.sub(r"[+-]?\d+\.\d+ (ms|s)\b", r"# \1", line)
    return re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:#", line)


@pytest.fixture
def doctor(redis_factory: Any) -> Iterator[Any]:
    """Start a server with ``extra`` arguments; run the doctor on it."""

    def run(*extra: str, persistence: bool = False, settings: dict[str, Any] | None = None) -> Any:
        server: RedisServer = redis_factory(
            port=free_port(), unix=False, persistence=persistence, extra=extra
        ).start()
        return server, lambda: check(server.url, settings or {})

    yield run
    connection.reset()


def check(url: str, settings: dict[str, Any]) -> tuple[list[str], str | None]:
    """(printed lines, with varying numbers as #), and the CommandError, if any."""
    caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url}}
    out = StringIO()
    connection.reset()
    error = None
    with override_settings(CACHES=caches, REDISLOCK=settings):
        try:
            call_command("redislocks", "doctor", stdout=out, stderr=StringIO())
        except CommandError as exc:
            error = str(exc)
    return [shape(line) for line in out.getvalue().splitlines()], error


def test_a_server_as_the_guarantees_ask(doctor: Any) -> None:
    _server, run = doctor("--maxmemory-policy", "noeviction", persistence=True)
    lines, error = run()
    assert error is None
    assert lines == [
        "127.0.0.1:# (Redis #, master)",
        VERSION_LINE,
        "  OK       eviction     maxmemory-policy noeviction: no lease is ever evicted",
        "  OK       persistence  AOF on (appendfsync always): a restart keeps the leases, "
        "losing nothing",
        "  OK       replicas     no replicas: no failover can lose a lease (nor take over)",
        LATENCY_LINE,
        CLOCK_LINE,
        "0 problem(s), 0 warning(s).",
    ]


def test_eviction_under_a_memory_limit_is_a_problem(doctor: Any) -> None:
    _server, run = doctor(
        "--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru", persistence=True
    )
    lines, error = run()
    assert lines[2] == (
        "  problem  eviction     maxmemory-policy allkeys-lru with maxmemory 100.0 MB: under "
        "memory pressure Redis deletes leases, and a lock is free while its holder works. "
        "Fix: CONFIG SET maxmemory-policy noeviction (and in redis.conf), or a Redis of its "
        "own for locks."
    )
    assert lines[-1] == "1 problem(s), 0 warning(s)."
    # A non-zero exit: the command fails.
    assert error == (
        "1 problem(s): Redis does not keep what docs/guarantees.rst asks; each line says the fix."
    )


def test_an_eviction_policy_without_a_limit_is_a_warning(doctor: Any) -> None:
    _server, run = doctor("--maxmemory-policy", "volatile-lru", persistence=True)
    lines, error = run()
    assert error is None
    assert lines[2].startswith(
        "  warn     eviction     maxmemory-policy volatile-lru, no maxmemory: nothing is "
        "evicted now"
    )


def test_no_persistence_and_snapshots_only_are_warnings(doctor: Any) -> None:
    _server, run = doctor("--maxmemory-policy", "noeviction")
    lines, error = run()
    assert error is None
    assert lines[3] == (
        "  warn     persistence  no persistence (no AOF, no RDB): a restart frees every lock "
        "while its holders work. Fix: appendonly yes, if a restart must not free locks."
    )
    _server, run = doctor("--maxmemory-policy", "noeviction", "--save", "3600 1")
    lines, _ = run()
    assert lines[3] == (
        "  warn     persistence  RDB snapshots only (save 3600 1): a restart brings back the "
        "last snapshot, freeing locks taken since. Fix: appendonly yes, if a restart must "
        "not free locks."
    )


def test_replicas_and_the_replicas_setting(doctor: Any) -> None:
    primary, run = doctor("--maxmemory-policy", "noeviction", persistence=True)
    replica, run_replica = doctor(
        "--maxmemory-policy", "noeviction", "--replicaof", "127.0.0.1", str(primary.port)
    )
    with primary.client() as c:
        deadline = time.monotonic() + 30
        while int(c.info("replication")["connected_slaves"]) < 1:
            assert time.monotonic() < deadline, "the replica never connected"
            time.sleep(0.05)
    lines, error = run()
    assert error is None
    assert lines[4] == (
        "  warn     replicas     1 replica(s), replication asynchronous: a failover can lose "
        "the last leases granted. Fix: REPLICAS = 1 narrows the window "
        "(docs/guarantees.rst); fencing tokens guard what is written."
    )
    lines, error = check(primary.url, {"REPLICAS": 1})
    assert lines[4] == "  OK       replicas     1 replica(s); each new lease waits for 1 (REPLICAS)"
    lines, error = check(primary.url, {"REPLICAS": 2})
    assert lines[4].startswith(
        "  problem  replicas     REPLICAS = 2 but 1 replica(s) connected: every acquire waits"
    )
    assert error is not None
    # Pointed at the replica itself: writes are refused.
    lines, error = run_replica()
    assert lines[0] == "127.0.0.1:# (Redis #, slave)"
    assert lines[4].startswith("  problem  replicas     this server is a slave: it refuses writes")
    assert error is not None


def test_config_refused_is_a_warning_that_says_where_to_look(doctor: Any) -> None:
    _server, run = doctor("--rename-command", "CONFIG", "", persistence=True)
    lines, error = run()
    assert error is None
    assert lines[2] == (
        "  warn     eviction     CONFIG is refused (a managed Redis?): cannot read "
        "maxmemory-policy. Check in your provider's console that it is noeviction."
    )
    # INFO still tells persistence.
    assert lines[3].startswith("  OK       persistence  AOF on (appendfsync ?)")


def test_redis_down_is_a_clear_error(redis_factory: Any) -> None:
    server = redis_factory(port=free_port(), unix=False).start()
    url = server.url
    server.stop()
    lines, error = check(url, {"CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2})
    assert lines == []
    assert error is not None and error.startswith("Redis is unavailable: ")


# -- the judgement, with numbers ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("pings", "level"),
    [([0.0002] * 20, OK), ([0.0002] * 19 + [0.6], WARN), ([1.2] * 20, PROBLEM)],
)
def test_latency_against_the_socket_timeout(pings: list[float], level: str) -> None:
    assert judge_latency(Server("x", pings=pings), 2.0).level == level


@pytest.mark.parametrize(("offset", "level"), [(0.01, OK), (-0.4, OK), (1.5, WARN), (None, WARN)])
def test_clock_offset(offset: float | None, level: str) -> None:
    assert judge_clock(Server("x", clock_offset=offset)).level == level


@pytest.mark.parametrize(
    ("info", "level"),
    [
        ({"redis_version": "7.0.15"}, OK),
        ({"redis_version": "6.2.14"}, OK),
        ({"redis_version": "6.0.20"}, PROBLEM),
        ({"redis_version": "7.2.4", "valkey_version": "8.1.1"}, OK),
    ],
)
def test_version(info: dict[str, str], level: str) -> None:
    assert judge_version(Server("x", info=info)).level == level
