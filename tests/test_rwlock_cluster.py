"""Read-write locks on a private Redis Cluster: one slot per name, wake-ups in that slot.

A scenario that takes ``cdrive`` runs on both drivers (tests/drive.py).
"""

from __future__ import annotations

import multiprocessing

import pytest
from redis.cluster import RedisCluster

from django_redislock.core import KeySpace
from tests.drive import Drive
from tests.servers import has_sharded_pubsub
from tests.test_rwlock import RWOccupancy, contend
from tests.topologies import names_on_every_node

pytestmark = pytest.mark.cluster

KS = KeySpace("redislock")
# s = SPUBLISH (Redis 7.0 and later, Valkey), c = PUBLISH on the lock's node (6.2).
MODE = b"s" if has_sharded_pubsub() else b"c"


def test_every_key_of_a_name_shares_its_slot(rc: RedisCluster) -> None:
    for name in ["a", "doc:7", "x" * 500, "ünïcode {brace}"]:
        keys = KS.rwlock(name)
        slots = {rc.keyslot(k) for k in (keys.lease, keys.queue, keys.state)}
        slots.add(rc.keyslot(KS.channel("0123456789abcdef", keys.tag)))
        assert len(slots) == 1, name


async def test_writer_woken_in_the_slot_on_every_primary(cdrive: Drive) -> None:
    drive, rc = cdrive, cdrive.sync_client
    for name in names_on_every_node(rc, "doc", "rwlock"):
        reader = drive.ReadWriteLock(drive.client, name, "read", ttl=30, wait=0)
        assert await drive(reader.acquire())
        writer = drive.ReadWriteLock(drive.client, name, "write", ttl=30, wait=10)

        async def take(w: object = writer) -> int | None:
            async with drive.holding(w) as held:
                return held.fence  # type: ignore[no-any-return]

        party = drive.spawn(take)
        keys = KS.rwlock(name)
        await drive.until(lambda keys=keys: rc.llen(keys.queue) == 1, 10)
        token = rc.lindex(keys.queue, 0)
        entry = rc.hget(keys.state, b"w:" + token)
        # <deadline>|<mode><channel mode><channel>|<owner>
        address = entry.split(b"|", 2)[1][2:]
        assert entry.split(b"|", 2)[1][1:2] == MODE
        assert rc.keyslot(address) == rc.keyslot(keys.lease)
        # Writer preference: a reader that could share waits behind the writer.
        assert not await drive(drive.ReadWriteLock(drive.client, name, "read", wait=0).acquire())
        await drive(reader.release())
        # Without the wake-up the writer would sleep past its 10 s wait.
        [fence] = await drive.join(party, timeout=15)
        assert fence


async def test_oracle_on_a_cluster(cdrive: Drive) -> None:
    drive = cdrive
    name = names_on_every_node(drive.sync_client, "doc", "rwlock")[1]
    occ = RWOccupancy(multiprocessing.get_context("fork"))
    parties = [
        drive.spawn(lambda seed=seed: contend(drive, drive.client, occ, 10, seed, name))
        for seed in range(6)
    ]
    await drive.join(*parties, timeout=120)
    assert occ.entries.value == 60
    assert occ.violations.value == 0 and occ.most_readers.value > 1
