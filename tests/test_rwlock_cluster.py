"""Read-write locks on a private Redis Cluster: one slot per name, wake-ups in that slot."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from collections.abc import Iterator

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from django_redislock.core import AsyncReadWriteLock, KeySpace, ReadWriteLock
from tests.servers import has_sharded_pubsub
from tests.test_rwlock import RWOccupancy
from tests.topologies import ClusterTopology, wait_until

pytestmark = pytest.mark.cluster

KS = KeySpace("redislock")
MODE = b"s" if has_sharded_pubsub() else b"p"


@pytest.fixture(scope="module")
def topology() -> Iterator[ClusterTopology]:
    cluster = ClusterTopology(primaries=3, replicas=0).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def rc(topology: ClusterTopology) -> Iterator[RedisCluster]:
    client = RedisCluster(
        host="127.0.0.1",
        port=topology.nodes[0].port or 0,
        socket_timeout=5,
        socket_connect_timeout=2,
    )
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield client
    client.close()


def names_on_every_node(client: RedisCluster) -> list[str]:
    found: dict[str, str] = {}
    i = 0
    while len(found) < 3:
        name = f"doc:{i}"
        found.setdefault(client.get_node_from_key(KS.rwlock(name).lease).name, name)
        i += 1
    return list(found.values())


def test_every_key_of_a_name_shares_its_slot(rc: RedisCluster) -> None:
    for name in ["a", "doc:7", "x" * 500, "ünïcode {brace}"]:
        keys = KS.rwlock(name)
        slots = {rc.keyslot(k) for k in (keys.lease, keys.queue, keys.state)}
        slots.add(rc.keyslot(KS.channel("0123456789abcdef", keys.tag)))
        assert len(slots) == 1, name


def test_writer_woken_in_the_slot_on_every_primary(rc: RedisCluster) -> None:
    for name in names_on_every_node(rc):
        reader = ReadWriteLock(rc, name, "read", ttl=30, wait=0)
        assert reader.acquire()
        result: list[bool] = []
        writer = ReadWriteLock(rc, name, "write", ttl=30, wait=10)

        def take(w: ReadWriteLock = writer, result: list[bool] = result) -> None:
            result.append(w.acquire())
            w.release()

        thread = threading.Thread(target=take)
        thread.start()
        keys = KS.rwlock(name)
        wait_until("the writer to queue", lambda keys=keys: rc.llen(keys.queue) == 1, 10)
        token = rc.lindex(keys.queue, 0)
        entry = rc.hget(keys.state, b"w:" + token)
        address = entry.split(b"|", 1)[1][2:]  # after the mode and the channel mode
        assert entry.split(b"|", 1)[1][1:2] == MODE
        assert rc.keyslot(address) == rc.keyslot(keys.lease)
        assert not ReadWriteLock(rc, name, "read", wait=0).acquire()  # writer preference
        reader.release()
        # Without the wake-up the writer would sleep past its 10 s wait.
        thread.join(15)
        assert result == [True]


def _contend(
    client: RedisCluster, name: str, occ: RWOccupancy, errors: list[BaseException]
) -> None:
    try:
        for i in range(10):
            if i % 3 == 0:
                with ReadWriteLock(client, name, "write", ttl=10, wait=30), occ.writing():
                    pass
            else:
                with ReadWriteLock(client, name, "read", ttl=10, wait=30), occ.reading(0.02):
                    pass
    except BaseException as exc:
        errors.append(exc)


def test_oracle_threads_on_a_cluster(rc: RedisCluster) -> None:
    name = names_on_every_node(rc)[1]
    occ = RWOccupancy(multiprocessing.get_context("fork"))
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_contend, args=(rc, name, occ, errors)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert occ.entries.value == 60
    assert occ.violations.value == 0 and occ.most_readers.value > 1


async def test_async_on_a_cluster(topology: ClusterTopology) -> None:
    client = AsyncRedisCluster(host="127.0.0.1", port=topology.nodes[0].port or 0, socket_timeout=5)
    try:
        name = "doc:async"
        reader = AsyncReadWriteLock(client, name, "read", ttl=30, wait=0)
        assert await reader.acquire()
        writer = AsyncReadWriteLock(client, name, "write", ttl=30, wait=10)

        async def write() -> int | None:
            async with writer:
                return writer.fence

        task = asyncio.create_task(write())
        keys = KS.rwlock(name)
        for _ in range(1000):
            if await client.llen(keys.queue) == 1:
                break
            await asyncio.sleep(0.01)
        await reader.release()
        assert await asyncio.wait_for(task, 15)
    finally:
        for task in asyncio.all_tasks():
            if (
                task.get_name().startswith("redislock-notify")
                and task is not asyncio.current_task()
            ):
                task.cancel()
        await asyncio.sleep(0)
        await client.aclose()
