"""Locks on a private Redis Cluster: one slot per lock, sharded wake-ups, every primary.

Sharded pub/sub is new in Redis 7.0. Before that (and where SSUBSCRIBE is
renamed away) waiters are woken by plain PUBLISH on the lock's node: on a
server without it the whole module runs that way, and the ``unsharded``
Cluster runs the fallback on every server (on one with sharded pub/sub, two of
its three nodes lack it: a Cluster part way through an upgrade).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any, NamedTuple

import pytest
import redis
from django.core.management import call_command
from django.test import override_settings
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from django_redislock import connection
from django_redislock.contrib.cluster import cluster_client_factory
from django_redislock.core import (
    AsyncLock,
    KeySpace,
    Lock,
    RedisUnavailable,
    ReplicationTimeout,
)
from django_redislock.core.io import wakeups_base
from django_redislock.core.io.wakeups import get_notifier
from tests.drive import DRIVERS, Drive, run_to_end
from tests.helpers_oracles import Occupancy, exit_codes_of_forks, lock_waiters
from tests.servers import free_port, has_sharded_pubsub
from tests.topologies import (
    ClusterTopology,
    close_async_cluster,
    cluster_client,
    cluster_drive,
    names_on_every_node,
    wait_until,
)

pytestmark = pytest.mark.cluster

KS = KeySpace("redislock")

# How the lock scripts wake a waiter on this server's Cluster: s = SPUBLISH
# (Redis 7.0 and later, Valkey), c = PUBLISH on the lock's node (before 7.0).
MODE = b"s" if has_sharded_pubsub() else b"c"
# The pub/sub introspection that sees the wake-up channels.
CHANNELS, NUMSUB = (
    ("SHARDCHANNELS", "SHARDNUMSUB") if has_sharded_pubsub() else ("CHANNELS", "NUMSUB")
)


class Unsharded(NamedTuple):
    topology: ClusterTopology
    sharded_ports: set[int]  # the nodes that do have sharded pub/sub

    def mode(self, client: RedisCluster, name: str) -> bytes:
        """How the scripts wake a waiter on lock ``name``: s = SPUBLISH, c = PUBLISH."""
        port = int(client.get_node_from_key(KS.lock(name).lease).port)
        return b"s" if port in self.sharded_ports else b"c"


@pytest.fixture(scope="module")
def unsharded(request: pytest.FixtureRequest) -> Iterator[Unsharded]:
    """A Cluster where sharded pub/sub is missing: the server's own Cluster
    before Redis 7.0; else one whose first two nodes have SSUBSCRIBE,
    SUNSUBSCRIBE and SPUBLISH renamed away, the third not."""
    if not has_sharded_pubsub():
        yield Unsharded(request.getfixturevalue("topology"), set())
        return
    # Renamed rather than disabled ("" is quoted differently across versions).
    gone = ("SSUBSCRIBE", "SUNSUBSCRIBE", "SPUBLISH")
    renamed = tuple(a for c in gone for a in ("--rename-command", c, f"{c}-RENAMED-BY-TESTS"))
    cluster = ClusterTopology(primaries=3, extra=lambda i: renamed if i < 2 else ()).start()
    yield Unsharded(cluster, {cluster.nodes[2].port or 0})
    cluster.stop()


@pytest.fixture(scope="module")
def replicated() -> Iterator[ClusterTopology]:
    """Three primaries with one replica each."""
    cluster = ClusterTopology(primaries=3, replicas=1).start()
    yield cluster
    cluster.stop()


def names_for_wakeups(client: RedisCluster) -> list[str]:
    """One name per primary, then a second on the first primary: a node's
    listener must take a new tag while it is already reading."""
    names = names_on_every_node(client)
    first = client.get_node_from_key(KS.lock(names[0]).lease).name
    i = 0
    while True:
        name = f"again:{i}"
        if client.get_node_from_key(KS.lock(name).lease).name == first:
            return [*names, name]
        i += 1


def test_every_key_of_a_lock_shares_its_slot(rc: RedisCluster) -> None:
    for name in ["a", "job:7", "x" * 500, "ünïcode {brace}"]:
        keys = KS.lock(name)
        slots = {rc.keyslot(k) for k in (keys.lease, keys.queue, keys.state)}
        slots.add(rc.keyslot(KS.channel("0123456789abcdef", keys.tag)))
        assert len(slots) == 1, name


async def test_acquire_release_on_every_primary(cdrive: Drive) -> None:
    drive, rc = cdrive, cdrive.sync_client
    names = names_on_every_node(rc)
    fences = []
    for name in names:
        lock = drive.Lock(drive.client, name, ttl=5, wait=0)
        assert await drive(lock.acquire())
        assert await drive(lock.owned())
        other = drive.Lock(drive.client, name, ttl=5, wait=0)
        assert not await drive(other.acquire())
        fences.append(lock.fence)
        await drive(lock.release())
        assert rc.exists(KS.lock(name).lease) == 0
    assert all(isinstance(f, int) for f in fences)


async def test_scripts_reloaded_after_script_flush(cdrive: Drive) -> None:
    drive, rc = cdrive, cdrive.sync_client
    name = names_on_every_node(rc)[0]
    await drive(drive.Lock(drive.client, name, ttl=5, wait=0).acquire())
    rc.execute_command("SCRIPT", "FLUSH", target_nodes=RedisCluster.PRIMARIES)
    second = drive.Lock(drive.client, name + ":b", ttl=5, wait=0)
    assert await drive(second.acquire())  # EVALSHA got NOSCRIPT on its node, EVAL reloaded it
    await drive(second.release())


async def test_waiter_is_woken_through_a_sharded_channel(cdrive: Drive) -> None:
    await _woken_through_the_slots_channel(cdrive, lambda name: MODE)


@pytest.mark.parametrize("driver", DRIVERS)
async def test_waiter_is_woken_by_publish_without_sharded_pubsub(
    unsharded: Unsharded, caplog: pytest.LogCaptureFixture, driver: str
) -> None:
    # Redis before 7.0 refuses SSUBSCRIBE: the listener subscribes the same
    # channel with SUBSCRIBE on the lock's node, and the script PUBLISHes there.
    caplog.set_level(logging.INFO, logger="django_redislock.notify")
    async with cluster_drive(driver, unsharded.topology) as drive:
        client = drive.sync_client
        await _woken_through_the_slots_channel(drive, lambda name: unsharded.mode(client, name))
        # Every node was used; the ones without sharded pub/sub were each
        # told apart once, quietly, not retried with a warning every second.
        names = [f"127.0.0.1:{n.port}" for n in unsharded.topology.nodes]
        ours = [r for r in caplog.records if any(n in r.getMessage() for n in names)]
        assert not [r for r in ours if r.levelno >= logging.WARNING]
        told = sorted(r.getMessage() for r in ours if "no sharded pub/sub" in r.getMessage())
        unsharded_nodes = [
            n for n in unsharded.topology.nodes if n.port not in unsharded.sharded_ports
        ]
        assert told == sorted(
            f"127.0.0.1:{n.port} has no sharded pub/sub: waking by PUBLISH there"
            for n in unsharded_nodes
        )
        name = names_on_every_node(client)[1]
        occupancy = await _exclusive(drive, name, 4, 10)
        assert occupancy.entries.value == 40
        assert occupancy.violations.value == 0


async def _woken_through_the_slots_channel(drive: Drive, mode: Callable[[str], bytes]) -> None:
    """A waiter queues with its slot's channel and ``mode(name)``, and is woken on release."""
    rc = drive.sync_client
    for name in names_for_wakeups(rc):
        holder = drive.Lock(drive.client, name, ttl=30, wait=0)
        assert await drive(holder.acquire())
        waiter = drive.Lock(drive.client, name, ttl=30, wait=10)

        async def wait_then_release(w: Any = waiter) -> bool:
            ok = await drive(w.acquire())
            await drive(w.release())
            return ok  # type: ignore[no-any-return]

        party = drive.spawn(wait_then_release)
        keys = KS.lock(name)
        await drive.until(lambda keys=keys: rc.llen(keys.queue) == 1, 10)
        # The waiter's entry (its queue element, in the first-come order).
        entry = next(iter(lock_waiters(rc, keys).values()))
        address = entry.split(b"|")[1]
        assert address.startswith(mode(name) + KS.prefix.encode() + b":N:" + keys.tag + b":")
        assert rc.keyslot(address[1:]) == rc.keyslot(keys.lease)
        await drive(holder.release())
        # Without the wake-up the waiter would sleep until the 30 s lease ran
        # out, past its 10 s wait: acquiring at all proves it was woken.
        assert await drive.join(party, timeout=15) == [True]


async def test_uncontended_acquire_subscribes_nothing(cdrive: Drive) -> None:
    drive, rc = cdrive, cdrive.sync_client
    lock = drive.Lock(drive.client, "solo", ttl=5, wait=5)
    assert await drive(lock.acquire())
    await drive(lock.release())
    node = rc.get_node_from_key(KS.lock("solo").lease)
    channels = rc.execute_command("PUBSUB", CHANNELS, target_nodes=node)
    assert not [c for c in channels if KS.lock("solo").tag in c]


def test_idle_tags_are_unsubscribed(rc: RedisCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    name = names_on_every_node(rc)[1]
    holder = Lock(rc, name, ttl=30, wait=0)
    assert holder.acquire()
    waiter = Lock(rc, name, ttl=30, wait=0.3)
    assert not waiter.acquire()
    notifier = get_notifier(rc, KS)
    channel = notifier.channel(KS.lock(name).tag)
    node = rc.get_node_from_key(KS.lock(name).lease)

    def subscribed() -> int:
        counts = rc.execute_command("PUBSUB", NUMSUB, channel, target_nodes=node)
        return int(counts[1])

    # Subscribed while waited on, and kept a while after (TAG_IDLE)...
    assert subscribed() == 1
    # ...then dropped once idle (listeners check once a second).
    monkeypatch.setattr(wakeups_base, "TAG_IDLE", 0.0)
    wait_until("the idle tag to be unsubscribed", lambda: subscribed() == 0, 10)
    holder.release()


def test_an_idle_listener_ends_and_the_next_waiter_is_served(
    rc: RedisCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The thread listener of an idle node used to retire while holding its
    # own lock, then ask for it again: it hung for good, and so did the next
    # waiter routed to that node, holding the notifier's mutex.
    name = names_on_every_node(rc, stem="retire")[0]
    holder = Lock(rc, name, ttl=30, wait=0)
    assert holder.acquire()
    assert not Lock(rc, name, ttl=30, wait=0.3).acquire()
    notifier = get_notifier(rc, KS)
    node = rc.get_node_from_key(KS.lock(name).lease).name
    first = notifier._listeners[node].runner
    monkeypatch.setattr(wakeups_base, "TAG_IDLE", 0.0)
    monkeypatch.setattr(wakeups_base, "IDLE_TIMEOUT", 0.0)
    wait_until("the idle listener to end", lambda: not first.is_alive(), 10)
    monkeypatch.undo()

    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(Lock(rc, name, ttl=30, wait=10).acquire()))
    waiter.start()
    wait_until("a new listener", lambda: notifier.is_ready(KS.lock(name).tag), 10)
    holder.release()
    waiter.join(15)
    assert got == [True]
    assert notifier._listeners[node].runner is not first


async def _contend(drive: Drive, lock: Any, occupancy: Occupancy, rounds: int) -> None:
    for _ in range(rounds):
        assert await drive(lock.acquire(wait=30))
        await occupancy.visit(drive)
        await drive(lock.release())


async def _exclusive(drive: Drive, name: str, parties: int, rounds: int) -> Occupancy:
    """``parties`` callers take ``name`` ``rounds`` times each; who was inside, counted."""
    occupancy = Occupancy(multiprocessing.get_context("fork"))
    await drive.join(
        *[
            drive.spawn(
                lambda: _contend(drive, drive.Lock(drive.client, name, ttl=10), occupancy, rounds)
            )
            for _ in range(parties)
        ],
        timeout=60,
    )
    return occupancy


@pytest.mark.parametrize("which", [0, 2])
async def test_mutual_exclusion(cdrive: Drive, which: int) -> None:
    name = names_on_every_node(cdrive.sync_client)[which]
    occupancy = await _exclusive(cdrive, name, 6, 15)
    assert occupancy.entries.value == 90
    assert occupancy.violations.value == 0
    assert occupancy.unsafe.value == 90  # no lost read-modify-write update


def _child(port: int, name: str, occupancy: Occupancy, start: float, rounds: int) -> None:
    code = 1
    try:
        client = RedisCluster(host="127.0.0.1", port=port, socket_timeout=5)
        lock = Lock(client, name, ttl=10)
        time.sleep(max(0.0, start - time.time()))
        run_to_end(_contend(Drive("sync", client, client), lock, occupancy, rounds))
        code = 0
    finally:
        os._exit(code)


def test_mutual_exclusion_processes(rc: RedisCluster, topology: ClusterTopology) -> None:
    name = names_on_every_node(rc)[1]
    ctx = multiprocessing.get_context("fork")
    occupancy = Occupancy(ctx)
    start = time.time() + 0.5
    args = (topology.nodes[0].port, name, occupancy, start, 10)
    assert exit_codes_of_forks(_child, [args] * 4, 60) == [0, 0, 0, 0]
    assert occupancy.entries.value == 40
    assert occupancy.violations.value == 0
    assert occupancy.unsafe.value == 40


def test_replica_ack_on_a_cluster(replicated: ClusterTopology) -> None:
    client = cluster_client(replicated)
    try:
        name = "acked"
        lock = Lock(client, name, ttl=10, wait=0, replicas=1, replicas_timeout=2)
        assert lock.acquire()
        lock.release()
        # Stop the replica of the lock's primary: no acknowledgement can come.
        primary = client.get_node_from_key(KS.lock(name).lease)
        replica = replicated.replica_of(int(primary.port))
        replica.pause()
        try:
            lock = Lock(client, name, ttl=10, wait=0, replicas=1, replicas_timeout=0.2)
            with pytest.raises(ReplicationTimeout) as info:
                lock.acquire()
            assert info.value.acked == 0
            assert client.exists(KS.lock(name).lease) == 0  # given back
            assert not lock.held
        finally:
            replica.resume()
    finally:
        client.close()


def test_cluster_failover_keeps_the_lease_and_wakes_waiters(replicated: ClusterTopology) -> None:
    client = cluster_client(replicated)
    try:
        name = "failover"
        holder = Lock(client, name, ttl=30, wait=0, replicas=1, replicas_timeout=2)
        assert holder.acquire()  # acknowledged: the replica has the lease
        primary = client.get_node_from_key(KS.lock(name).lease)
        replicated.failover(replicated.replica_of(int(primary.port)))
        # The holder still holds on the new primary and releases there; the
        # client follows the MOVED redirection, no call hangs.
        started = time.monotonic()
        holder.extend()
        holder.release()
        assert time.monotonic() - started < 15
        again = Lock(client, name, ttl=30, wait=0)
        assert again.acquire()
        result: list[bool] = []
        waiter = Lock(client, name, ttl=30, wait=10)

        def wait_then_release() -> None:
            result.append(waiter.acquire())
            waiter.release()

        thread = threading.Thread(target=wait_then_release)
        thread.start()
        wait_until("the waiter to queue", lambda: client.llen(KS.lock(name).queue) == 1, 10)
        again.release()
        thread.join(15)
        assert result == [True]
    finally:
        client.close()


@pytest.fixture
def cluster_settings(topology: ClusterTopology, rc: RedisCluster) -> Iterator[None]:
    with override_settings(REDISLOCK={"CLIENT": cluster_client_factory(topology.url)}):
        connection.reset()
        yield
    connection.reset()


def test_settings_factory_builds_cluster_clients(cluster_settings: None) -> None:
    from django_redislock.locking.factories import get_lock

    client = connection.get_client()
    assert isinstance(client, RedisCluster)
    assert client.get_connection_kwargs()["socket_timeout"] == 2.0  # REDISLOCK default
    with get_lock("via-settings", timeout=5, wait=0) as lock:
        assert lock.owned()


async def test_settings_factory_builds_async_cluster_clients(cluster_settings: None) -> None:
    from django_redislock.locking.factories import get_async_lock

    client = connection.get_async_client()
    assert isinstance(client, AsyncRedisCluster)
    async with get_async_lock("via-settings-async", timeout=5, wait=0) as lock:
        assert await lock.owned()
    await close_async_cluster(client)


def test_a_list_of_startup_nodes_survives_one_that_is_down(topology: ClusterTopology) -> None:
    """A client reads the slot map from its startup nodes as it is made: one
    URL whose node is down gives no client (``RedisUnavailable``, naming the
    fix, as every call that cannot reach Redis does); a list with a live node
    in it does."""
    down = ("127.0.0.1", free_port())
    single = cluster_client_factory(f"redis://{down[0]}:{down[1]}")
    with pytest.raises(RedisUnavailable, match=r"a list of \(host, port\) startup nodes") as info:
        single(asyncio=False)
    assert info.value.reason == "unreachable"
    listed = cluster_client_factory([down, ("127.0.0.1", topology.nodes[0].port or 0)])
    client = listed(asyncio=False)
    try:
        lock = Lock(client, "startup", ttl=5, wait=0)
        assert lock.acquire()
        lock.release()
    finally:
        client.close()

    async def asyncio_twin() -> None:
        lonely = single(asyncio=True)
        try:
            with pytest.raises(RedisUnavailable) as info:
                await AsyncLock(lonely, "startup", ttl=5, wait=0).acquire()
            assert info.value.reason == "unreachable"
        finally:
            await lonely.aclose()
        client = listed(asyncio=True)
        try:
            lock = AsyncLock(client, "startup", ttl=5, wait=0)
            assert await lock.acquire()
            await lock.release()
        finally:
            await close_async_cluster(client)

    asyncio.run(asyncio_twin())


def test_factory_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="redis:// URL or a list"):
        cluster_client_factory([("127.0.0.1", "7000")])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="must start with redis://"):
        cluster_client_factory("http://127.0.0.1:7000")


def test_redislocks_command_sees_every_primary(cluster_settings: None, rc: RedisCluster) -> None:
    names = [f"job:{i}" for i in range(12)]
    held = [Lock(rc, n, ttl=60, wait=0) for n in names]
    for lock in held:
        assert lock.acquire()
    assert len({rc.get_node_from_key(KS.lock(n).lease).name for n in names}) == 3
    out = StringIO()
    call_command("redislocks", "list", "--format", "json", stdout=out)
    import json

    assert sorted(row["name"] for row in json.loads(out.getvalue())["locks"]) == sorted(names)
    call_command("redislocks", "clear", "--all", "--noinput", stdout=StringIO())
    for name in names:
        assert rc.exists(KS.lock(name).lease) == 0


async def test_semaphore_on_a_cluster(cdrive: Drive) -> None:
    drive = cdrive
    name = names_on_every_node(drive.sync_client)[1]
    occupancy_limit = 2
    inside = 0
    most = 0
    mutex = threading.Lock()

    async def worker() -> None:
        nonlocal inside, most
        sem = drive.Semaphore(drive.client, name, occupancy_limit, ttl=10, wait=30)
        for _ in range(5):
            assert await drive(sem.acquire())
            with mutex:
                inside += 1
                most = max(most, inside)
            await drive.sleep(0.005)
            with mutex:
                inside -= 1
            await drive(sem.release())

    await drive.join(*[drive.spawn(worker) for _ in range(5)], timeout=60)
    assert most <= occupancy_limit


THROTTLE_MW = "django_redislock.middleware.ConcurrencyLimitMiddleware"


@pytest.mark.urls("tests.urls_throttle")
def test_concurrency_middleware_on_a_cluster(
    topology: ClusterTopology, rc: RedisCluster, settings: Any
) -> None:
    from django.test import Client

    from django_redislock.core.drivers.semaphore import Semaphore

    settings.MIDDLEWARE = [*settings.MIDDLEWARE, THROTTLE_MW]
    settings.REDISLOCK = {
        "CLIENT": cluster_client_factory(topology.url),
        "THROTTLE": [{"name": "ok", "path": "^/ok/", "limit": 2, "per": "global", "wait": 0.2}],
    }
    connection.reset()
    try:
        permits = [Semaphore(rc, "throttle:ok", 2, ttl=60, wait=0) for _ in range(2)]
        for permit in permits:
            assert permit.acquire()
        assert Client().get("/ok/").status_code == 503
        assert asyncio.run(async_get("/ok/")) == 503
        permits[0].release()
        assert Client().get("/ok/").status_code == 200
        assert asyncio.run(async_get("/ok/")) == 200
        permits[1].release()
        assert rc.zcard(KS.semaphore("throttle:ok").lease) == 0  # every permit given back
    finally:
        connection.reset()


# -- several names in different slots ---------------------------------------------------------
async def test_multi_lock_spans_slots_all_or_nothing(cdrive: Drive) -> None:
    """A cart whose names live on three primaries: one script per name, on its
    own node; a busy name on one node leaves nothing held on the others."""
    drive, rc = cdrive, cdrive.sync_client
    names = names_on_every_node(rc)
    holder = drive.Lock(drive.client, names[1], ttl=10, wait=0)
    assert await drive(holder.acquire())
    cart = drive.MultiLock(drive.client, list(reversed(names)), ttl=10, wait=0)
    assert not await drive(cart.acquire())
    assert all(rc.exists(KS.lock(n).lease) == 0 for n in names if n != names[1])
    await drive(holder.release())
    assert await drive(cart.acquire())
    assert all(rc.hget(KS.lock(n).lease, "t") is not None for n in names)
    assert all(isinstance(f, int) for f in cart.fences.values())
    await drive(cart.release())
    assert all(rc.exists(KS.lock(n).lease) == 0 for n in names)
    async with drive.holding(cart):
        assert [rc.exists(KS.lock(n).lease) for n in names] == [1, 1, 1]
    assert [rc.exists(KS.lock(n).lease) for n in names] == [0, 0, 0]


def test_each_call_is_bounded_when_a_primary_dies(rc: RedisCluster) -> None:
    """Last in the module: it kills a node. Calls fail fast, they never hang."""
    name = names_on_every_node(rc)[2]
    node = rc.get_node_from_key(KS.lock(name).lease)
    lock = Lock(rc, name, ttl=5, wait=0)
    assert lock.acquire()
    victim = next(n for n in rc_topology_nodes(rc) if n[1] == node.port)
    os.kill(victim[0], 9)
    started = time.monotonic()
    with pytest.raises(RedisUnavailable):
        lock.release()
    assert time.monotonic() - started < 15


def rc_topology_nodes(rc: RedisCluster) -> list[tuple[int, int]]:
    """(pid, port) of every node, read from the servers themselves."""
    out = []
    for node in rc.get_nodes():
        with redis.Redis(host=node.host, port=node.port, socket_timeout=2) as c:
            out.append((int(c.info("server")["process_id"]), int(node.port)))
    return out


async def async_get(path: str) -> int:
    """GET through the async request path, then close this loop's client."""
    from django.test import AsyncClient

    try:
        return int((await AsyncClient().get(path)).status_code)
    finally:
        await close_async_cluster(connection.get_async_client())
