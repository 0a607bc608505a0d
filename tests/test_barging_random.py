"""Random interleavings of the barging scripts (with the default order's on
the same name, and give-backs), against a real Redis, with the invariants
checked after every step. Seeded: a failure names its seed and step."""

from __future__ import annotations

import random
import secrets

import pytest
import redis

from django_redislock.core import Lock
from django_redislock.core.engine import scripts
from django_redislock.core.engine.wakeup_message import NO_CHANNEL
from django_redislock.core.io import calls
from tests.helpers_oracles import audit_keyspace, lock_waiters, plant_sentinel

LIMIT = 3  # a small bound, so that random walks reach it often
CLIENTS = 5
STEPS = 1500


class Client:
    def __init__(self, lock: Lock) -> None:
        self.lock = lock
        self.token = ""
        self.round = 0
        self.queued = False  # may have a queue entry
        # The order of the handle its token belongs to: one per acquisition,
        # as a real handle has (a name may see handles of both orders).
        self.fair = False


def _acquire(r: redis.Redis, c: Client, fair: bool, wait_ms: int) -> object:
    c.round += 1
    c.lock._round = c.round
    c.lock.fair = fair
    args = c.lock._args_acquire(c.token, 30_000, "model", wait_ms, NO_CHANNEL)
    script = scripts.ACQUIRE if fair else scripts.ACQUIRE_BARGING
    if not fair:
        args = (*args[:8], LIMIT)
    return calls.run(r, script, c.lock._key_tuple, args)


@pytest.mark.parametrize("seed", range(6))
def test_random_interleavings_keep_the_invariants(r: redis.Redis, seed: int) -> None:
    plant_sentinel(r)
    rng = random.Random(seed)
    clients = [Client(Lock(r, "model", ttl=30, wait=0)) for _ in range(CLIENTS)]
    keys = clients[0].lock.keys
    holder: Client | None = None
    last_fence = 0
    head, others_served = None, 0
    handed = barged = most = 0
    for step in range(STEPS):
        where = f"seed {seed}, step {step}"
        c = rng.choice(clients)
        fair = rng.random() < 0.2  # now and then a handle of the default order
        # The head's token (a handle of the default order queues its whole
        # entry: "<token>|...").
        element = r.lindex(keys.queue, 0)
        queue_head = element.partition(b"|")[0] if element is not None else None
        if c is holder:
            if rng.random() < 0.8:
                script = scripts.RELEASE if c.fair else scripts.RELEASE_BARGING
                args = (c.token,) if c.fair else (c.token, LIMIT)
                assert calls.run(r, script, keys_tuple(c), args) == 1, where
            else:  # its release's reply was lost: the give-back frees it
                assert calls.run(r, scripts.CANCEL, keys_tuple(c), (c.token,)) == 1, where
            c.token, c.queued = "", False
        elif c.queued and rng.random() < 0.2:
            calls.run(r, scripts.CANCEL, keys_tuple(c), (c.token,))
            c.token, c.queued = "", False
        else:
            if not c.token:
                c.token, c.round, c.fair = secrets.token_hex(8), 0, fair
            wait_ms = rng.choice([0, 10_000])
            reply = _acquire(r, c, c.fair, wait_ms)
            if isinstance(reply, bytes):
                assert int(reply) > 0, where
            else:
                c.queued = c.queued or wait_ms > 0
                if wait_ms == 0 and not c.queued:
                    c.token = ""
        # -- the invariants ---------------------------------------------------------
        current = r.hget(keys.lease, "t")
        owners = [x for x in clients if x.token and current == x.token.encode()]
        assert current is None or len(owners) == 1, where
        new_holder = owners[0] if owners else None
        if new_holder is not None and new_holder is not holder:
            fence = int(r.hget(keys.lease, "f"))  # type: ignore[arg-type]
            assert fence > last_fence, f"{where}: fence {fence} after {last_fence}"
            last_fence = fence
            new_holder.queued = False
            # The bound: grants to others than the head while it waits.
            if queue_head is not None and new_holder.token.encode() != queue_head:
                barged += 1
                others_served = others_served + 1 if queue_head == head else 1
                head = queue_head
                assert others_served <= LIMIT, f"{where}: head passed over too often"
                most = max(most, others_served)
            else:
                handed += new_holder is not c  # the lease went to a waiter
                head, others_served = None, 0
        holder = new_holder
        # Handles of the default order queue their whole entry as the
        # element; barging ones a bare token, with its entry in the state.
        queue = [e.partition(b"|")[0] for e in r.lrange(keys.queue, 0, -1)]
        bare = {e for e in r.lrange(keys.queue, 0, -1) if b"|" not in e}
        state = r.hgetall(keys.state)
        waiting = {k for k in state if len(k) == 16 and k not in (b"f", b"q", b"d", b"n")}
        assert bare == waiting and len(queue) == len(set(queue)), where
        assert set(lock_waiters(r, keys)) == set(queue), where
        assert not queue or b"q" in state, where
        assert int(state.get(b"b", 0)) <= LIMIT, where
        if holder is None:
            assert current is None, where
    # The walk went through both ways a waiting name changes hands.
    assert barged > 0 and handed > 0, (barged, handed)
    assert most == LIMIT, f"the bound was never reached ({most})"
    audit_keyspace(r)


def keys_tuple(c: Client) -> tuple[bytes, bytes, bytes]:
    return c.lock._key_tuple
