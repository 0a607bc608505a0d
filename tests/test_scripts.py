"""Lua scripts: EVALSHA with NOSCRIPT fallback, errors as RedisUnavailable."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from django_redislock.core import AsyncLock, KeySpace, Lock, RedisUnavailable
from django_redislock.core.drivers import rwlock, semaphore
from django_redislock.core.engine import scripts
from django_redislock.core.engine.protocol import STATE_KEEP_MS
from django_redislock.core.io import calls
from tests.drive import Drive
from tests.helpers_oracles import audit_keyspace, plant_sentinel
from tests.topologies import ClusterTopology, wait_until


def test_scripts_are_distinct_and_hashed() -> None:
    all_scripts = [scripts.ACQUIRE, scripts.RELEASE, scripts.EXTEND, scripts.CANCEL, scripts.CLEAR]
    assert len({s.sha for s in all_scripts}) == len(all_scripts)
    for s in all_scripts:
        assert len(s.sha) == 40
        assert s.source.startswith(b"-- The prelude of every lock, semaphore and read-write")
        assert b"-- A lock's own piece" in s.source


def test_one_prelude_each_kind_adding_its_own() -> None:
    pieces = {
        "_prelude.lua": b"-- The prelude of every lock, semaphore and read-write",
        "_lock.lua": b"-- A lock's own piece",
        "_holders.lua": b"-- What semaphores and read-write locks share",
        "_semaphore.lua": b"-- A semaphore's own piece",
        "_rwlock.lua": b"-- A read-write lock's own piece",
    }
    kinds = {
        "lock": (scripts.ACQUIRE, scripts.RELEASE, scripts.RELEASE_BARGING, scripts.CLEAR),
        "holders": (scripts.HOLDERS_REFRESH,),
        "semaphore": (semaphore.ACQUIRE, semaphore.RELEASE, semaphore.CANCEL, semaphore.CLEAR),
        "rwlock": (rwlock.ACQUIRE, rwlock.RELEASE, rwlock.CANCEL, rwlock.CLEAR),
    }
    for kind, loaded in kinds.items():
        for script in loaded:
            found = [name for name, head in pieces.items() if head in script.source]
            assert found == list(scripts.PIECES[kind]), (kind, script.name)
            assert script.source.count(pieces["_prelude.lua"]) == 1
    # Identical scripts are one: the refresh of both kinds with many holders.
    assert semaphore.REFRESH is rwlock.REFRESH is scripts.HOLDERS_REFRESH
    assert scripts.ACQUIRE_BARGING is scripts.ACQUIRE


def test_the_keep_time_reaches_the_scripts_one_way(r: redis.Redis) -> None:
    """KEEP, written in by scripts.load; a keep argument a caller sends is not
    read (the semaphore's used to be, by its acquire and refresh)."""
    for script in (scripts.ACQUIRE, semaphore.ACQUIRE, rwlock.ACQUIRE, scripts.HOLDERS_REFRESH):
        assert f"local KEEP = {STATE_KEEP_MS}\n".encode() in script.source
        assert b"@STATE_KEEP_MS@" not in script.source
    keys = KeySpace().semaphore("keep-one-way")
    key_tuple = (keys.lease, keys.queue, keys.state)
    args = ("t" * 32, 60_000, b"keep-one-way", "{}", 0, b"-", 2000, 1, 1)
    assert calls.run(r, semaphore.ACQUIRE, key_tuple, args)[0] == 1
    assert r.pttl(keys.state) > 60_000 + STATE_KEEP_MS - 5_000
    r.persist(keys.state)
    r.pexpire(keys.state, 1000)
    assert calls.run(r, semaphore.REFRESH, key_tuple, ("t" * 32, 60_000, 1)) == 1
    assert r.pttl(keys.state) > 60_000 + STATE_KEEP_MS - 5_000
    assert calls.run(r, semaphore.RELEASE, key_tuple, ("t" * 32, 2000, 1, 1, "")) == 1


# The commands a script may run; what else the server counts (the client's
# own EVALSHA, INFO, a wake-up channel's housekeeping) is left out, and so is
# PEXPIRE: a TTL is raised only when it is short of its mark, which depends
# on how many milliseconds passed since it was set.
_SCRIPT_COMMANDS = frozenset(
    [
        "del",
        "exists",
        "hdel",
        "hexists",
        "hget",
        "hincrby",
        "hmget",
        "hset",
        "lindex",
        "llen",
        "lpop",
        "lpush",
        "lrange",
        "lrem",
        "pttl",
        "publish",
        "rpush",
        "spublish",
        "time",
        "type",
        "zadd",
        "zcard",
        "zrange",
        "zrangebyscore",
        "zremrangebyscore",
        "zrem",
        "zscore",
    ]
)


def _script_commands(r: redis.Redis, call: Callable[[], Any]) -> int:
    r.config_resetstat()
    call()
    stats = r.info("commandstats")
    return sum(
        int(v["calls"]) for k, v in stats.items() if k.removeprefix("cmdstat_") in _SCRIPT_COMMANDS
    )


@pytest.mark.parametrize(
    ("kind", "acquire", "release"),
    [("lock", 4, 4), ("barging", 4, 4), ("semaphore", 12, 7), ("read", 10, 7), ("write", 10, 9)],
)
def test_commands_of_an_uncontended_acquire_and_release(
    r: redis.Redis, kind: str, acquire: int, release: int
) -> None:
    """What the server runs for an uncontended acquire and release of each kind
    (docs/internals.rst, Scripts): a script that runs more on these paths
    makes every caller pay for it."""
    name = f"count-{kind}"
    handle: Any
    if kind in ("lock", "barging"):
        handle = Lock(r, name, ttl=30, wait=1, fair=kind == "lock")
    elif kind == "semaphore":
        handle = semaphore.Semaphore(r, name, 3, ttl=30, wait=1)
    else:
        handle = rwlock.ReadWriteLock(r, name, kind, ttl=30, wait=1)  # type: ignore[arg-type]
    handle.acquire()
    handle.release()  # the state exists from here on, as it does for a name in use
    assert (_script_commands(r, handle.acquire), _script_commands(r, handle.release)) == (
        acquire,
        release,
    )


async def test_scripts_reloaded_after_script_flush(drive: Drive, r: redis.Redis) -> None:
    plant_sentinel(r)
    lock = drive.Lock(drive.client, "noscript", ttl=5, wait=0)
    r.script_flush()
    assert r.script_exists(scripts.ACQUIRE.sha) == [False]
    assert await drive(lock.acquire())
    assert r.script_exists(scripts.ACQUIRE.sha) == [True]
    r.script_flush()
    await drive(lock.extend())
    r.script_flush()
    await drive(lock.release())
    assert not r.exists(lock.keys.lease)
    assert r.script_exists(scripts.RELEASE.sha) == [True]
    r.script_flush()
    assert await drive(lock.acquire())
    await drive(lock.release())
    audit_keyspace(r)


def test_error_reply_becomes_unavailable(r: redis.Redis) -> None:
    lock = Lock(r, "wrong", ttl=5, wait=0)
    r.set(lock.keys.lease, b"x")
    with pytest.raises(RedisUnavailable, match="answered with an error running acquire"):
        lock.acquire()


def test_unreachable_becomes_unavailable() -> None:
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1, socket_timeout=1)
    with pytest.raises(RedisUnavailable, match="refused the connection") as info:
        calls.run(client, scripts.RELEASE, (b"a", b"b", b"c"), ("t",))
    assert (info.value.reason, info.value.address) == ("refused", "127.0.0.1:1")


# -- Cluster: a stale slot map is followed, the script runs once -----------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterTopology]:
    topology = ClusterTopology(primaries=3, replicas=0).start()
    yield topology
    topology.stop()


def _node_id(port: int) -> str:
    with redis.Redis(host="127.0.0.1", port=port, socket_timeout=5) as c:
        return str(c.execute_command("CLUSTER", "MYID").decode())


def _assign(cluster: ClusterTopology, slot: int, port: int) -> None:
    """Give the (empty) ``slot`` to the node on ``port``, on every node.

    The new owner claims the slot first and takes the highest config epoch:
    a node that hears the old owner's stale claim before its own SETSLOT
    would otherwise keep the old owner for good (the higher epoch wins a
    gossip conflict). Gossip can still win that race on a loaded host, so
    the claim is made again, on every node, until they all agree (a bounded
    number of rounds).
    """
    owner = _node_id(port)
    ordered = sorted(cluster.nodes, key=lambda n: n.port != port)
    rounds = 5
    for attempt in range(1, rounds + 1):
        for node in ordered:
            with node.client(socket_timeout=5) as c:
                c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", owner)
                if node.port == port:
                    c.execute_command("CLUSTER", "BUMPEPOCH")
        try:
            wait_until(
                "every node to see the slot moved",
                lambda: all(_owner_of(node, slot) == port for node in cluster.nodes),
                5,
            )
            return
        except RuntimeError:
            if attempt == rounds:
                raise


def _owner_of(node: Any, slot: int) -> int:
    with node.client(socket_timeout=5) as c:
        for start, end, primary, *_ in c.execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(primary[1])
    raise LookupError(slot)


@contextlib.contextmanager
def _slot_moved_behind_the_clients_back(
    cluster: ClusterTopology, client: Any, name: str
) -> Iterator[tuple[int, int]]:
    keys = KeySpace().lock(name)
    lease = keys.lease
    slot = int(client.keyslot(lease))
    old = int(client.get_node_from_key(lease).port)
    new = next(int(n.port or 0) for n in cluster.nodes if n.port != old)
    _assign(cluster, slot, new)
    try:
        yield old, new
    finally:
        with redis.Redis(host="127.0.0.1", port=new, socket_timeout=5) as c:
            # Empty again, or the slot could not be given back.
            c.delete(keys.lease, keys.queue, keys.state)
        _assign(cluster, slot, old)


@pytest.mark.cluster
def test_cluster_script_follows_moved(cluster: ClusterTopology) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port or 0, socket_timeout=5)
    try:
        lock = Lock(client, "moving", ttl=10, wait=0)
        with _slot_moved_behind_the_clients_back(cluster, client, "moving") as (old, new):
            assert int(client.get_node_from_key(lock.keys.lease).port) == old  # stale map
            assert lock.acquire()
            with redis.Redis(host="127.0.0.1", port=new, socket_timeout=5) as c:
                assert c.hget(lock.keys.lease, "t") == lock.token.encode()  # type: ignore[union-attr]
            # The client was told: its next calls go straight to the new owner.
            assert int(client.get_node_from_key(lock.keys.lease).port) == new
            lock.release()
    finally:
        client.close()


@pytest.mark.cluster
async def test_async_cluster_script_follows_moved(cluster: ClusterTopology) -> None:
    port = cluster.nodes[0].port or 0
    client = AsyncRedisCluster(host="127.0.0.1", port=port, socket_timeout=5)
    sync = RedisCluster(host="127.0.0.1", port=port, socket_timeout=5)
    try:
        await client.initialize()
        lock = AsyncLock(client, "moving-async", ttl=10, wait=0)
        with _slot_moved_behind_the_clients_back(cluster, sync, "moving-async") as (old, new):
            assert int(client.get_node_from_key(lock.keys.lease).port) == old
            assert await lock.acquire()
            with redis.Redis(host="127.0.0.1", port=new, socket_timeout=5) as c:
                assert c.hget(lock.keys.lease, "t") == lock.token.encode()  # type: ignore[union-attr]
            await lock.release()
    finally:
        await client.aclose()
        sync.close()


def _lock_call(r: redis.Redis, script: scripts.Script, name: str, *args: Any) -> Any:
    keys = KeySpace().lock(name)
    return calls.run(r, script, (keys.lease, keys.queue, keys.state), args)


def _acquire_round(
    r: redis.Redis,
    name: str,
    token: str,
    wait_ms: int,
    round_: int,
    channel: str = "-",
    owner: str = "{}",
) -> Any:
    # A 30 s lease; by default a waiter without a wake-up channel ('-'): a
    # hand-off to it is heard.
    return _lock_call(
        r,
        scripts.ACQUIRE,
        name,
        token,
        30_000,
        "",
        owner,
        wait_ms,
        channel,
        30_000 + STATE_KEEP_MS,
        round_,
    )


def _queue_up(r: redis.Redis, name: str, token: str, wait_ms: int) -> Any:
    return _acquire_round(r, name, token, wait_ms, 1)


def test_commands_of_a_contended_hand_off(r: redis.Redis) -> None:
    """A queued acquire and a release that hands the lease on read the state
    once, write the lease over in place, and leave the TTLs of the state and
    the queue alone while its mark covers what they must outlive; a lease
    handed on carries its length and the mark, so that the next waiter and
    its release need no call for them (docs/internals.rst, Scripts): what
    every contended critical section pays."""
    name = "count-hand-off"
    a, b, c, d = "a" * 16, "b" * 16, "c" * 16, "d" * 16
    fence = _queue_up(r, name, a, 0)
    # The first waiter raises the TTLs (and sets the mark) with room for the next.
    assert isinstance(_queue_up(r, name, b, 60_000), int)
    keys = KeySpace().lock(name)
    assert r.pttl(keys.queue) > 60_000 + STATE_KEEP_MS - 5_000
    # Behind a lease granted uncontended: HMGET state, HMGET lease, TIME,
    # RPUSH of the whole entry, PTTL lease.
    assert _script_commands(r, lambda: _queue_up(r, name, c, 5_000)) == 5
    release = lambda: _lock_call(r, scripts.RELEASE, name, a, fence)  # noqa: E731
    # HMGET lease, HGET state, LPOP (the waiter's entry with it), TIME,
    # HSET state, HSET lease (and PEXPIREAT of the lease, uncounted).
    assert _script_commands(r, release) == 6
    assert r.hget(keys.lease, "t") == b.encode()
    assert set(r.hkeys(keys.lease)) == {b"t", b"f", b"o", b"x", b"q"}
    assert r.pttl(keys.state) > r.pttl(keys.lease) + STATE_KEEP_MS - 5
    # Behind a handed lease: its holder and end are the state's copy (`e`),
    # read with the state: HMGET state, TIME, RPUSH; no read of the lease.
    b_fence = r.hget(keys.lease, "f").decode()  # type: ignore[union-attr]
    end = r.hget(keys.lease, "x").decode()  # type: ignore[union-attr]
    assert r.hget(keys.state, "e") == f"{b}|{end}|{b_fence}".encode()
    left = _queue_up(r, name, d, 5_000)
    assert 29_000 < left <= 30_000
    assert _script_commands(r, lambda: _queue_up(r, name, "e" * 16, 5_000)) == 3
    # Its release reads the mark from the lease: no HGET of the state.
    assert _script_commands(r, lambda: _lock_call(r, scripts.RELEASE, name, b, b_fence)) == 5
    assert r.hget(keys.lease, "t") == c.encode()
    assert r.pttl(keys.state) > r.pttl(keys.lease) + STATE_KEEP_MS - 5


def _handed_on(r: redis.Redis, name: str) -> tuple[str, str, str, str]:
    """a holds uncontended, b queues, a releases: the lease is b's, and the
    state's `e` is its copy. Returns b's token, fence and end, and the key of
    the state."""
    plant_sentinel(r)
    a, b = "a" * 16, "b" * 16
    fence = _queue_up(r, name, a, 0)
    assert isinstance(_queue_up(r, name, b, 60_000), int)
    assert _lock_call(r, scripts.RELEASE, name, a, fence) == 1
    keys = KeySpace().lock(name)
    b_fence = r.hget(keys.lease, "f").decode()  # type: ignore[union-attr]
    end = r.hget(keys.lease, "x").decode()  # type: ignore[union-attr]
    assert r.hget(keys.state, "e") == f"{b}|{end}|{b_fence}".encode()
    assert r.hget(keys.state, "f") == b_fence.encode()
    return b, b_fence, end, keys.state


def test_the_states_copy_names_the_holder_only_of_the_last_lease_issued(r: redis.Redis) -> None:
    """The state's copy of a handed lease (`e`, docs/internals.rst "TTLs of a
    busy name") counts only while its fence is the state's last fence: a
    grant that leaves `e` as it was (an earlier version's) has the queued
    acquire read the lease, and learn its end from it."""
    name = "copy-stale"
    _handed_on(r, name)
    keys = KeySpace().lock(name)
    # An earlier version hands the lease to c: it writes the lease and `f`,
    # and leaves `e`.
    c, c_fence = "c" * 16, str(int(r.hget(keys.state, "f") or 0) + 1)  # type: ignore[arg-type]
    now_ms = int(r.time()[0]) * 1000
    r.hset(keys.lease, mapping={"t": c, "f": c_fence, "x": now_ms + 20_000})
    r.pexpire(keys.lease, 20_000)
    r.hset(keys.state, "f", c_fence)
    # HMGET state, TIME, HMGET lease, RPUSH: its fallback timer is c's end.
    assert _script_commands(r, lambda: _queue_up(r, name, "d" * 16, 5_000)) == 4
    left = _queue_up(r, name, "e" * 16, 5_000)
    assert 15_000 < left <= 20_000
    audit_keyspace(r)


def test_the_states_copy_is_read_again_from_the_lease_once_its_end_passed(
    r: redis.Redis,
) -> None:
    """A copy whose end has passed (the lease was extended since, or ran out)
    has the lease read; PTTL answers the timer when the lease's own end has
    passed too."""
    name = "copy-ended"
    b, b_fence, _end, state = _handed_on(r, name)
    keys = KeySpace().lock(name)
    past = int(r.time()[0]) * 1000 - 1_000
    r.hset(state, "e", f"{b}|{past}|{b_fence}")
    r.hset(keys.lease, "x", past)  # as after an extend: its end as granted has passed
    r.pexpire(keys.lease, 25_000)
    left = _queue_up(r, name, "d" * 16, 5_000)
    assert 20_000 < left <= 25_000
    # HMGET state, TIME, HMGET lease, RPUSH, PTTL lease.
    assert _script_commands(r, lambda: _queue_up(r, name, "e" * 16, 5_000)) == 5
    audit_keyspace(r)


def test_a_waiter_the_states_copy_names_finds_its_lease_in_the_lease(r: redis.Redis) -> None:
    """A waiter that missed its wake-up and asks again finds the lease its own
    (restarted for its TTL): the copy naming it is not taken for it, the
    lease is read."""
    name = "copy-own"
    b, b_fence, _end, _state = _handed_on(r, name)
    keys = KeySpace().lock(name)
    r.pexpire(keys.lease, 5_000)
    assert _acquire_round(r, name, b, 60_000, 2) == b_fence.encode()
    assert r.pttl(keys.lease) > 25_000
    # Its lease gone before the copy's end (an extend shortened it, and it ran
    # out): it is granted anew, never told it holds a lease that is not there.
    r.delete(keys.lease)
    fence = _acquire_round(r, name, b, 60_000, 3)
    assert int(fence) > int(b_fence)
    assert r.hget(keys.lease, "t") == b.encode()
    assert _lock_call(r, scripts.RELEASE, name, b, fence) == 1
    audit_keyspace(r)


def test_a_first_attempt_behind_a_handed_lease_queues_as_any_other(r: redis.Redis) -> None:
    """The queued acquire most waiters make (a first attempt, behind the holder
    the state's copy names, with a wait the state's mark covers) queues before
    the scripts' helpers are made (docs/internals.rst, Script cost). It writes
    the entry and answers the timer that the full path does, which a wait
    beyond the mark takes (and raises the mark)."""
    name = "queue-fast"
    b, _b_fence, end, state = _handed_on(r, name)
    keys = KeySpace().lock(name)
    mark = int(r.hget(state, "q") or 0)
    d, e = "d" * 16, "e" * 16
    left_d = _queue_up(r, name, d, 5_000)
    assert int(r.hget(state, "q") or 0) == mark  # covered: the mark stays
    beyond = mark - int(r.time()[0]) * 1000 - STATE_KEEP_MS + 60_000
    left_e = _queue_up(r, name, e, beyond)
    assert int(r.hget(state, "q") or 0) > mark  # the full path raised it
    elements = [x.decode() for x in r.lrange(keys.queue, 0, -1)]
    assert len(elements) == 2
    for element, token, wait in ((elements[0], d, 5_000), (elements[1], e, beyond)):
        tok, since, deadline, channel, ttl, round_, owner = element.split("|", 6)
        assert (tok, channel, ttl, round_, owner) == (token, "-", "30000", "1", "{}")
        assert int(deadline) - int(since) == wait
    # Both wait for b's end, as granted.
    now_ms = int(r.time()[0]) * 1000
    for left in (left_d, left_e):
        assert int(end) - now_ms - 1_000 <= left <= int(end) - now_ms + 1_000
    assert r.hget(keys.lease, "t") == b.encode()
    audit_keyspace(r)


def _queue_on(r: redis.Redis, name: str, token: str, channel: str, round_: int = 1) -> Any:
    # A waiter woken on a single server's channel ('p'), waiting 60 s.
    owner = f'{{"who":"{token[0]}"}}'
    return _acquire_round(r, name, token, 60_000, round_, f"p{channel}", owner)


def _published(listener: Any) -> bytes:
    """The next message on ``listener``'s channel (within 5 s)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        message = listener.get_message(timeout=0.5)
        if message is not None and message["type"] == "message":
            return message["data"]  # type: ignore[no-any-return]
    raise AssertionError("nothing was published")


def test_a_release_hands_the_lease_on_as_the_full_path_does(r: redis.Redis) -> None:
    """The hand-off most releases make (the oldest waiter a live first-come
    entry on a single server's channel, the state's mark covering the new
    lease) runs before the scripts' helpers are made (docs/internals.rst,
    Script cost), and does what hand_off() does after them: the lease written
    over for the waiter, with its end and the mark; the state's fence and its
    copy; "<token>:<fence>:<round>" on the waiter's channel. A mark that does
    not cover the lease leaves the entry it popped to hand_off(), which raises
    the mark; a waiter nobody hears has its lease taken back, and the next is
    served."""
    plant_sentinel(r)
    name = "hand-fast"
    keys = KeySpace().lock(name)
    channel = "redislock-test:hand-fast"
    listener = r.pubsub()
    listener.subscribe(channel)
    try:
        wait_until("the subscription", lambda: r.pubsub_numsub(channel)[0][1] == 1, 5)
        a, b, c, d = "a" * 16, "b" * 16, "c" * 16, "d" * 16
        fence = _queue_up(r, name, a, 0)
        assert isinstance(_queue_on(r, name, b, channel, round_=3), int)
        assert isinstance(_queue_on(r, name, c, channel), int)
        mark = r.hget(keys.state, "q")
        assert _lock_call(r, scripts.RELEASE, name, a, fence) == 1
        lease = r.hgetall(keys.lease)
        b_fence, end = lease[b"f"].decode(), lease[b"x"].decode()
        assert lease == {
            b"t": b.encode(),
            b"f": b_fence.encode(),
            b"o": b'{"who":"b"}',
            b"x": end.encode(),
            b"q": mark,
        }
        assert int(b_fence) > int(fence)
        assert r.hmget(keys.state, "f", "e", "q") == [
            b_fence.encode(),
            f"{b}|{end}|{b_fence}".encode(),
            mark,
        ]
        assert 29_000 < r.pttl(keys.lease) <= 30_000
        assert _published(listener) == f"{b}:{b_fence}:3".encode()
        assert [x.split(b"|")[0] for x in r.lrange(keys.queue, 0, -1)] == [c.encode()]

        # A mark that claims less than the new lease needs (lowered: it only
        # ever claims less than Redis holds): hand_off() takes the entry popped.
        r.hset(keys.state, "q", 1)
        r.hset(keys.lease, "q", 1)
        assert _lock_call(r, scripts.RELEASE, name, b, b_fence) == 1
        c_fence = r.hget(keys.lease, "f").decode()  # type: ignore[union-attr]
        assert r.hget(keys.lease, "t") == c.encode()
        raised = int(r.hget(keys.state, "q") or 0)
        assert raised > int(r.time()[0]) * 1000 + 30_000 + STATE_KEEP_MS - 1_000
        assert r.hget(keys.lease, "q") == str(raised).encode()
        assert _published(listener) == f"{c}:{c_fence}:1".encode()
        assert r.llen(keys.queue) == 0

        # A waiter on a channel nobody listens to (its process died), then one
        # that is heard: the first's lease is taken back, the second served.
        assert isinstance(_queue_on(r, name, d, "redislock-test:nobody"), int)
        e = "e" * 16
        assert isinstance(_queue_on(r, name, e, channel), int)
        assert _lock_call(r, scripts.RELEASE, name, c, c_fence) == 1
        e_fence = r.hget(keys.lease, "f").decode()  # type: ignore[union-attr]
        assert r.hget(keys.lease, "t") == e.encode()
        assert int(e_fence) > int(c_fence) + 1  # d's fence came between
        assert _published(listener) == f"{e}:{e_fence}:1".encode()
        assert _lock_call(r, scripts.RELEASE, name, e, e_fence) == 1
        assert r.exists(keys.lease) == 0
        audit_keyspace(r)
    finally:
        listener.close()


def test_a_hand_off_leaves_nothing_of_the_former_lease(r: redis.Redis) -> None:
    """A lease written over for the next waiter carries only what its grant
    wrote: a unique task's id (``j``) on the former lease goes with it."""
    name = "hand-off-fresh"
    a, b = "a" * 16, "b" * 16
    fence = _queue_up(r, name, a, 0)
    keys = KeySpace().lock(name)
    r.hset(keys.lease, "j", "task-1")
    assert isinstance(_queue_up(r, name, b, 60_000), int)
    assert _lock_call(r, scripts.RELEASE, name, a, fence) == 1
    assert r.hget(keys.lease, "t") == b.encode()
    assert r.hget(keys.lease, "j") is None


def test_a_ttl_set_outright_is_set_with_no_mark(r: redis.Redis) -> None:
    """The state's `q` says, while anyone is queued, until when the state and
    the queue last; an uncontended grant, which sets the state's TTL outright
    (maybe below that mark), runs only while `q` is unset, and the next
    waiter raises the TTLs again."""
    name = "mark-gone"
    a, b, c = "a" * 16, "b" * 16, "c" * 16
    keys = KeySpace().lock(name)
    fence = _queue_up(r, name, a, 0)
    assert isinstance(_queue_up(r, name, b, 120_000), int)
    assert int(r.hget(keys.state, "q") or 0) > 120_000
    assert _lock_call(r, scripts.CANCEL, name, b) == 0
    assert _lock_call(r, scripts.RELEASE, name, a, fence) == 1
    assert not r.hexists(keys.state, "q")
    # Nobody queued now: the next grant is the uncontended one, with a short lease.
    args = ("", "{}", 0, "-", 1_000 + STATE_KEEP_MS, 1)
    assert _lock_call(r, scripts.ACQUIRE, name, c, 1_000, *args)
    assert r.pttl(keys.state) <= 1_000 + STATE_KEEP_MS
    assert isinstance(_queue_up(r, name, a, 60_000), int)
    assert r.pttl(keys.state) > 60_000 + STATE_KEEP_MS - 5_000
    assert r.pttl(keys.queue) > 60_000 + STATE_KEEP_MS - 5_000
