"""``replicas=N``: a new lease counts only once N replicas acknowledged it (WAIT)."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from django.test import override_settings
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from django_redislock import ReplicationTimeout
from django_redislock.core import AsyncLock, Lock, LockError, RedisUnavailable
from django_redislock.locking.factories import get_lock
from tests.servers import RedisServer, free_port
from tests.topologies import ClusterTopology, wait_until


class Pair:
    def __init__(self) -> None:
        port = free_port()
        self.primary = RedisServer(port=port, unix=False, directory=tempfile.mkdtemp())
        self.replica = RedisServer(
            port=free_port(),
            unix=False,
            directory=tempfile.mkdtemp(),
            extra=("--replicaof", "127.0.0.1", str(port)),
        )

    def linked(self) -> bool:
        with self.replica.client(socket_timeout=1) as c:
            return bool(c.info("replication").get("master_link_status") == "up")

    @contextlib.contextmanager
    def replica_cut_off(self) -> Iterator[None]:
        """Stop the replica and drop its link: no write reaches it meanwhile."""
        self.replica.pause()
        try:
            with self.primary.client(socket_timeout=2) as c:
                # Raw: redis-py 5.0's client_kill_filter() refuses the type "replica".
                c.execute_command("CLIENT", "KILL", "TYPE", "replica")
            yield
        finally:
            self.replica.resume()
        wait_until("the replica to reconnect", self.linked, 20)


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    p = Pair()
    try:
        p.primary.start()
        p.replica.start()
        wait_until("the replica to sync", p.linked, 20)
        yield p
    finally:
        p.replica.cleanup()
        p.primary.cleanup()


@pytest.fixture
def primary(pair: Pair) -> Iterator[redis.Redis]:
    client = pair.primary.client(socket_timeout=5)
    client.flushall()
    yield client
    client.close()


def _calls(client: redis.Redis) -> dict[str, int]:
    """Script and WAIT calls so far on the server (the commands scripts run
    inside are counted too, so only these are compared)."""
    stats = client.info("commandstats")
    return {
        name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
        for name in ("eval", "evalsha", "wait")
    }


def _ran_since(client: redis.Redis, before: dict[str, int]) -> dict[str, int]:
    after = _calls(client)
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def test_acknowledged_lease_is_on_the_replica(pair: Pair, primary: redis.Redis) -> None:
    client = redis.Redis(host="127.0.0.1", port=pair.primary.port, socket_timeout=5)
    lock = Lock(client, "acked", ttl=10, wait=0, replicas=1, replicas_timeout=2)
    assert lock.acquire()  # the first may need EVAL after NOSCRIPT: warm up
    lock.release()
    before = _calls(primary)
    assert lock.acquire()
    # EVALSHA and WAIT, nothing sent again.
    assert _ran_since(primary, before) == {"evalsha": 1, "wait": 1}
    with pair.replica.client(socket_timeout=2) as c:
        assert c.hget(lock.keys.lease, "t") == lock.token.encode()  # type: ignore[union-attr]
    lock.release()
    client.close()


def test_script_reloaded_inside_the_pipeline(pair: Pair, primary: redis.Redis) -> None:
    primary.script_flush()
    lock = Lock(primary, "fresh", ttl=10, wait=0, replicas=1, replicas_timeout=2)
    assert lock.acquire()  # NOSCRIPT in the pipeline: EVAL + WAIT again
    lock.release()


def test_no_acknowledgement_gives_the_lease_back(pair: Pair, primary: redis.Redis) -> None:
    with pair.replica_cut_off():
        lock = Lock(primary, "fragile", ttl=10, wait=5, replicas=1, replicas_timeout=0.2)
        with pytest.raises(ReplicationTimeout) as info:
            lock.acquire()
        assert (info.value.acked, info.value.wanted) == (0, 1)
        assert "0 of 1 replica(s)" in str(info.value)
        assert isinstance(info.value, RedisUnavailable)  # the unavailable policy applies
        assert isinstance(info.value, LockError)
        assert not lock.held
        assert primary.exists(lock.keys.lease) == 0
        with pytest.raises(ReplicationTimeout), lock:
            pytest.fail("the body must not run")
        # Without asking for acknowledgement the lock is simply free.
        plain = Lock(primary, "fragile", ttl=10, wait=0)
        assert plain.acquire()
        plain.release()


def test_more_replicas_than_exist(pair: Pair, primary: redis.Redis) -> None:
    lock = Lock(primary, "two", ttl=10, wait=0, replicas=2, replicas_timeout=0.1)
    with pytest.raises(ReplicationTimeout) as info:
        lock.acquire()
    assert info.value.acked == 1
    assert primary.exists(lock.keys.lease) == 0


def test_give_back_hands_the_turn_to_the_next_waiter(pair: Pair, primary: redis.Redis) -> None:
    holder = Lock(primary, "queue", ttl=30, wait=0)
    assert holder.acquire()
    outcome: dict[str, Any] = {}

    def demanding() -> None:
        try:
            Lock(primary, "queue", ttl=30, wait=10, replicas=2, replicas_timeout=0.1).acquire()
        except ReplicationTimeout as exc:
            outcome["demanding"] = exc

    def patient() -> None:
        lock = Lock(primary, "queue", ttl=30, wait=10)
        outcome["patient"] = lock.acquire()
        lock.release()

    first = threading.Thread(target=demanding)
    first.start()
    wait_until("the first waiter to queue", lambda: primary.llen(holder.keys.queue) == 1, 10)
    second = threading.Thread(target=patient)
    second.start()
    wait_until("the second waiter to queue", lambda: primary.llen(holder.keys.queue) == 2, 10)
    holder.release()
    first.join(15)
    second.join(15)
    assert isinstance(outcome["demanding"], ReplicationTimeout)
    assert outcome["patient"] is True


async def test_async_acknowledgement(pair: Pair, primary: redis.Redis) -> None:
    client = redis.asyncio.Redis(host="127.0.0.1", port=pair.primary.port, socket_timeout=5)
    try:
        lock = AsyncLock(client, "async-acked", ttl=10, wait=0, replicas=1, replicas_timeout=2)
        assert await lock.acquire()
        await lock.release()
        with pair.replica_cut_off():
            lock = AsyncLock(
                client, "async-acked", ttl=10, wait=0, replicas=1, replicas_timeout=0.2
            )
            with pytest.raises(ReplicationTimeout):
                await lock.acquire()
            assert await client.exists(lock.keys.lease) == 0
            assert not lock.held
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"replicas": -1}, "replicas must be a whole number"),
        ({"replicas": True}, "replicas must be a whole number"),
        ({"replicas": 1.5}, "replicas must be a whole number"),
        ({"replicas_timeout": 0}, "replicas_timeout must be a finite number"),
    ],
)
def test_bad_arguments(primary: redis.Redis, options: dict[str, Any], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        Lock(primary, "x", **options)


def test_settings_apply_to_get_lock() -> None:
    with override_settings(REDISLOCK={"REPLICAS": 2, "REPLICAS_TIMEOUT": 0.5}):
        lock = get_lock("configured")
        assert (lock.replicas, lock.replicas_timeout) == (2, 0.5)
        assert get_lock("configured", replicas=0).replicas == 0
    assert get_lock("configured").replicas == 0  # the default: off


def test_off_by_default_sends_no_wait(primary: redis.Redis, pair: Pair) -> None:
    client = redis.Redis(host="127.0.0.1", port=pair.primary.port, socket_timeout=5)
    lock = Lock(client, "plain", ttl=10, wait=0)
    assert lock.acquire()
    lock.release()
    before = _calls(primary)
    assert lock.acquire()
    assert _ran_since(primary, before) == {"evalsha": 1}
    lock.release()
    client.close()


# -- WAIT runs on the connection that carried the write ---------------------------
#
# WAIT counts only the writes made on its own connection: sent on another
# pooled connection (one that wrote nothing), it answers at once with every
# replica and confirms an acknowledgement that never happened. With the only
# replica paused, every acquire asking for one must raise ReplicationTimeout,
# however many threads or tasks share the client.

# Many connections in the pool, then fewer callers: a stray WAIT would
# find an idle connection whose last write was acknowledged long ago.
WARM = 8
WORKERS = 3
ROUNDS = 8


def _sync_attempts(client: Any, names: list[str], patience: float = 0.2) -> list[object]:
    outcomes: list[object] = []
    mutex = threading.Lock()
    start = threading.Barrier(len(names), timeout=20)
    rounds = ROUNDS if patience < 1 else 1

    def worker(name: str) -> None:
        start.wait()
        for _ in range(rounds):
            lock = Lock(client, name, ttl=10, wait=0, replicas=1, replicas_timeout=patience)
            try:
                outcome: object = lock.acquire()
                if lock.held:
                    lock.release()
            except Exception as exc:  # reported below
                outcome = exc
            with mutex:
                outcomes.append(outcome)

    threads = [threading.Thread(target=worker, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return outcomes


async def _async_attempts(client: Any, names: list[str], patience: float = 0.2) -> list[object]:
    rounds = ROUNDS if patience < 1 else 1

    async def worker(name: str) -> list[object]:
        outcomes: list[object] = []
        for _ in range(rounds):
            lock = AsyncLock(client, name, ttl=10, wait=0, replicas=1, replicas_timeout=patience)
            try:
                outcome: object = await lock.acquire()
                if lock.held:
                    await lock.release()
            except Exception as exc:  # reported below
                outcome = exc
            outcomes.append(outcome)
        return outcomes

    results = await asyncio.wait_for(asyncio.gather(*(worker(n) for n in names)), 60)
    return [o for per_worker in results for o in per_worker]


def _all_timed_out(outcomes: list[object]) -> None:
    assert len(outcomes) == WORKERS * ROUNDS
    wrong = [o for o in outcomes if not isinstance(o, ReplicationTimeout)]
    assert wrong == [], f"{len(wrong)} of {len(outcomes)} attempts: {wrong[:3]}"
    assert all(o.acked == 0 for o in outcomes)  # type: ignore[attr-defined]


def _warm_sync(client: Any, names: list[str]) -> None:
    # Several pooled connections, scripts cached: the conditions of the bug.
    # A new replica can take a while to acknowledge its first writes.
    _sync_ok = _sync_attempts(client, names, patience=5)
    assert all(o is True for o in _sync_ok), _sync_ok[:3]


def _acknowledged_all(port: int) -> None:
    """Wait until the replica of the primary on ``port`` acknowledged every write.

    Then every pooled connection's last write is acknowledged, as in a service
    that has been running a while, and a WAIT on the wrong one answers at once.
    """

    def caught_up() -> bool:
        with redis.Redis(host="127.0.0.1", port=port, socket_timeout=2) as c:
            info = c.info("replication")
            return bool(info["slave0"]["offset"] >= info["master_repl_offset"])

    wait_until("the replica to acknowledge every write", caught_up, 20)


async def _warm_async(client: Any, names: list[str]) -> None:
    warm = await _async_attempts(client, names, patience=5)
    assert all(o is True for o in warm), warm[:3]


def test_paused_replica_never_acknowledges_threads(pair: Pair, primary: redis.Redis) -> None:
    client = redis.Redis(host="127.0.0.1", port=pair.primary.port, socket_timeout=5)
    names = [f"paused-{i}" for i in range(WARM)]
    try:
        _warm_sync(client, names)
        _acknowledged_all(pair.primary.port or 0)
        pair.replica.pause()
        try:
            _all_timed_out(_sync_attempts(client, names[:WORKERS]))
        finally:
            pair.replica.resume()
        wait_until("the replica to catch up", pair.linked, 20)
        assert all(primary.exists(Lock(client, n).keys.lease) == 0 for n in names)
    finally:
        client.close()


async def test_paused_replica_never_acknowledges_tasks(pair: Pair, primary: redis.Redis) -> None:
    client = redis.asyncio.Redis(host="127.0.0.1", port=pair.primary.port, socket_timeout=5)
    names = [f"paused-async-{i}" for i in range(WARM)]
    try:
        await _warm_async(client, names)
        _acknowledged_all(pair.primary.port or 0)
        pair.replica.pause()
        try:
            _all_timed_out(await _async_attempts(client, names[:WORKERS]))
        finally:
            pair.replica.resume()
    finally:
        await client.aclose()
    wait_until("the replica to catch up", pair.linked, 20)


@pytest.fixture(scope="module")
def replicated_cluster() -> Iterator[ClusterTopology]:
    """Three primaries with one replica each, for this module."""
    cluster = ClusterTopology(primaries=3, replicas=1).start()
    yield cluster
    cluster.stop()


def _names_on(client: Any, node_port: int, count: int, prefix: str) -> list[str]:
    names: list[str] = []
    i = 0
    while len(names) < count:
        name = f"{prefix}-{i}"
        i += 1
        if int(client.get_node_from_key(Lock(client, name).keys.lease).port) == node_port:
            names.append(name)
    return names


@pytest.mark.cluster
def test_paused_replica_never_acknowledges_on_a_cluster_threads(
    replicated_cluster: ClusterTopology,
) -> None:
    port = replicated_cluster.nodes[0].port or 0
    client = RedisCluster(host="127.0.0.1", port=port, socket_timeout=5)
    try:
        primary = int(client.get_primaries()[0].port)
        names = _names_on(client, primary, WARM, "cl-paused")
        _warm_sync(client, names)
        _acknowledged_all(primary)
        replica = replicated_cluster.replica_of(primary)
        replica.pause()
        try:
            _all_timed_out(_sync_attempts(client, names[:WORKERS]))
        finally:
            replica.resume()
        assert all(client.exists(Lock(client, n).keys.lease) == 0 for n in names)
    finally:
        client.close()


@pytest.mark.cluster
async def test_paused_replica_never_acknowledges_on_a_cluster_tasks(
    replicated_cluster: ClusterTopology,
) -> None:
    port = replicated_cluster.nodes[0].port or 0
    sync = RedisCluster(host="127.0.0.1", port=port, socket_timeout=5)
    client = AsyncRedisCluster(host="127.0.0.1", port=port, socket_timeout=5)
    try:
        primary = int(sync.get_primaries()[0].port)
        names = _names_on(sync, primary, WARM, "acl-paused")
        await _warm_async(client, names)
        _acknowledged_all(primary)
        replica = replicated_cluster.replica_of(primary)
        replica.pause()
        try:
            _all_timed_out(await _async_attempts(client, names[:WORKERS]))
        finally:
            replica.resume()
        assert all(sync.exists(Lock(sync, n).keys.lease) == 0 for n in names)
    finally:
        await client.aclose()
        sync.close()
