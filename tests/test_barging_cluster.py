"""The barging order on a private Redis Cluster: its keys in one slot, its
wake-ups through the slot's (sharded) channel, mutual exclusion on every node.

Each scenario takes ``cdrive`` and runs on ``Lock`` and ``AsyncLock`` (tests/drive.py).
"""

from __future__ import annotations

import multiprocessing
import time

import pytest

from django_redislock.core import KeySpace
from tests.drive import Drive
from tests.helpers_oracles import Occupancy
from tests.topologies import names_on_every_node

pytestmark = pytest.mark.cluster

KS = KeySpace("redislock")
BOUND = 30.0


async def test_mutual_exclusion_and_wakeups_on_every_node(cdrive: Drive) -> None:
    drive = cdrive
    for name in names_on_every_node(drive.sync_client, "barge"):
        occupancy = Occupancy(multiprocessing.get_context("fork"))
        fences: list[int] = []

        async def run(
            name: str = name, occupancy: Occupancy = occupancy, fences: list[int] = fences
        ) -> None:
            lock = drive.Lock(drive.client, name, ttl=10, fair=False)
            for _ in range(10):
                assert await drive(lock.acquire(wait=BOUND))
                fences.append(lock.fence)
                await occupancy.visit(drive)
                await drive(lock.release())

        await drive.join(*[drive.spawn(run) for _ in range(5)], timeout=60)
        assert occupancy.entries.value == 50
        assert occupancy.violations.value == 0
        assert occupancy.unsafe.value == 50
        assert fences == sorted(set(fences))


async def test_a_waiter_is_woken_through_the_slots_channel(cdrive: Drive) -> None:
    drive, rc = cdrive, cdrive.sync_client
    name = names_on_every_node(rc, "barge")[1]
    holder = drive.Lock(drive.client, name, ttl=30, wait=0, fair=False)
    assert await drive(holder.acquire())
    waiter = drive.Lock(drive.client, name, ttl=30, wait=BOUND, fair=False)

    async def wait_for_it() -> tuple[bool, float]:
        ok = await drive(waiter.acquire())
        at = time.monotonic()
        if ok:
            await drive(waiter.release())
        return ok, at

    party = drive.spawn(wait_for_it)
    await drive.until(lambda: rc.llen(holder.keys.queue) == 1, BOUND)
    released_at = time.monotonic()
    await drive(holder.release())
    [(ok, at)] = await drive.join(party, timeout=BOUND)
    assert ok is True
    # The holder's lease had 30 s left: only the wake-up explains this.
    assert at - released_at < 5
