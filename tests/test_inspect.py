"""core/ops/inspection.py: listing and force-release on a real Redis (plain and Cluster)."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from redis.cluster import RedisCluster

from django_redislock.core.drivers.lock import Lock
from django_redislock.core.engine.keys import KeySpace
from django_redislock.core.exceptions import LockLost
from django_redislock.core.ops.force import clear
from django_redislock.core.ops.inspection import HeldLock, list_locks, matches
from django_redislock.ops.display import duration, printable, width
from tests.helpers import start_waiter
from tests.servers import cli_binary, free_port

KS = KeySpace("redislock")
LONG = "long:" + "é" * 80  # 165 bytes: stored under its digest
HOSTILE = [
    "plain",
    "star*[x]?",
    "{braces}:{tag}",
    "new\nline\ttab\x1b[31m",
    LONG,
    "ünïcødé-锁",
]


def hold(client: redis.Redis, name: str, *, label: str = "", ttl: float = 600) -> Lock:
    lock = Lock(client, name, ttl=ttl, wait=0, keyspace=KS, label=label)
    assert lock.acquire()
    return lock


def semaphore(client: redis.Redis, name: str, limit: int) -> object:
    from django_redislock.core.drivers.semaphore import Semaphore

    return Semaphore(client, name, limit, ttl=600, wait=0, keyspace=KS, label="sem")


def test_lists_held_locks_with_owner_and_timing(r: redis.Redis) -> None:
    lock = hold(r, "report:42", label="POST /products/7/buy")
    (row,) = list_locks(r, KS)
    assert isinstance(row, HeldLock)
    assert row.name == "report:42"
    assert row.kind == "lock"
    assert row.label == "POST /products/7/buy"
    assert row.thread == threading.current_thread().name
    assert row.pid is not None and row.host
    assert row.fence == lock.fence
    assert 0 <= row.held_for < 60
    assert row.lease_left is not None and 500 < row.lease_left <= 600
    assert row.waiters == 0
    assert row.limit == 1 and len(row.holders) == 1
    lock.release()
    assert list_locks(r, KS) == []


def test_counts_live_waiters(r: redis.Redis) -> None:
    lock = hold(r, "busy")
    other = Lock(r, "busy", ttl=5, wait=30, keyspace=KS)
    result: list[bool] = []

    def wait() -> None:
        result.append(other.acquire())
        if result[-1]:
            other.release()

    t = threading.Thread(target=wait)
    t.start()
    deadline = time.monotonic() + 10
    while list_locks(r, KS)[0].waiters != 1:
        assert time.monotonic() < deadline, "the waiter never queued"
        time.sleep(0.01)
    lock.release()
    t.join(10)
    assert result == [True]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_listed_and_cleared(r: redis.Redis, name: str) -> None:
    lock = hold(r, name)
    hold(r, "bystander")
    rows = list_locks(r, KS, name, literal=True)
    assert [row.name for row in rows] == [name]
    result = clear(r, KS, names=[name])
    assert [row.name for row in result.released] == [name]
    assert result.not_held == [] and result.changed == []
    assert [row.name for row in list_locks(r, KS)] == ["bystander"]
    with pytest.raises(LockLost):
        lock.release()


def test_pattern_glob_and_literal(r: redis.Redis) -> None:
    for name in ("a*", "ab", "a?", "b"):
        hold(r, name)
    assert [row.name for row in list_locks(r, KS, "a*")] == ["a*", "a?", "ab"]
    assert [row.name for row in list_locks(r, KS, "a*", literal=True)] == ["a*"]
    assert [row.name for row in list_locks(r, KS, "a[*]")] == ["a*"]
    assert [row.name for row in list_locks(r, KS, "a?", literal=True)] == ["a?"]
    assert list_locks(r, KS, "A*") == []  # case matters, as in the names
    assert matches("x\ny", "x*")
    assert not matches("x\ny", "x?", literal=True)


def test_long_names_filtered_on_stored_name(r: redis.Redis) -> None:
    hold(r, LONG)
    assert len(LONG.encode()) > 120
    assert KS.lock(LONG).lease.split(b":")[-1].startswith(b"#")
    assert [row.name for row in list_locks(r, KS, "long:é*")] == [LONG]
    assert list_locks(r, KS, "#*") == []


def test_foreign_keys_never_listed_or_touched(r: redis.Redis) -> None:
    hold(r, "mine")
    real = KS.lock("mine").lease
    foreign = {
        # Another prefix that merely starts like ours.
        b"redislockX:L:" + real.split(b":L:")[1]: "hash",
        b"other:L:{0123456789abcdef}:=mine": "hash",
        # Under our prefix but not a key of this library.
        b"redislock:L:{0123456789abcdef}:=mine": "hash",  # wrong tag for the name
        b"redislock:L:{zz}:=x": "hash",
        b"redislock:L:{0123456789abcdef}:=str": "string",
        b"redislock:S:{0123456789abcdef}:=sem": "zset",
        b"redislock:unrelated": "string",
    }
    for key, kind in foreign.items():
        if kind == "hash":
            r.hset(key, mapping={"t": "tok", "f": "1", "n": "mine", "o": "{}", "a": "0"})
        elif kind == "zset":
            r.zadd(key, {"tok": time.time() * 1000 + 600_000})
        else:
            r.set(key, "x")
    before = {key: r.dump(key) for key in foreign}
    assert [row.name for row in list_locks(r, KS)] == ["mine"]
    result = clear(r, KS, all=True)
    assert [row.name for row in result.released] == ["mine"]
    assert r.exists(real) == 0
    assert {key: r.dump(key) for key in foreign} == before


def test_clear_named_not_held_and_dry_run(r: redis.Redis) -> None:
    hold(r, "held")
    result = clear(r, KS, names=["held", "free"], dry_run=True)
    assert [row.name for row in result.released] == ["held"]
    assert result.not_held == ["free"]
    assert [row.name for row in list_locks(r, KS)] == ["held"]
    with pytest.raises(ValueError, match="exactly one"):
        clear(r, KS, names=["held"], all=True)


def test_clear_leaves_a_new_holder_alone(r: redis.Redis) -> None:
    from django_redislock.core.ops.force import release

    first = hold(r, "x", ttl=600)
    (row,) = list_locks(r, KS)
    first.release()
    second = hold(r, "x")
    result = release(r, KS, [row])
    assert result.released == [] and [c.name for c in result.changed] == ["x"]
    assert second.owned()
    second.release()


def test_clear_wakes_the_waiter_and_the_holder_learns(r: redis.Redis) -> None:
    holder = hold(r, "job", ttl=600)
    waiter = Lock(r, "job", ttl=5, wait=60, keyspace=KS)
    t, got = start_waiter(waiter, lambda: list_locks(r, KS)[0].waiters == 1)
    started = time.monotonic()
    clear(r, KS, names=["job"])
    # The holder's lease had ten minutes left: only the wake-up explains this.
    assert got.wait(30)
    assert time.monotonic() - started < 30
    t.join(10)
    with pytest.raises(LockLost):
        holder.extend()


def test_semaphore_rows_and_clear(r: redis.Redis) -> None:
    sem_a = semaphore(r, "pool", 3)
    sem_b = semaphore(r, "pool", 3)
    assert sem_a.acquire() and sem_b.acquire()  # type: ignore[attr-defined]
    hold(r, "pool")  # a lock of the same name is a different thing
    rows = list_locks(r, KS)
    assert [(row.name, row.kind) for row in rows] == [("pool", "lock"), ("pool", "semaphore")]
    sem = rows[1]
    assert len(sem.holders) == 2 and sem.limit == 3 and sem.fence is None
    assert {h.label for h in sem.holders} == {"sem"}
    assert sem.as_dict()["holders"] == 2
    result = clear(r, KS, names=["pool"], kinds=("semaphore",))
    assert [(row.name, row.kind) for row in result.released] == [("pool", "semaphore")]
    assert [row.kind for row in list_locks(r, KS)] == ["lock"]
    with pytest.raises(LockLost):
        sem_a.release()  # type: ignore[attr-defined]


def test_as_dict_is_json_with_stable_keys(r: redis.Redis) -> None:
    hold(r, "j\n", label="x")
    (row,) = list_locks(r, KS)
    data = json.loads(json.dumps(row.as_dict()))
    assert data["name"] == "j\n"
    assert sorted(data) == sorted(
        [
            "name",
            "kind",
            "host",
            "pid",
            "thread",
            "label",
            "fence",
            "held_for",
            "lease_left",
            "acquired_at",
            "expires_at",
            "waiters",
            "holders",
            "limit",
            "permits",
            "renew",
            "renewed_ago",
            "renewed_at",
            "renewal_late",
            "waiting",
        ]
    )


def test_display_helpers() -> None:
    assert printable("a\nb\t\\\x1b\u202e") == "a\\nb\\t\\\\\\x1b\\u202e"
    assert printable("é锁") == "é锁"
    assert printable("\udcff") == "\\udcff"
    assert width("a锁") == 3
    assert [duration(s) for s in (None, 0, 59.9, 61, 3600 * 2 + 240, 86400 * 3 + 3600)] == [
        "never",
        "0s",
        "59s",
        "1m01s",
        "2h04m",
        "3d01h",
    ]


# -- Redis Cluster ---------------------------------------------------------------
def _cluster_port(taken: set[int]) -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    for _ in range(200):
        port = free_port()
        if port <= 55535 and port not in taken and port + 10000 not in taken:
            try:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
            taken.update((port, port + 10000))
            return port
    raise RuntimeError("no free port pair for a cluster node")


@pytest.fixture
def cluster(redis_factory: type) -> Iterator[RedisCluster]:
    """Three private primaries, slots split between them."""
    cli = cli_binary()
    taken: set[int] = set()
    ports = [_cluster_port(taken) for _ in range(3)]
    servers = [
        redis_factory(
            port=port,
            unix=False,
            extra=("--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"),
        ).start()
        for port in ports
    ]
    assert len(servers) == 3
    subprocess.run(
        [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports), "--cluster-yes"],
        check=True,
        capture_output=True,
        timeout=30,
    )

    def every_node_ok() -> bool:
        # Every node, not one: a node that has not yet heard of the others
        # answers CLUSTERDOWN, and lock scripts are not retried through it.
        for server in servers:
            with server.client(socket_timeout=1) as c:
                if b"cluster_state:ok" not in c.execute_command("CLUSTER", "INFO"):
                    return False
        return True

    deadline = time.monotonic() + 20
    while not every_node_ok():
        assert time.monotonic() < deadline, "cluster never became ok"
        time.sleep(0.05)
    client = RedisCluster(host="127.0.0.1", port=ports[0], socket_timeout=5)
    yield client
    client.close()


@pytest.mark.cluster
def test_cluster_scans_every_primary(cluster: RedisCluster) -> None:
    names = [f"job:{i}" for i in range(30)]
    for name in names:
        hold(cluster, name)  # type: ignore[arg-type]
    nodes = {cluster.get_node_from_key(KS.lock(n).lease).name for n in names}
    assert len(nodes) == 3  # the names really are spread over the primaries
    # In natural order: job:2 before job:10.
    assert [row.name for row in list_locks(cluster, KS)] == names
    result = clear(cluster, KS, pattern="job:1*")
    assert sorted(row.name for row in result.released) == sorted(
        n for n in names if n.startswith("job:1")
    )
    assert len(list_locks(cluster, KS)) == len(names) - len(result.released)
