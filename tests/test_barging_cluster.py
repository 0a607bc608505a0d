"""The barging order on a private Redis Cluster: its keys in one slot, its
wake-ups through the slot's (sharded) channel, mutual exclusion on every node."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from django_redislock.core import AsyncLock, KeySpace, Lock
from tests.helpers_oracles import Occupancy
from tests.topologies import ClusterTopology, wait_until

pytestmark = pytest.mark.cluster

KS = KeySpace("redislock")
BOUND = 30.0


@pytest.fixture(scope="module")
def topology() -> Iterator[ClusterTopology]:
    cluster = ClusterTopology(primaries=3, replicas=0).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def rc(topology: ClusterTopology) -> Iterator[RedisCluster]:
    client = RedisCluster(host="127.0.0.1", port=topology.nodes[0].port or 0, socket_timeout=5)
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield client
    client.close()


@pytest.fixture
async def arc(topology: ClusterTopology) -> AsyncIterator[AsyncRedisCluster]:
    client = AsyncRedisCluster(host="127.0.0.1", port=topology.nodes[0].port or 0, socket_timeout=5)
    await client.flushall(target_nodes=AsyncRedisCluster.PRIMARIES)
    yield client
    for task in asyncio.all_tasks():
        if task.get_name().startswith("redislock-notify") and task is not asyncio.current_task():
            task.cancel()
    await asyncio.sleep(0)
    await client.aclose()


def names_on_every_node(client: RedisCluster) -> list[str]:
    found: dict[str, str] = {}
    i = 0
    while len(found) < 3:
        name = f"barge:{i}"
        found.setdefault(client.get_node_from_key(KS.lock(name).lease).name, name)
        i += 1
    return list(found.values())


def test_mutual_exclusion_and_wakeups_on_every_node(rc: RedisCluster) -> None:
    for name in names_on_every_node(rc):
        occupancy = Occupancy(multiprocessing.get_context("fork"))
        fences: list[int] = []
        errors: list[BaseException] = []

        def run(
            name: str = name,
            occupancy: Occupancy = occupancy,
            fences: list[int] = fences,
            errors: list[BaseException] = errors,
        ) -> None:
            try:
                lock = Lock(rc, name, ttl=10, fair=False)
                for _ in range(10):
                    assert lock.acquire(wait=BOUND)
                    with occupancy.section():
                        fences.append(lock.fence)  # type: ignore[arg-type]
                    lock.release()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert occupancy.entries.value == 50
        assert occupancy.violations.value == 0
        assert occupancy.unsafe.value == 50
        assert fences == sorted(set(fences))


def test_a_waiter_is_woken_through_the_slots_channel(rc: RedisCluster) -> None:
    name = names_on_every_node(rc)[1]
    holder = Lock(rc, name, ttl=30, wait=0, fair=False)
    assert holder.acquire()
    waiter = Lock(rc, name, ttl=30, wait=BOUND, fair=False)
    out: dict[str, object] = {}

    def wait_for_it() -> None:
        out["ok"] = waiter.acquire()
        out["at"] = time.monotonic()
        if out["ok"]:
            waiter.release()

    thread = threading.Thread(target=wait_for_it)
    thread.start()
    wait_until("the waiter to queue", lambda: rc.llen(holder.keys.queue) == 1, BOUND)
    released_at = time.monotonic()
    holder.release()
    thread.join(BOUND)
    assert out["ok"] is True
    # The holder's lease had 30 s left: only the wake-up explains this.
    assert out["at"] - released_at < 5  # type: ignore[operator]


async def test_async_waiter_is_woken(arc: AsyncRedisCluster) -> None:
    holder = AsyncLock(arc, "barge:async", ttl=30, wait=0, fair=False)
    assert await holder.acquire()
    waiter = AsyncLock(arc, "barge:async", ttl=30, wait=BOUND, fair=False)

    async def wait_for_it() -> tuple[bool, float]:
        ok = await waiter.acquire()
        at = time.monotonic()
        if ok:
            await waiter.release()
        return ok, at

    task = asyncio.create_task(wait_for_it())
    deadline = time.monotonic() + BOUND
    while await arc.llen(holder.keys.queue) != 1:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)
    released_at = time.monotonic()
    await holder.release()
    ok, at = await asyncio.wait_for(task, BOUND)
    assert ok is True
    assert at - released_at < 5
