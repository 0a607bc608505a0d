"""Locks on a Redis Cluster while it fails over: one holder per release, every waiter served.

A private Cluster of three shards, a primary and a replica each (node ``k``
and node ``k + 3``). On a server with sharded pub/sub, shard 0 has it renamed
away on both its nodes, as every shard of a Redis 6.2 Cluster lacks it: its
waiters are woken by plain PUBLISH, the others by SPUBLISH.

Whatever a node counts as receivers of a wake-up, Redis delivers it to every
node of the shard (SPUBLISH) or of the Cluster (PUBLISH): a count is no
proof that a waiter's process died. The holders record their own sections
(who is inside, with which fence); after every release at most one is.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.cluster import RedisCluster

from django_redislock.core import KeySpace, Lock, RedisUnavailable
from django_redislock.core.engine import scripts
from django_redislock.core.engine.protocol import STATE_KEEP_MS
from django_redislock.core.io import calls
from tests.failover_parties import (
    WAIT,
    Sections,
    async_waiters,
    queued_with_a_channel,
    sync_waiter,
)
from tests.servers import RedisServer, has_sharded_pubsub, requires_redis
from tests.topologies import (
    ClusterTopology,
    async_cluster_client,
    close_async_cluster,
    cluster_client,
    wait_until,
)

pytestmark = pytest.mark.cluster

KS = KeySpace("redislock")
# The shards whose wake-ups each kind of channel carries (see the module's docstring).
KINDS = ["sharded", "plain"] if has_sharded_pubsub() else ["plain"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterTopology]:
    renamed: tuple[str, ...] = ()
    if has_sharded_pubsub():
        gone = ("SSUBSCRIBE", "SUNSUBSCRIBE", "SPUBLISH")
        renamed = tuple(a for c in gone for a in ("--rename-command", c, f"{c}-RENAMED-BY-TESTS"))
    topology = ClusterTopology(
        primaries=3, replicas=1, extra=lambda i: renamed if i % 3 == 0 else ()
    ).start()
    yield topology
    topology.stop()


def name_on(cluster: ClusterTopology, client: RedisCluster, kind: str, stem: str) -> str:
    """A lock name whose slot is served by a shard of ``kind`` (its primary may
    be either node of the shard: failovers swap them)."""
    shard = 0 if kind == "plain" or not has_sharded_pubsub() else 1
    ports = {cluster.nodes[shard].port, cluster.nodes[shard + 3].port}
    i = 0
    while True:
        name = f"{stem}:{i}"
        if client.get_node_from_key(KS.lock(name).lease).port in ports:
            return name
        i += 1


# -- what a release hands over, and to whom ----------------------------------------------------


def _subscriber(node: RedisServer, primary: RedisServer, kind: str, channel: bytes) -> Any:
    """A listener of ``channel`` on ``node``, once it hears what ``primary`` sends
    there (a node forwards a message to another over the cluster bus, which may
    not be linked yet just after the Cluster started)."""
    pubsub = redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=10).pubsub()
    (pubsub.ssubscribe if kind == "sharded" else pubsub.subscribe)(channel)
    assert pubsub.get_message(timeout=10)["type"] in ("ssubscribe", "subscribe")
    publish = "SPUBLISH" if kind == "sharded" else "PUBLISH"
    with redis.Redis(host="127.0.0.1", port=primary.port, socket_timeout=10) as p:

        def hears() -> bool:
            p.execute_command(publish, channel, "ready")
            message = pubsub.get_message(timeout=0.5)
            if message is None:
                return False
            while message is not None:  # the probes sent before this one
                message = pubsub.get_message(timeout=0.1)
            return True

        wait_until("a listener to hear its channel", hears, 20)
    return pubsub


def _heard(
    primary: RedisServer, kind: str, listeners: dict[bytes, Any], channels: dict[bytes, bytes]
) -> list[bytes]:
    """Every wake-up the listeners received so far: an end marker is published
    after them on each channel, from the node that sent them, and read up to."""
    heard = []
    with redis.Redis(host="127.0.0.1", port=primary.port, socket_timeout=10) as p:
        for token, pubsub in listeners.items():
            p.execute_command(
                "SPUBLISH" if kind == "sharded" else "PUBLISH", channels[token], "end"
            )
            while True:
                message = pubsub.get_message(timeout=10)
                assert message is not None, "the end marker did not arrive"
                if message["type"] in ("smessage", "message"):
                    if message["data"] == b"end":
                        break
                    if message["data"] != b"ready":  # a late probe of _subscriber
                        heard.append(message["data"])
    return heard


def _grants_taken_as_they_are(heard: list[bytes]) -> set[tuple[bytes, bytes]]:
    """(token, fence) of each wake-up that names a round: its waiter holds at once."""
    return {(m.split(b":")[0], m.split(b":")[1]) for m in heard if m.count(b":") == 2}


@pytest.mark.parametrize("kind", KINDS)
def test_a_grant_is_taken_as_it_is_only_where_its_waiter_is_heard(
    cluster: ClusterTopology, kind: str
) -> None:
    """A release on a Cluster hands the lease to the oldest waiter. When the
    waiter's process listens on the lock's own node (the count proves it alive)
    the wake-up names the round and the waiter holds at once; when it listens
    elsewhere (on a replica, as after a failover), the lease is written for a
    short claim that the waiter confirms, and no other waiter is handed
    anything: before, each such waiter was taken for dead, its lease taken
    back and handed to the next, and every one of them still heard its grant
    and held the lock together."""
    rc = cluster_client(cluster)
    try:
        name = name_on(cluster, rc, kind, "grant")
        keys = KS.lock(name)
        key_tuple = (keys.lease, keys.queue, keys.state)
        primary = cluster.node_at(int(rc.get_node_from_key(keys.lease).port))
        replica = cluster.replica_of(int(primary.port or 0))
        letter = b"s" if kind == "sharded" else b"c"

        def acquire(token: str, wait_ms: int, address: bytes, round_: int = 1) -> Any:
            args = (token, 30_000, name, "{}", wait_ms, address, 30_000 + STATE_KEEP_MS, round_)
            return calls.run(rc, scripts.ACQUIRE, key_tuple, args)

        holder, here, *elsewhere = (c * 16 for c in "aebcd")
        channels = {t.encode(): KS.channel(t, keys.tag) for t in (here, *elsewhere)}
        listeners = {here.encode(): _subscriber(primary, primary, kind, channels[here.encode()])}
        for token in elsewhere:
            listeners[token.encode()] = _subscriber(
                replica, primary, kind, channels[token.encode()]
            )
        fence = acquire(holder, 0, b"-")
        for token in (here, *elsewhere):
            assert isinstance(acquire(token, 60_000, letter + channels[token.encode()]), int)

        # The first waiter listens on the lock's node: a grant it takes as it is.
        assert calls.run(rc, scripts.RELEASE, key_tuple, (holder, fence)) == 1
        heard = _heard(primary, kind, listeners, channels)
        assert _grants_taken_as_they_are(heard) == {(here.encode(), rc.hget(keys.lease, "f"))}
        assert rc.hget(keys.lease, "t") == here.encode()
        assert rc.pttl(keys.lease) > 20_000

        # The next listens on a replica: its grant is a claim, and nobody else's.
        fence = rc.hget(keys.lease, "f")
        assert calls.run(rc, scripts.RELEASE, key_tuple, (here, fence)) == 1
        heard = _heard(primary, kind, listeners, channels)
        assert _grants_taken_as_they_are(heard) == set()
        first = elsewhere[0].encode()
        assert heard == [first + b":" + rc.hget(keys.lease, "f")]
        assert rc.hget(keys.lease, "t") == first
        assert 0 < rc.pttl(keys.lease) <= 15_000
        queued = [e.split(b"|")[0] for e in rc.lrange(keys.queue, 0, -1)]
        assert queued == [t.encode() for t in elsewhere[1:]]
        # The waiter claims it by asking again: the lease is its own, for its whole TTL.
        assert acquire(elsewhere[0], 60_000, letter + channels[first], 2) == rc.hget(
            keys.lease, "f"
        )
        assert rc.pttl(keys.lease) > 20_000
        for pubsub in listeners.values():
            pubsub.close()
    finally:
        rc.close()


# -- waiters of both drivers while the lock's shard fails over --------------------------------


async def _async_waiters(
    cluster: ClusterTopology, name: str, sections: Sections, outcomes: list[Any], count: int
) -> None:
    client = async_cluster_client(cluster, client_name="waiter-async")
    try:
        await async_waiters(client, name, sections, outcomes, count)
    finally:
        await close_async_cluster(client)


def _served_through(
    cluster: ClusterTopology, kind: str, stem: str, fail: Callable[[RedisServer], None]
) -> None:
    """A holder (a process of its own) holds a lock; two threads and two tasks
    of another process queue for it; ``fail`` fails the lock's shard over; the
    holder releases. Each waiter is served in turn, one at a time."""
    look, waiters = cluster_client(cluster), cluster_client(cluster)
    try:
        name = name_on(cluster, look, kind, stem)
        holder = Lock(look, name, ttl=60, wait=0)
        assert holder.acquire()
        sections, outcomes = Sections(), []  # type: ignore[var-annotated]
        parties = [
            threading.Thread(target=sync_waiter, args=(waiters, name, sections, outcomes))
            for _ in range(2)
        ]
        parties.append(
            threading.Thread(
                target=lambda: asyncio.run(_async_waiters(cluster, name, sections, outcomes, 2))
            )
        )
        for party in parties:
            party.start()
        wait_until("every waiter to queue", lambda: queued_with_a_channel(look, name) == 4, 20)
        fail(cluster.node_at(int(look.get_node_from_key(KS.lock(name).lease).port)))
        holder.release()
        for party in parties:
            party.join(WAIT + 30)
        assert not any(party.is_alive() for party in parties)
        assert outcomes == [True] * 4
        assert sections.most == 1
        assert sections.fences == sorted(set(sections.fences))
    finally:
        look.close()
        waiters.close()


@pytest.mark.parametrize("kind", KINDS)
def test_one_holder_per_release_across_a_manual_failover(
    cluster: ClusterTopology, kind: str
) -> None:
    _served_through(
        cluster,
        kind,
        f"manual-{kind}",
        lambda primary: cluster.failover(cluster.replica_of(int(primary.port or 0))),
    )


def test_one_holder_per_release_when_the_primary_is_paused(cluster: ClusterTopology) -> None:
    # SIGSTOP until the replica took over, then SIGCONT: the old primary comes
    # back as its replica (a long GC pause, a frozen VM).
    _served_through(
        cluster, KINDS[0], "paused", lambda primary: cluster.promote_by_failure(primary, kill=False)
    )


def test_one_holder_per_release_when_the_primary_is_killed(cluster: ClusterTopology) -> None:
    killed: list[RedisServer] = []

    def kill(primary: RedisServer) -> None:
        killed.append(primary)
        cluster.promote_by_failure(primary, kill=True)

    try:
        _served_through(cluster, KINDS[0], "killed", kill)
    finally:
        for node in killed:
            cluster.revive(node)


# -- what Redis says to try again ---------------------------------------------------------------


def _errors(node: RedisServer, code: str) -> int:
    """How many error replies ``code`` (TRYAGAIN, CLUSTERDOWN) ``node`` sent so far."""
    with node.client(socket_timeout=2) as c:
        stat = c.info("errorstats").get(f"errorstat_{code}")
    return int(stat["count"]) if stat else 0


def _node_id(node: RedisServer) -> str:
    with node.client(socket_timeout=2) as c:
        found = c.execute_command("CLUSTER", "MYID")
    return found.decode() if isinstance(found, bytes) else str(found)


def _waiters_refused(
    cluster: ClusterTopology, name: str, node: RedisServer, sections: Sections
) -> tuple[list[threading.Thread], list[Any]]:
    """A thread and a task (each of a process's own) that wait for ``name``,
    started; returned once ``node`` refused the acquire of each (the last
    command of its connection there is the script, which could not run)."""
    outcomes: list[Any] = []
    client = cluster_client(cluster, client_name="waiter-sync")
    parties = [
        threading.Thread(target=sync_waiter, args=(client, name, sections, outcomes)),
        threading.Thread(
            target=lambda: asyncio.run(_async_waiters(cluster, name, sections, outcomes, 1))
        ),
    ]
    for party in parties:
        party.start()

    def refused() -> bool:
        with node.client(socket_timeout=2) as c:
            sent = {e["name"] for e in c.client_list() if e.get("cmd") == "evalsha"}
        return {"waiter-sync", "waiter-async"} <= sent

    wait_until("each waiter to be refused", refused, 20)
    return parties, outcomes


# The test sees the release refused through INFO errorstats, which does not
# count a script's TRYAGAIN before Redis 7.0: there it would wait in vain.
@requires_redis(7, 0, "a script's TRYAGAIN counted in INFO errorstats")
def test_acquire_and_release_wait_out_a_slot_migration(cluster: ClusterTopology) -> None:
    """While a lock's slot migrates, Redis answers TRYAGAIN to its scripts
    (their keys are on both nodes, or the queue is on neither): the release
    and the acquires are sent again until it has moved, within their bounds,
    instead of failing at once."""
    # The holder's release tries again for one socket timeout: ample for
    # the test to move the slot once the release has been refused.
    look = cluster_client(cluster, socket_timeout=20)
    name = name_on(cluster, look, KINDS[0], "migrating")
    keys = KS.lock(name)
    slot = look.keyslot(keys.lease)
    source = cluster.node_at(int(look.get_node_from_key(keys.lease).port))
    target = next(n for n in cluster.live() if n is not source and cluster.role(n) == "master")
    held, go, released = threading.Event(), threading.Event(), []  # type: ignore[var-annotated]

    def hold_then_release() -> None:
        holder = Lock(look, name, ttl=60, wait=0)
        assert holder.acquire()
        held.set()
        go.wait(30)
        released.append(holder.release())

    holding = threading.Thread(target=hold_then_release)
    holding.start()
    try:
        assert held.wait(10)
        with target.client() as t, source.client() as s:
            t.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", _node_id(source))
            s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", _node_id(target))
        refused = _errors(source, "TRYAGAIN")
        go.set()
        wait_until("the release to be refused", lambda: _errors(source, "TRYAGAIN") > refused, 20)
        sections = Sections()
        parties, outcomes = _waiters_refused(cluster, name, source, sections)
        with source.client() as s:
            moving = s.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
            s.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *moving)
        # The new owner first, then the old one; the others learn it by gossip too.
        for node in dict.fromkeys((target, source, *cluster.live())):
            if cluster.role(node) == "master":
                with node.client() as c:
                    c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", _node_id(target))
        holding.join(30)
        for party in parties:
            party.join(WAIT + 30)
        assert released == [None]
        assert outcomes == [True, True]
        assert sections.most == 1
    finally:
        go.set()
        holding.join(30)
        for node in (source, target):  # a failed run leaves no slot half moved
            with node.client() as c:
                c.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
        look.close()


def test_locks_on_every_shard_wait_out_a_failover(cluster: ClusterTopology) -> None:
    """While a dead primary's replica is not yet promoted, every node answers
    CLUSTERDOWN, for every lock: a caller that waits is served once the
    replica took over; one that does not gets ``RedisUnavailable`` with the
    reason ``unreachable`` (the Cluster cannot reach the lock), not ``error``."""
    look = cluster_client(cluster)
    dead = cluster.node_at(int(look.get_node_from_key(KS.lock("down").lease).port))
    replica = cluster.replica_of(int(dead.port or 0))
    name = next(
        f"elsewhere:{i}"
        for i in range(1000)
        if look.get_node_from_key(KS.lock(f"elsewhere:{i}").lease).port
        not in (dead.port, replica.port)
    )
    alive = cluster.node_at(int(look.get_node_from_key(KS.lock(name).lease).port))
    # The replica holds back until the test lets it: the Cluster stays down.
    with replica.client() as c:
        c.config_set("cluster-replica-no-failover", "yes")
    dead.kill()
    dead.proc = None
    try:
        wait_until("the Cluster to be down", lambda: cluster.cluster_state(alive) == "fail", 30)
        quick = cluster_client(cluster, socket_timeout=0.5)
        try:
            with pytest.raises(RedisUnavailable) as info:
                Lock(quick, name, ttl=10, wait=0).acquire()
        finally:
            quick.close()
        assert info.value.reason == "unreachable"
        assert "Cluster is down" in str(info.value)
        sections = Sections()
        parties, outcomes = _waiters_refused(cluster, name, alive, sections)
        with replica.client() as c:
            c.config_set("cluster-replica-no-failover", "no")
        for party in parties:
            party.join(WAIT + 30)
        assert outcomes == [True, True]
        assert sections.most == 1
    finally:
        with replica.client() as c:
            c.config_set("cluster-replica-no-failover", "no")
        cluster.revive(dead)
        look.close()


# -- a listener's connection made anew --------------------------------------------------------


@pytest.mark.skipif(not has_sharded_pubsub(), reason="plain channels have no slot")
def test_a_listener_connection_made_anew_subscribes_each_slot_alone(
    cluster: ClusterTopology,
) -> None:
    """redis-py subscribes a connection made anew to all its sharded channels
    in one SSUBSCRIBE, which Redis refuses across slots (CROSSSLOT): the
    listeners' subscriptions are made again one per channel."""
    from django_redislock.core.io import _wakeup_prims, _wakeup_prims_async

    rc = cluster_client(cluster)
    try:
        node = rc.get_node_from_key(KS.lock(name_on(cluster, rc, "sharded", "again")).lease)
        channels = [
            KS.channel("0" * 16, KS.lock(name).tag)
            for name in (f"again:{i}" for i in range(1000))
            if rc.get_node_from_key(KS.lock(name).lease).name == node.name
        ][:3]
        assert len({rc.keyslot(c) for c in channels}) == 3

        def confirmed(messages: list[Any]) -> list[bytes]:
            return sorted(m["channel"] for m in messages if m["type"] == "ssubscribe")

        pubsub = _wakeup_prims.node_pubsub(rc.get_redis_connection(node))
        for channel in channels[:2]:
            pubsub.ssubscribe(channel)
        assert confirmed([pubsub.get_message(timeout=5) for _ in range(2)]) == sorted(channels[:2])
        pubsub.connection.disconnect()  # as a reader does when its node drops it
        pubsub.ssubscribe(channels[2])
        got = [pubsub.get_message(timeout=5) for _ in range(3)]
        assert confirmed(got) == sorted(channels)
        pubsub.close()

        async def asyncio_twin() -> list[bytes]:
            client = redis.asyncio.Redis(host=node.host, port=node.port, socket_timeout=5)
            pubsub = _wakeup_prims_async.node_pubsub(client)
            try:
                for channel in channels[:2]:
                    await pubsub.ssubscribe(channel)
                for _ in range(2):
                    await pubsub.get_message(timeout=5)
                await pubsub.connection.disconnect()
                await pubsub.ssubscribe(channels[2])
                return confirmed([await pubsub.get_message(timeout=5) for _ in range(3)])
            finally:
                await pubsub.aclose()
                await client.aclose()

        assert asyncio.run(asyncio_twin()) == sorted(channels)
    finally:
        rc.close()
