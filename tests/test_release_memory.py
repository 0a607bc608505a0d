"""A release retried after its reply was lost, however busy the name was in between.

The first run of a release ran and its reply never came; the connection
broke and the client sent it again (invariant 14). Meanwhile the name may
have changed hands many times. The retry must still report a release, never
``LockLost`` and never ``lock_lost``, for every kind: locks (both orders),
semaphores, read-write locks and multi-name locks. And a lease that was
really lost must still be reported lost, however many were released around
it.

The end-to-end tests go through a proxy that swallows the release's reply;
while the holder waits for it, waiters on a direct connection take the name
in turn ``HANDOFFS`` times, then the proxy breaks the connection and the
library sends the release again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from django_redislock.core import (
    KeySpace,
    Lock,
    ReadWriteLock,
)
from django_redislock.core.drivers.rwlock import RELEASE as RW_RELEASE
from django_redislock.core.drivers.rwlock import clear_rw_lock
from django_redislock.core.drivers.semaphore import RELEASE as SEM_RELEASE
from django_redislock.core.drivers.semaphore import Semaphore, clear_semaphore
from django_redislock.core.engine import scripts
from django_redislock.core.engine.wakeup_message import NO_CHANNEL
from django_redislock.core.exceptions import LockLost
from django_redislock.core.io import calls
from tests.drive import Drive
from tests.faults.harness import ServerPool, bounded_client_for
from tests.helpers_oracles import audit_keyspace, plant_sentinel, wait_until

KS = KeySpace()
# More hand-offs than either former memory held (3 tokens for a lock, 64 for a
# semaphore or read-write lock) between the lost reply and the retry.
HANDOFFS = 80
WAITERS = 4
# LOST in lua/_prelude.lua: how many losses the memory holds.
LOST = 3


@pytest.fixture
def pool() -> Iterator[ServerPool]:
    with ServerPool() as servers:
        yield servers


class Relay:
    """``WAITERS`` handles queued on one name, which take it in turn (each
    release hands it to the next) until it has changed hands ``count`` times."""

    def __init__(self, make: Callable[[], Any], count: int = HANDOFFS) -> None:
        self.count = count
        self.turns = 0
        self.failures: list[str] = []
        self._mutex = threading.Lock()
        self.handles = [make() for _ in range(WAITERS)]
        self.threads = [threading.Thread(target=self._run, args=(h,)) for h in self.handles]

    def start(self, queue: bytes, client: redis.Redis) -> None:
        before = client.llen(queue)
        for thread in self.threads:
            thread.start()
        # Every waiter queued before the holder lets go: each release is a hand-off.
        wait_until(lambda: client.llen(queue) >= before + WAITERS, timeout=10)

    def _run(self, handle: Any) -> None:
        while True:
            with self._mutex:
                if self.turns >= self.count:
                    return
            if not handle.acquire():
                self.failures.append("acquire timed out")
                return
            with self._mutex:
                self.turns += 1
            handle.release()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(30)
            assert not thread.is_alive()
        assert self.failures == []
        assert self.turns >= self.count


# kind -> (holder on the proxied client, of the test's driver; waiter on the
# direct one; the name's queue key)
KINDS: dict[str, tuple[Callable[..., Any], Callable[..., Any], bytes]] = {
    "lock": (
        lambda d, c, **kw: d.Lock(c, "n", ttl=30, wait=0, **kw),
        lambda c: Lock(c, "n", ttl=30, wait=10),
        KS.lock("n").queue,
    ),
    "barging": (
        lambda d, c, **kw: d.Lock(c, "n", ttl=30, wait=0, fair=False, **kw),
        lambda c: Lock(c, "n", ttl=30, wait=10, fair=False),
        KS.lock("n").queue,
    ),
    "semaphore": (
        lambda d, c, **kw: d.Semaphore(c, "n", 1, ttl=30, wait=0, **kw),
        lambda c: Semaphore(c, "n", 1, ttl=30, wait=10),
        KS.semaphore("n").queue,
    ),
    "rw-read": (
        lambda d, c, **kw: d.ReadWriteLock(c, "n", "read", ttl=30, wait=0, **kw),
        lambda c: ReadWriteLock(c, "n", "write", ttl=30, wait=10),
        KS.rwlock("n").queue,
    ),
    "rw-write": (
        lambda d, c, **kw: d.ReadWriteLock(c, "n", "write", ttl=30, wait=0, **kw),
        lambda c: ReadWriteLock(c, "n", "write", ttl=30, wait=10),
        KS.rwlock("n").queue,
    ),
    # A multi-lock gives its names back last first: "n" before "a".
    "multi": (
        lambda d, c, **kw: d.MultiLock(c, ["a", "n"], ttl=30, wait=0, **kw),
        lambda c: Lock(c, "n", ttl=30, wait=10),
        KS.lock("n").queue,
    ),
}


class Breaker:
    """Swallows the reply of the next call through ``proxy``; once ``relay`` is
    done, breaks the connection that waits for it (the library then sends the
    call again, on a new one)."""

    def __init__(self, relay: Relay, proxy: Any) -> None:
        self.relay = relay
        self.proxy = proxy
        self.connections = proxy.connections_seen
        proxy.drop_replies = 1
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        # The first run of the release let the name go round the relay while
        # the holder still waits for its reply.
        self.relay.join()
        assert self.proxy.drop_replies == 0
        self.proxy.heal()
        self.proxy.reset()

    def join(self) -> None:
        self.thread.join(60)
        assert not self.thread.is_alive()
        self.relay.join()


class Losses:
    """Counts what a holder was told of losses: its observer and on_lost."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        outer = self

        from django_redislock.core.drivers.base import Observer

        class Told(Observer):
            def lost(self, lock: Any, reason: str) -> None:
                outer.reasons.append(reason)

        self.observer = Told()

    def options(self, kind: str) -> dict[str, Any]:
        options: dict[str, Any] = {"observer": self.observer}
        if kind != "semaphore":
            options["on_lost"] = lambda lock: self.reasons.append("on_lost")
        return options


@pytest.mark.parametrize("kind", list(KINDS))
async def test_release_retried_after_many_handoffs_is_a_release(
    drive: Drive, pool: ServerPool, kind: str
) -> None:
    server = pool.server()
    direct = server.admin()
    plant_sentinel(direct)
    proxy = pool.proxy(server)
    # A reply that never comes is waited for this long: the relay runs meanwhile.
    client = bounded_client_for(drive, proxy.url, timeout=20)
    make_holder, make_waiter, queue = KINDS[kind]
    losses = Losses()
    try:
        warm = make_holder(drive, client)
        assert await drive(warm.acquire())
        await drive(warm.release())  # scripts cached: the release below is one EVALSHA, one reply
        holder = make_holder(drive, client, **losses.options(kind))
        assert await drive(holder.acquire())
        relay = Relay(lambda: make_waiter(direct))
        await drive.blocking(relay.start, queue, direct)
        breaker = Breaker(relay, proxy)
        await drive(holder.release())  # no LockLost
        await drive.blocking(breaker.join)
        assert proxy.connections_seen > breaker.connections  # the retry, on a new connection
        assert losses.reasons == []
        audit_keyspace(direct)
    finally:
        await drive.close(client)


# -- what the memory answers, script by script ------------------------------------------------
@pytest.fixture
def r(r: redis.Redis) -> redis.Redis:
    plant_sentinel(r)  # audit_keyspace checks that nothing outside the prefix was touched
    return r


# Each kind: a handle that holds the name, and a force-release of one holder
# (a loss for it). The retry of a release is the release script run again
# with the arguments the handle sent.


def _clear_lock(r: redis.Redis, handle: Any) -> None:
    k = handle.keys
    assert calls.run(r, scripts.CLEAR, (k.lease, k.queue, k.state), (1000, handle.token)) == 1


SCRIPT_KINDS: dict[str, tuple[Callable[..., Any], scripts.Script, Callable[..., Any]]] = {
    "lock": (lambda c: Lock(c, "m", ttl=30, wait=0), scripts.RELEASE, _clear_lock),
    "barging": (
        lambda c: Lock(c, "m", ttl=30, wait=0, fair=False),
        scripts.RELEASE_BARGING,
        _clear_lock,
    ),
    "semaphore": (
        lambda c: Semaphore(c, "m", 1, ttl=30, wait=0),
        SEM_RELEASE,
        lambda c, h: clear_semaphore(c, KS, "m", h.token),
    ),
    "rw-read": (
        lambda c: ReadWriteLock(c, "m", "read", ttl=30, wait=0),
        RW_RELEASE,
        lambda c, h: clear_rw_lock(c, KS, "m", h.token),
    ),
    "rw-write": (
        lambda c: ReadWriteLock(c, "m", "write", ttl=30, wait=0),
        RW_RELEASE,
        lambda c, h: clear_rw_lock(c, KS, "m", h.token),
    ),
}


class Name:
    """One name of a kind, driven from the test."""

    def __init__(self, r: redis.Redis, kind: str) -> None:
        self.r = r
        self.make, self.script, self.clear = SCRIPT_KINDS[kind]

    def held(self) -> Any:
        handle = self.make(self.r)
        assert handle.acquire()
        return handle

    def released(self) -> tuple[Any, tuple]:
        """A handle that held the name and released it, and that release's arguments."""
        handle = self.held()
        args = handle._release_args(handle.token)
        handle.release()
        return handle, args

    def lost(self) -> None:
        """One grant of the name that ends in a loss (force-released), and is
        recorded: the next grant, if the kind records losses then, comes too."""
        handle = self.held()
        self.clear(self.r, handle)
        self.held().release()

    def retry(self, handle: Any, args: tuple) -> int:
        return int(calls.run(self.r, self.script, handle._key_tuple, args))


@pytest.mark.parametrize("kind", list(SCRIPT_KINDS))
def test_a_retry_is_a_release_after_any_number_of_releases(r: redis.Redis, kind: str) -> None:
    name = Name(r, kind)
    first, args = name.released()
    state = first.keys.state
    name.released()
    fields = set(r.hkeys(state))
    for _ in range(300):
        name.released()
    assert name.retry(first, args) == 1
    # Nothing is kept per release: the state is as large as after the second.
    assert set(r.hkeys(state)) == fields
    audit_keyspace(r)


@pytest.mark.parametrize("kind", list(SCRIPT_KINDS))
def test_a_loss_is_reported_whatever_was_released_around_it(r: redis.Redis, kind: str) -> None:
    name = Name(r, kind)
    for _ in range(5):
        name.released()
    victim = name.held()
    args = victim._release_args(victim.token)
    name.clear(r, victim)
    # Before anyone else took the name, and after many did.
    assert name.retry(victim, args) == 0
    for _ in range(100):
        name.released()
    assert name.retry(victim, args) == 0
    with pytest.raises(LockLost):
        victim.release()
    audit_keyspace(r)


def test_a_lease_that_ran_out_is_reported_lost(r: redis.Redis) -> None:
    # A lock's lease runs out with no script to see it: the next grant
    # records it, and until then the state's `e` does not name it.
    victim = Lock(r, "ran-out", ttl=0.05, wait=0)
    assert victim.acquire()
    args = victim._release_args(victim.token)
    wait_until(lambda: not r.exists(victim.keys.lease), timeout=5)
    assert calls.run(r, scripts.RELEASE, victim._key_tuple, args) == 0
    for _ in range(10):
        other = Lock(r, "ran-out", ttl=30, wait=0)
        assert other.acquire()
        other.release()
    assert calls.run(r, scripts.RELEASE, victim._key_tuple, args) == 0
    assert r.hget(victim.keys.state, "u") == str(victim.fence).encode()
    with pytest.raises(LockLost):
        victim.release()


def test_a_permit_that_ran_out_is_reported_lost(r: redis.Redis) -> None:
    victim = Semaphore(r, "ran-out", 1, ttl=0.05, wait=0)
    assert victim.acquire()
    args = victim._release_args(victim.token)
    k = victim.keys
    expiry = r.zscore(k.lease, victim.token)
    wait_until(lambda: int(r.time()[0]) * 1000 + int(r.time()[1]) // 1000 > expiry, timeout=5)
    for _ in range(10):
        other = Semaphore(r, "ran-out", 1, ttl=30, wait=0)
        assert other.acquire()  # the first one's purge drops the victim, as lost
        other.release()
    assert calls.run(r, SEM_RELEASE, victim._key_tuple, args) == 0


@pytest.mark.parametrize("kind", list(SCRIPT_KINDS))
def test_a_release_is_forgotten_only_after_more_losses_than_the_memory_holds(
    r: redis.Redis, kind: str
) -> None:
    # The bound the docs state (docs/internals.rst, "Repeatable release"): a
    # retry is told "lost" for a lease it released only once more than LOST
    # grants issued after it were lost before it ran.
    name = Name(r, kind)
    first, args = name.released()
    for _ in range(LOST):
        name.lost()
    assert name.retry(first, args) == 1
    name.lost()
    assert name.retry(first, args) == 0  # forgotten: reported lost, never the reverse
    later, later_args = name.released()
    assert name.retry(later, later_args) == 1
    audit_keyspace(r)


@pytest.mark.parametrize("kind", list(SCRIPT_KINDS))
def test_without_the_state_a_retry_is_reported_lost(r: redis.Redis, kind: str) -> None:
    name = Name(r, kind)
    first, args = name.released()
    r.delete(first.keys.state)  # expired (it outlives every lease by 10 s) or evicted
    assert name.retry(first, args) == 0
    name.released()  # a new state: it answers for its own grants only
    assert name.retry(first, args) == 0
    # A release that does not say its serial (a client from before serials)
    # is told "released" only for a lease it still holds.
    held = name.held()
    assert name.retry(held, (held.token, *name_args_without_serial(held))) == 1
    assert name.retry(held, (held.token, *name_args_without_serial(held))) == 0


def name_args_without_serial(handle: Any) -> tuple:
    return handle._release_args(handle.token)[1:-1]


def test_serials_increase_across_kinds_of_holder(r: redis.Redis) -> None:
    # A read-write lock's readers and writers draw serials from one sequence;
    # a writer's serial is its fence, so fences keep increasing.
    serials = []
    for mode in ("read", "write", "read", "read", "write"):
        handle = ReadWriteLock(r, "serials", mode, ttl=30, wait=0)  # type: ignore[arg-type]
        assert handle.acquire()
        serials.append(handle._serial)
        if mode == "write":
            assert handle.fence == handle._serial
        handle.release()
    assert serials == sorted(set(serials)) and None not in serials


def test_an_acquire_given_back_grants_nothing_after_releases(r: redis.Redis) -> None:
    # The give-back memory (`d`) holds given-back tokens only: releases in
    # between no longer push them out.
    lock = Lock(r, "late", ttl=30, wait=0)
    token = "0123456789abcdef"
    lock._round = 1
    args = lock._args_acquire(token, 30_000, "t", 0, NO_CHANNEL)
    assert calls.run(r, scripts.CANCEL, lock._key_tuple, (token,)) == 0
    for _ in range(10):
        other = Lock(r, "late", ttl=30, wait=0)
        assert other.acquire()
        other.release()
    assert calls.run(r, scripts.ACQUIRE, lock._key_tuple, args) == 0
    assert not r.exists(lock.keys.lease)
    audit_keyspace(r)


@pytest.mark.parametrize("kind", list(SCRIPT_KINDS))
def test_a_state_without_a_horizon_gets_one_at_the_next_grant(r: redis.Redis, kind: str) -> None:
    # A state written before the memory of losses (a rolling upgrade) has
    # no horizon: the next grant starts one, and its release is repeatable.
    name = Name(r, kind)
    old = name.held()
    r.hdel(old.keys.state, "h", "u")
    old.release()
    first, args = name.released()
    name.released()
    assert name.retry(first, args) == 1


@pytest.mark.parametrize("kind", ["semaphore", "rw-read"])
def test_a_holder_outlasting_more_losses_than_the_memory_holds_is_still_released(
    r: redis.Redis, kind: str
) -> None:
    """Many holders at once: grants issued after this holder's can be lost while it
    still holds, and raise the horizon past it. Its release's retry must still be a
    release (fails before this change: reported lost, a false LockLost)."""
    make = {
        "semaphore": lambda: Semaphore(r, "m", LOST + 3, ttl=30, wait=0),
        "rw-read": lambda: ReadWriteLock(r, "m", "read", ttl=30, wait=0),
    }[kind]
    clear = SCRIPT_KINDS[kind][2]
    script = SCRIPT_KINDS[kind][1]
    holder = make()
    assert holder.acquire()
    for _ in range(LOST + 2):  # each lost while the holder holds
        later = make()
        assert later.acquire()
        clear(r, later)
    args = holder._release_args(holder.token)
    holder.release()
    assert int(calls.run(r, script, holder._key_tuple, args)) == 1
    # Still only what a lost grant's retry must hear: lost.
    victim = make()
    assert victim.acquire()
    victim_args = victim._release_args(victim.token)
    clear(r, victim)
    assert int(calls.run(r, script, victim._key_tuple, victim_args)) == 0
    audit_keyspace(r)


@pytest.mark.parametrize("kind", ["semaphore", "rw-read"])
def test_a_release_whose_own_purge_passes_its_serial_is_still_released(
    r: redis.Redis, kind: str
) -> None:
    """The later grants ran out but nothing has purged them yet: the holder's own
    release drops them, as lost, and so raises the horizon past its serial. Its
    retry must still hear "released" (fails before this change: the release noted
    itself against the horizon it read before its purge)."""
    make = {
        "semaphore": lambda ttl: Semaphore(r, "m", LOST + 7, ttl=ttl, wait=0),
        "rw-read": lambda ttl: ReadWriteLock(r, "m", "read", ttl=ttl, wait=0),
    }[kind]
    script = SCRIPT_KINDS[kind][1]
    holder = make(30)
    assert holder.acquire()
    short = [make(0.2) for _ in range(LOST + 2)]
    for later in short:
        assert later.acquire()
    expiry = max(int(r.zscore(holder.keys.lease, h.token)) for h in short)

    def server_ms() -> int:
        seconds, micros = r.time()
        return int(seconds) * 1000 + int(micros) // 1000

    wait_until(lambda: server_ms() > expiry, timeout=5)
    args = holder._release_args(holder.token)
    assert int(calls.run(r, script, holder._key_tuple, args)) == 1
    assert int(calls.run(r, script, holder._key_tuple, args)) == 1
    audit_keyspace(r)


def test_the_memory_of_releases_below_the_horizon_stays_small(r: redis.Redis) -> None:
    """However many holders are released below the horizon at once, the state keeps
    a bounded number of them (the oldest are let go: their retries hear "lost",
    the safe answer), so a release never rewrites a growing field."""
    holders = [Semaphore(r, "m", 60, ttl=30, wait=0) for _ in range(40)]
    for holder in holders:
        assert holder.acquire()
    for _ in range(LOST + 2):
        later = Semaphore(r, "m", 60, ttl=30, wait=0)
        assert later.acquire()
        clear_semaphore(r, KS, "m", later.token)
    last = holders[-1]._release_args(holders[-1].token)
    for holder in holders:
        holder.release()
    g = r.hget(holders[0].keys.state, "g") or b""
    assert 0 < len(g.split()) <= 8
    # The newest are still answered released.
    assert int(calls.run(r, SEM_RELEASE, holders[-1]._key_tuple, last)) == 1
