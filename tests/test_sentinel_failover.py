"""Locks through Redis Sentinel while the primary fails over: one holder per
release, and waiters follow the new primary.

A private primary, replica and three sentinels (``tests/topologies.py``),
reached by core clients of redis-py's own Sentinel support, sync and asyncio:
anything whose pool is a Sentinel pool is a Sentinel client.

What a failover does to a wake-up channel: the sentinels name the new primary
at once, and make the old one its replica (dropping its pub/sub clients) only
some seconds later; a primary stopped (SIGSTOP) or killed says nothing to a
listener at all. A listener that stays where it subscribed meanwhile hears
none of the new primary's wake-ups. And a listener that sits on a replica
(one the sentinels, or a stale one of them, named) hears every wake-up the
primary publishes, through replication, while the primary counts none.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.sentinel
from redis.sentinel import Sentinel

from django_redislock.core import KeySpace, Lock
from django_redislock.core.engine import scripts
from django_redislock.core.engine.protocol import STATE_KEEP_MS
from django_redislock.core.io import calls
from django_redislock.core.io.wakeups import get_notifier
from tests.failover_parties import (
    WAIT,
    Sections,
    async_waiters,
    queued_with_a_channel,
    sync_waiter,
)
from tests.helpers_oracles import lock_waiters
from tests.servers import RedisServer
from tests.topologies import SERVICE, SentinelTopology, wait_until

pytestmark = [pytest.mark.sentinel]

KS = KeySpace("redislock")
# How soon after the release on the new primary every waiter (four, one
# after the other) has been served. The sentinels make the old primary a
# replica, which drops its listeners, no sooner than 8 s after naming the new
# one (SENTINEL_PUBLISH_PERIOD * 4 in Redis's sentinel.c), and a listener on
# a stopped server notices only by its missing PING reply (5 to 10 s): a
# listener that waits for either serves nobody within this bound, one that
# asks the sentinels where the primary is (once a second) does.
SERVED_WITHIN = 6.0


@pytest.fixture(scope="module")
def topology() -> Iterator[SentinelTopology]:
    sentinel = SentinelTopology().start()
    yield sentinel
    sentinel.stop()


def sentinel_client(topology: SentinelTopology) -> redis.Redis:
    """A client of the service's primary, asking the sentinels with bounds."""
    bounds = {"socket_timeout": 1, "socket_connect_timeout": 1}
    manager = Sentinel(topology.sentinel_addresses, sentinel_kwargs=bounds, **bounds)
    return manager.master_for(SERVICE, socket_timeout=2, socket_connect_timeout=1)


def async_sentinel_client(topology: SentinelTopology) -> redis.asyncio.Redis:
    """``sentinel_client`` for asyncio."""
    bounds = {"socket_timeout": 1, "socket_connect_timeout": 1}
    manager = redis.asyncio.sentinel.Sentinel(
        topology.sentinel_addresses, sentinel_kwargs=bounds, **bounds
    )
    return manager.master_for(SERVICE, socket_timeout=2, socket_connect_timeout=1)


# -- what a release hands over, and to whom ----------------------------------------------------


def _listener_on(server: RedisServer, primary: RedisServer, channel: bytes) -> Any:
    """A listener of ``channel`` on ``server``, once it hears what ``primary`` publishes."""
    pubsub = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=10).pubsub()
    pubsub.subscribe(channel)
    assert pubsub.get_message(timeout=10)["type"] == "subscribe"
    with primary.client(socket_timeout=10) as p:

        def hears() -> bool:
            p.publish(channel, "ready")
            message = pubsub.get_message(timeout=0.5)
            if message is None:
                return False
            while message is not None:  # the probes sent before this one
                message = pubsub.get_message(timeout=0.1)
            return True

        wait_until("a listener to hear its channel", hears, 20)
    return pubsub


def _heard(primary: RedisServer, listeners: dict[bytes, Any], channels: dict[bytes, bytes]) -> Any:
    """Every wake-up the listeners received so far (read up to an end marker)."""
    heard = []
    with primary.client(socket_timeout=10) as p:
        for token, pubsub in listeners.items():
            p.publish(channels[token], "end")
            while True:
                message = pubsub.get_message(timeout=10)
                assert message is not None, "the end marker did not arrive"
                if message["type"] == "message":
                    if message["data"] == b"end":
                        break
                    if message["data"] != b"ready":
                        heard.append(message["data"])
    return heard


def _grants_taken_as_they_are(heard: list[bytes]) -> set[tuple[bytes, bytes]]:
    """(token, fence) of each wake-up that names a round: its waiter holds at once."""
    return {(m.split(b":")[0], m.split(b":")[1]) for m in heard if m.count(b":") == 2}


def test_a_sentinel_client_is_woken_by_the_claim_path(topology: SentinelTopology) -> None:
    """The wake-up address a Sentinel client's waiters queue with says "c":
    a count of receivers proves nothing there. A single server's stays "p"."""
    client = sentinel_client(topology)
    try:
        assert get_notifier(client, KS).address_for(b"").startswith(b"c")
    finally:
        client.close()
    with topology.primary().client() as plain:
        assert get_notifier(plain, KS).address_for(b"").startswith(b"p")


def test_a_grant_is_taken_as_it_is_only_where_its_waiter_is_heard(
    topology: SentinelTopology,
) -> None:
    """A release through Sentinel hands the lease to the oldest waiter. When
    the waiter's process listens on the primary, the wake-up names the round
    and the waiter holds at once; when it listens on the replica (a primary
    made a replica, or one a stale sentinel named), the lease is written for
    a short claim that the waiter confirms, and no other waiter is handed
    anything. Before, such a waiter counted as dead: its lease was taken back
    and handed to the next, and every one of them still heard its grant
    through replication and held the lock together."""
    topology.wait_settled(60)
    client = sentinel_client(topology)
    try:
        name = "grant"
        keys = KS.lock(name)
        key_tuple = (keys.lease, keys.queue, keys.state)
        client.delete(*key_tuple)
        primary, replica = topology.primary(), topology.replica()
        address = get_notifier(client, KS).address_for(b"")
        letter = address[:1]

        def acquire(token: str, wait_ms: int, to: bytes, round_: int = 1) -> Any:
            args = (token, 30_000, name, "{}", wait_ms, to, 30_000 + STATE_KEEP_MS, round_)
            return calls.run(client, scripts.ACQUIRE, key_tuple, args)

        holder, here, *elsewhere = (c * 16 for c in "aebcd")
        channels = {t.encode(): KS.channel(t) for t in (here, *elsewhere)}
        listeners = {here.encode(): _listener_on(primary, primary, channels[here.encode()])}
        for token in elsewhere:
            listeners[token.encode()] = _listener_on(replica, primary, channels[token.encode()])
        fence = acquire(holder, 0, b"-")
        for token in (here, *elsewhere):
            assert isinstance(acquire(token, 60_000, letter + channels[token.encode()]), int)

        # The first waiter listens on the primary: a grant it takes as it is.
        assert calls.run(client, scripts.RELEASE, key_tuple, (holder, fence)) == 1
        heard = _heard(primary, listeners, channels)
        assert _grants_taken_as_they_are(heard) == {(here.encode(), client.hget(keys.lease, "f"))}
        assert client.hget(keys.lease, "t") == here.encode()

        # The next listens on the replica: its grant is a claim, and nobody else's.
        fence = client.hget(keys.lease, "f")
        assert calls.run(client, scripts.RELEASE, key_tuple, (here, fence)) == 1
        heard = _heard(primary, listeners, channels)
        assert _grants_taken_as_they_are(heard) == set()
        first = elsewhere[0].encode()
        assert heard == [first + b":" + client.hget(keys.lease, "f")]
        assert client.hget(keys.lease, "t") == first
        assert 0 < client.pttl(keys.lease) <= 15_000
        assert list(lock_waiters(client, keys)) == [t.encode() for t in elsewhere[1:]]
        # The waiter claims it by asking again: the lease is its own, for its whole TTL.
        assert acquire(elsewhere[0], 60_000, letter + channels[first], 2) == client.hget(
            keys.lease, "f"
        )
        assert client.pttl(keys.lease) > 20_000
        for pubsub in listeners.values():
            pubsub.close()
        client.delete(*key_tuple)
    finally:
        client.close()


# -- waiters of both drivers while the primary fails over ------------------------------------


async def _async_waiters(
    topology: SentinelTopology, name: str, sections: Sections, outcomes: list[Any], count: int
) -> None:
    client = async_sentinel_client(topology)
    try:
        await async_waiters(client, name, sections, outcomes, count)
    finally:
        for task in asyncio.all_tasks():
            if (
                task.get_name().startswith("redislock-notify")
                and task is not asyncio.current_task()
            ):
                task.cancel()
        await asyncio.sleep(0)
        await client.aclose()


def _served_through(topology: SentinelTopology, name: str, fail: Callable[[], None]) -> None:
    """A holder (a pool of its own) holds a lock; two threads and two tasks of
    another process queue for it; ``fail`` fails the primary over; the holder
    releases on the new primary. Each waiter is served in turn, one at a
    time, with strictly increasing fences, soon after the release."""
    topology.wait_settled(60)
    look, waiters = sentinel_client(topology), sentinel_client(topology)
    try:
        holder = Lock(look, name, ttl=60, wait=0)
        assert holder.acquire()
        sections, outcomes = Sections(), []  # type: ignore[var-annotated]
        parties = [
            threading.Thread(target=sync_waiter, args=(waiters, name, sections, outcomes))
            for _ in range(2)
        ]
        parties.append(
            threading.Thread(
                target=lambda: asyncio.run(_async_waiters(topology, name, sections, outcomes, 2))
            )
        )
        for party in parties:
            party.start()
        wait_until("every waiter to queue", lambda: queued_with_a_channel(look, name) == 4, 20)
        fail()
        # The holder's process asks the sentinels (as its next connection
        # would): its release goes to the new primary, not to an old one
        # that may answer as a primary for some seconds yet.
        look.connection_pool.get_master_address()
        look.connection_pool.disconnect()
        released_at = time.monotonic()
        holder.release()
        for party in parties:
            party.join(WAIT + 30)
        assert not any(party.is_alive() for party in parties)
        assert outcomes == [True] * 4
        assert sections.most == 1
        assert sections.fences == sorted(set(sections.fences))
        served = max(sections.entered) - released_at
        assert served < SERVED_WITHIN, f"the last waiter was served {served:.1f} s after"
    finally:
        look.close()
        waiters.close()


def test_one_holder_per_release_across_a_sentinel_failover(topology: SentinelTopology) -> None:
    _served_through(topology, "forced", lambda: topology.failover())


def test_one_holder_per_release_when_the_primary_is_paused(topology: SentinelTopology) -> None:
    """SIGSTOP until the sentinels named its replica, then SIGCONT: they make
    it a replica of the new primary (a long GC pause, a frozen VM)."""

    def pause() -> None:
        primary, old = topology.primary(), topology.primary_address()
        primary.pause()
        try:
            topology.wait_new_primary(old, 40)
        finally:
            primary.resume()

    _served_through(topology, "paused", pause)


def test_one_holder_per_release_when_the_primary_is_killed(topology: SentinelTopology) -> None:
    """Last: the killed primary comes back empty, and the sentinels make it a replica."""
    killed: list[RedisServer] = []

    def kill() -> None:
        primary, old = topology.primary(), topology.primary_address()
        killed.append(primary)
        primary.kill()
        topology.wait_new_primary(old, 40)

    try:
        _served_through(topology, "killed", kill)
    finally:
        for server in killed:
            server.start()
            topology.wait_replicated(60)
