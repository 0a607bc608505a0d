"""``replicas=N``: a new lease counts only once N replicas acknowledged it (WAIT).

A scenario that takes ``drive`` runs on both drivers (tests/drive.py), on a
client of the primary: ``on_primary``.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
from django.test import override_settings

from django_redislock import ReplicationTimeout
from django_redislock.core import Lock, LockError, RedisUnavailable
from django_redislock.locking.factories import get_lock
from tests.drive import DRIVERS, Drive
from tests.servers import RedisServer, free_port
from tests.topologies import ClusterTopology, cluster_drive, wait_until


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


@contextlib.asynccontextmanager
async def on_primary(drive: Drive, pair: Pair) -> AsyncIterator[Any]:
    """A client of the pair's primary, of the driver's kind."""
    async with drive.connect(pair.primary.url, socket_timeout=5) as client:
        yield client


async def test_acknowledged_lease_is_on_the_replica(
    drive: Drive, pair: Pair, primary: redis.Redis
) -> None:
    async with on_primary(drive, pair) as client:
        lock = drive.Lock(client, "acked", ttl=10, wait=0, replicas=1, replicas_timeout=2)
        assert await drive(lock.acquire())  # the first may need EVAL after NOSCRIPT: warm up
        await drive(lock.release())
        before = _calls(primary)
        assert await drive(lock.acquire())
        # EVALSHA and WAIT, nothing sent again.
        assert _ran_since(primary, before) == {"evalsha": 1, "wait": 1}
        with pair.replica.client(socket_timeout=2) as c:
            assert c.hget(lock.keys.lease, "t") == lock.token.encode()
        await drive(lock.release())


async def test_script_reloaded_inside_the_pipeline(
    drive: Drive, pair: Pair, primary: redis.Redis
) -> None:
    primary.script_flush()
    async with on_primary(drive, pair) as client:
        lock = drive.Lock(client, "fresh", ttl=10, wait=0, replicas=1, replicas_timeout=2)
        assert await drive(lock.acquire())  # NOSCRIPT in the pipeline: EVAL + WAIT again
        await drive(lock.release())


async def test_no_acknowledgement_gives_the_lease_back(
    drive: Drive, pair: Pair, primary: redis.Redis
) -> None:
    async with on_primary(drive, pair) as client:
        with pair.replica_cut_off():
            lock = drive.Lock(client, "fragile", ttl=10, wait=5, replicas=1, replicas_timeout=0.2)
            with pytest.raises(ReplicationTimeout) as info:
                await drive(lock.acquire())
            assert (info.value.acked, info.value.wanted) == (0, 1)
            assert "0 of 1 replica(s)" in str(info.value)
            assert isinstance(info.value, RedisUnavailable)  # the unavailable policy applies
            assert isinstance(info.value, LockError)
            assert not lock.held
            assert primary.exists(lock.keys.lease) == 0
            with pytest.raises(ReplicationTimeout):
                async with drive.holding(lock):
                    pytest.fail("the body must not run")
            # Without asking for acknowledgement the lock is simply free.
            plain = drive.Lock(client, "fragile", ttl=10, wait=0)
            assert await drive(plain.acquire())
            await drive(plain.release())


async def test_more_replicas_than_exist(drive: Drive, pair: Pair, primary: redis.Redis) -> None:
    async with on_primary(drive, pair) as client:
        lock = drive.Lock(client, "two", ttl=10, wait=0, replicas=2, replicas_timeout=0.1)
        with pytest.raises(ReplicationTimeout) as info:
            await drive(lock.acquire())
        assert info.value.acked == 1
        assert primary.exists(lock.keys.lease) == 0


async def test_give_back_hands_the_turn_to_the_next_waiter(
    drive: Drive, pair: Pair, primary: redis.Redis
) -> None:
    async with on_primary(drive, pair) as client:
        holder = drive.Lock(client, "queue", ttl=30, wait=0)
        assert await drive(holder.acquire())

        async def demanding() -> BaseException | None:
            lock = drive.Lock(client, "queue", ttl=30, wait=10, replicas=2, replicas_timeout=0.1)
            try:
                await drive(lock.acquire())
            except ReplicationTimeout as exc:
                return exc
            return None

        async def patient() -> bool:
            lock = drive.Lock(client, "queue", ttl=30, wait=10)
            ok = await drive(lock.acquire())
            await drive(lock.release())
            return ok  # type: ignore[no-any-return]

        first = drive.spawn(demanding)
        await drive.until(lambda: primary.llen(holder.keys.queue) == 1, 10)
        second = drive.spawn(patient)
        await drive.until(lambda: primary.llen(holder.keys.queue) == 2, 10)
        await drive(holder.release())
        outcome, patient_got = await drive.join(first, second, timeout=15)
        assert isinstance(outcome, ReplicationTimeout)
        assert patient_got is True


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"replicas": -1}, "replicas must be a whole number"),
        ({"replicas": True}, "replicas must be a whole number"),
        ({"replicas": 1.5}, "replicas must be a whole number"),
        ({"replicas_timeout": 0}, "replicas_timeout must be a finite number"),
    ],
)
async def test_bad_arguments(drive: Drive, options: dict[str, Any], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        drive.Lock(drive.client, "x", **options)


def test_settings_apply_to_get_lock() -> None:
    with override_settings(REDISLOCK={"REPLICAS": 2, "REPLICAS_TIMEOUT": 0.5}):
        lock = get_lock("configured")
        assert (lock.replicas, lock.replicas_timeout) == (2, 0.5)
        assert get_lock("configured", replicas=0).replicas == 0
    assert get_lock("configured").replicas == 0  # the default: off


async def test_off_by_default_sends_no_wait(drive: Drive, primary: redis.Redis, pair: Pair) -> None:
    async with on_primary(drive, pair) as client:
        lock = drive.Lock(client, "plain", ttl=10, wait=0)
        assert await drive(lock.acquire())
        await drive(lock.release())
        before = _calls(primary)
        assert await drive(lock.acquire())
        assert _ran_since(primary, before) == {"evalsha": 1}
        await drive(lock.release())


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


async def _attempts(
    drive: Drive, client: Any, names: list[str], patience: float = 0.2
) -> list[object]:
    """Each name's caller (a thread or a task) acquires and releases, asking for one replica."""
    rounds = ROUNDS if patience < 1 else 1
    start = drive.event()

    async def worker(name: str) -> list[object]:
        await start.wait(20)
        outcomes: list[object] = []
        for _ in range(rounds):
            lock = drive.Lock(client, name, ttl=10, wait=0, replicas=1, replicas_timeout=patience)
            try:
                outcome: object = await drive(lock.acquire())
                if lock.held:
                    await drive(lock.release())
            except Exception as exc:  # reported below
                outcome = exc
            outcomes.append(outcome)
        return outcomes

    parties = [drive.spawn(lambda n=n: worker(n)) for n in names]
    start.set()
    results = await drive.join(*parties, timeout=60)
    return [o for per_worker in results for o in per_worker]


def _all_timed_out(outcomes: list[object]) -> None:
    assert len(outcomes) == WORKERS * ROUNDS
    wrong = [o for o in outcomes if not isinstance(o, ReplicationTimeout)]
    assert wrong == [], f"{len(wrong)} of {len(outcomes)} attempts: {wrong[:3]}"
    assert all(o.acked == 0 for o in outcomes)  # type: ignore[attr-defined]


async def _warm(drive: Drive, client: Any, names: list[str]) -> None:
    # Several pooled connections, scripts cached: the conditions of the bug.
    # A new replica can take a while to acknowledge its first writes.
    warm = await _attempts(drive, client, names, patience=5)
    assert all(o is True for o in warm), warm[:3]


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


async def test_paused_replica_never_acknowledges(
    drive: Drive, pair: Pair, primary: redis.Redis
) -> None:
    names = [f"paused-{i}" for i in range(WARM)]
    async with on_primary(drive, pair) as client:
        await _warm(drive, client, names)
        _acknowledged_all(pair.primary.port or 0)
        pair.replica.pause()
        try:
            _all_timed_out(await _attempts(drive, client, names[:WORKERS]))
        finally:
            pair.replica.resume()
    wait_until("the replica to catch up", pair.linked, 20)
    assert all(primary.exists(Lock(primary, n).keys.lease) == 0 for n in names)


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
@pytest.mark.parametrize("driver", DRIVERS)
async def test_paused_replica_never_acknowledges_on_a_cluster(
    replicated_cluster: ClusterTopology, driver: str
) -> None:
    async with cluster_drive(driver, replicated_cluster) as drive:
        sync = drive.sync_client
        primary = int(sync.get_primaries()[0].port)
        names = _names_on(sync, primary, WARM, "cl-paused")
        await _warm(drive, drive.client, names)
        _acknowledged_all(primary)
        replica = replicated_cluster.replica_of(primary)
        replica.pause()
        try:
            _all_timed_out(await _attempts(drive, drive.client, names[:WORKERS]))
        finally:
            replica.resume()
        assert all(sync.exists(Lock(sync, n).keys.lease) == 0 for n in names)
