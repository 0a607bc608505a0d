"""Semaphores at the edges: a retried release, a woken waiter that never claims,
and a TTL on every key whatever path wrote it."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from django_redislock import signals
from django_redislock.core.drivers.base import STATE_KEEP_MS
from django_redislock.core.drivers.semaphore import (
    ACQUIRE,
    CANCEL,
    RELEASE,
    Semaphore,
    clear_semaphore,
    release_permit,
)
from django_redislock.core.drivers.semaphore_async import AsyncSemaphore
from django_redislock.core.engine.keys import KeySpace
from django_redislock.core.io import calls
from django_redislock.signals import observer
from tests.drive import Drive
from tests.helpers_oracles import audit_keyspace, plant_sentinel, wait_until
from tests.servers import free_port

# These tests fork on purpose; the children touch nothing the parent's threads hold.
pytestmark = pytest.mark.filterwarnings("ignore:This process .* fork:DeprecationWarning")

ctx = multiprocessing.get_context("fork")
KS = KeySpace()


def keys(name: str) -> Any:
    return KS.semaphore(name)


def key_tuple(name: str) -> tuple[bytes, bytes, bytes]:
    k = keys(name)
    return (k.lease, k.queue, k.state)


@pytest.fixture(autouse=True)
def _sentinel(r: redis.Redis) -> None:
    plant_sentinel(r)  # audit_keyspace checks that nothing outside the prefix was touched


@pytest.fixture
def lost_signals() -> Iterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        seen.append(kwargs)

    signals.lock_lost.connect(receiver)
    yield seen
    signals.lock_lost.disconnect(receiver)


class QueuedWaiter:
    """A thread whose handle waits for a permit of ``name``, holds it until
    ``finish()``, then releases it (only the acquiring thread may)."""

    def __init__(self, r: redis.Redis, name: str) -> None:
        before = r.llen(keys(name).queue)
        self.sem = Semaphore(r, name, 1, wait=15)
        self.ok: bool | None = None
        self.got = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()
        wait_until(lambda: r.llen(keys(name).queue) > before)

    def _run(self) -> None:
        self.ok = self.sem.acquire()
        self.got.set()
        if self.ok:
            self._done.wait(15)
            self.sem.release()

    def finish(self) -> None:
        self._done.set()
        self._thread.join(15)
        assert not self._thread.is_alive()


# -- a retried release is a release (invariant 14) -----------------------------------------
async def test_release_script_run_twice_reports_released(drive: Drive, r: redis.Redis) -> None:
    # A release whose reply was lost runs again: the second run must not say
    # "not held" (LockLost) for a permit this token did give back.
    sem = drive.Semaphore(drive.client, "twice", 2, ttl=30, wait=0)
    assert await drive(sem.acquire())
    args = sem._release_args(sem.token)
    assert calls.run(r, RELEASE, key_tuple("twice"), args) == 1
    assert calls.run(r, RELEASE, key_tuple("twice"), args) == 1
    assert r.zcard(keys("twice").lease) == 0
    # Released by the driver, then the retry, as the client would send it again.
    again = drive.Semaphore(drive.client, "twice", 2, ttl=30, wait=0)
    assert await drive(again.acquire())
    token = again.token
    await drive(again.release())
    assert await drive(again._release_call(token)) == 1
    audit_keyspace(r)


def test_release_retried_after_the_permit_went_to_a_waiter(r: redis.Redis) -> None:
    holder = Semaphore(r, "handed", 1, ttl=60, wait=0)
    assert holder.acquire()
    waiter = QueuedWaiter(r, "handed")
    args = holder._release_args(holder.token)
    assert calls.run(r, RELEASE, key_tuple("handed"), args) == 1
    assert waiter.got.wait(10) and waiter.ok is True
    held_by = [waiter.sem.token.encode()]
    assert r.zrange(keys("handed").lease, 0, -1) == held_by
    # The retry finds the permit held by someone else: still ours was released.
    assert calls.run(r, RELEASE, key_tuple("handed"), args) == 1
    assert r.zrange(keys("handed").lease, 0, -1) == held_by
    waiter.finish()
    audit_keyspace(r)


def test_a_permit_lost_before_release_is_still_reported_lost(r: redis.Redis) -> None:
    # The memory of releases must not hide a real loss: a cleared permit (and
    # a token never granted) is not released by anyone.
    sem = Semaphore(r, "cleared", 1, ttl=30, wait=0)
    assert sem.acquire()
    token = sem.token
    assert clear_semaphore(r, KS, "cleared") == 1
    args = sem._release_args(token)
    assert calls.run(r, RELEASE, key_tuple("cleared"), args) == 0
    assert calls.run(r, RELEASE, key_tuple("cleared"), ("f" * 32, 2000, 1, 10000)) == 0


def test_memory_of_releases_does_not_grow_with_releases(r: redis.Redis) -> None:
    # The state remembers losses, not releases: a retry is recognised after
    # any number of releases, and releasing writes nothing to remember.
    sem = Semaphore(r, "many", 1, ttl=30, wait=0)
    assert sem.acquire()
    first, serial = sem.token, sem.serial
    assert first is not None and serial is not None
    sem.release()
    state = keys("many").state
    fields = set(r.hkeys(state))
    for _ in range(200):
        assert sem.acquire()
        sem.release()
    assert set(r.hkeys(state)) == fields == {b"n", b"l", b"i", b"h"}
    assert release_permit(r, KS, "many", first, serial) is True
    # Without its serial, a retry cannot be told from a loss: reported lost.
    assert release_permit(r, KS, "many", first) is False
    assert 0 < r.pttl(state) <= STATE_KEEP_MS + 30_000


def _retrying_client(url: str) -> redis.Redis:
    # As connection.py builds them: one retry on a broken connection, none on a timeout.
    return redis.Redis.from_url(
        url,
        socket_timeout=5,
        socket_connect_timeout=5,
        retry=Retry(
            ExponentialBackoff(cap=0.1, base=0.01), 1, supported_errors=(redis.ConnectionError,)
        ),
        retry_on_error=[redis.ConnectionError],
    )


@pytest.mark.parametrize("contended", [False, True], ids=["alone", "waiter"])
def test_lost_release_reply_retried_through_a_proxy_is_a_release(
    redis_factory: Any, contended: bool, lost_signals: list[dict[str, Any]]
) -> None:
    # The release runs on Redis, its reply never arrives and the connection
    # breaks: the client sends it again on a new connection. The handle must
    # report a release, not LockLost, and send no lock_lost signal; with a
    # waiter, the first run gave the permit straight to it.
    from tests.faults.proxy import FaultProxy

    server = redis_factory(port=free_port(), unix=False).start()
    direct = server.client(socket_timeout=5, socket_connect_timeout=5)
    plant_sentinel(direct)
    proxy = FaultProxy(("127.0.0.1", server.port))
    client = _retrying_client(proxy.url)
    try:
        warm = Semaphore(client, "warm", 1, ttl=5, wait=0)
        assert warm.acquire()
        warm.release()  # the release script is cached: the run below is EVALSHA
        holder = Semaphore(client, "proxied", 1, ttl=60, wait=0, observer=observer)
        assert holder.acquire()
        waiter = QueuedWaiter(direct, "proxied") if contended else None
        proxy.drop_replies = 1

        def break_after_drop() -> None:
            wait_until(lambda: proxy.drop_replies == 0, timeout=10)
            proxy.reset()

        breaker = threading.Thread(target=break_after_drop)
        breaker.start()
        connections = proxy.connections_seen
        holder.release()
        breaker.join(10)
        assert proxy.connections_seen > connections  # the retry, on a new connection
        assert not holder.lost and lost_signals == []
        if waiter is not None:
            assert waiter.got.wait(10) and waiter.ok is True
            waiter.finish()
        audit_keyspace(direct)
    finally:
        client.close()
        direct.close()
        proxy.close()


# -- a dead woken waiter costs the grace, not a TTL ---------------------------------------
GRACE = 0.5


def _woken_then_frozen(url: str, name: str) -> None:
    client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
    Semaphore(client, name, 1, ttl=60, wait=60, grace=GRACE).acquire()
    time.sleep(60)  # frozen, then killed, long before this


def _next_in_line(url: str, name: str, kind: str, out: Any) -> None:
    try:
        if kind == "sync":
            client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
            sem = Semaphore(client, name, 1, ttl=60, wait=15, grace=GRACE)
            ok = sem.acquire()
            out.send((ok, time.monotonic()))
            if ok:
                sem.release()
            return

        async def run() -> None:
            client = redis.asyncio.Redis.from_url(url, socket_timeout=10)
            asem = AsyncSemaphore(client, name, 1, ttl=60, wait=15, grace=GRACE)
            ok = await asem.acquire()
            out.send((ok, time.monotonic()))
            if ok:
                await asem.release()
            await client.aclose()

        asyncio.run(run())
    except BaseException as exc:
        out.send((repr(exc), time.monotonic()))


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_woken_waiter_that_never_claims_costs_the_grace(
    redis_server: Any, r: redis.Redis, kind: str
) -> None:
    # A holds a place first in line, B second; the holder's permit lasts 60 s.
    # A is frozen (its process still subscribed, so the wake-up is heard and
    # the permit reserved for it) and never claims. B must get the permit
    # about GRACE after the release, not when its timer from before (the
    # holder's expiry, 60 s) or its own wait (15 s) runs out.
    name = f"frozen-{kind}"
    k = keys(name)
    holder = Semaphore(r, name, 1, ttl=60, wait=0, grace=GRACE)
    assert holder.acquire()
    a = ctx.Process(target=_woken_then_frozen, args=(redis_server.url, name))
    a.start()
    parent_end, child_end = ctx.Pipe()
    b = None
    try:
        wait_until(lambda: r.llen(k.queue) == 1, timeout=10)
        (first,) = r.lrange(k.queue, 0, -1)
        assert b"|p" in r.hget(k.state, b"w:" + first)  # queued with its channel
        b = ctx.Process(target=_next_in_line, args=(redis_server.url, name, kind, child_end))
        b.start()
        wait_until(lambda: r.llen(k.queue) == 2, timeout=10)
        wait_until(lambda: b"|p" in r.hget(k.state, b"w:" + r.lindex(k.queue, 1)), timeout=10)
        os.kill(a.pid, signal.SIGSTOP)
        released_at = time.monotonic()
        holder.release()
        # The permit went to A as a reservation: A was heard.
        assert r.zrange(k.lease, 0, -1) == [first]
        assert parent_end.poll(20), "B never reported"
        ok, at = parent_end.recv()
        assert ok is True, ok
        assert at - released_at < GRACE + 1.0, at - released_at
        b.join(10)
        assert b.exitcode == 0
    finally:
        os.kill(a.pid, signal.SIGKILL)
        a.join(10)
        if b is not None and b.is_alive():
            os.kill(b.pid, signal.SIGKILL)
            b.join(10)
    audit_keyspace(r)


def test_next_in_line_is_told_of_a_reservation(r: redis.Redis) -> None:
    # At the release, the waiter behind the reserved one is woken to look
    # again: its next fallback timer is the reservation's expiry.
    holder = Semaphore(r, "told", 1, ttl=60, wait=0)
    assert holder.acquire()
    k = keys("told")
    pubsub = r.pubsub()
    try:
        pubsub.subscribe("ch-a", "ch-b")
        for _ in range(2):
            assert pubsub.get_message(timeout=5)["type"] == "subscribe"
        deadline = int(r.time()[0]) * 1000 + 30_000
        for token, channel in (("ta", "ch-a"), ("tb", "ch-b")):
            r.rpush(k.queue, token)
            r.hset(k.state, f"w:{token}", f"{deadline}|p{channel}")
        holder.release()
        heard = [pubsub.get_message(timeout=5) for _ in range(2)]
        assert [(m["channel"], m["data"]) for m in heard] == [
            (b"ch-a", b"ta"),
            (b"ch-b", b"tb"),
        ]
        assert r.hexists(k.state, "r:ta") and r.lrange(k.queue, 0, -1) == [b"tb"]
        # tb runs acquire again: its fallback timer is now ta's reservation.
        reply = calls.run(
            r,
            ACQUIRE,
            key_tuple("told"),
            ("tb", 60_000, b"told", "{}", 30_000, b"pch-b", 2000, STATE_KEEP_MS, 1),
        )
        assert reply[0] == 0 and 0 < reply[1] <= 2000
    finally:
        pubsub.close()


def test_dead_waiters_behind_a_reservation_leave_the_queue(r: redis.Redis) -> None:
    holder = Semaphore(r, "behind", 1, ttl=60, wait=0)
    assert holder.acquire()
    k = keys("behind")
    pubsub = r.pubsub()
    try:
        pubsub.subscribe("alive")
        assert pubsub.get_message(timeout=5)["type"] == "subscribe"
        now = int(r.time()[0]) * 1000
        for token, info in (
            ("first", f"{now + 30_000}|palive"),
            ("gone", f"{now + 30_000}|pnobody-listens"),
            ("late", f"{now - 1}|palive"),
            ("next", f"{now + 30_000}|palive"),
        ):
            r.rpush(k.queue, token)
            r.hset(k.state, f"w:{token}", info)
        r.pexpire(k.queue, 40_000)
        holder.release()
        assert r.lrange(k.queue, 0, -1) == [b"next"]
        assert not r.hexists(k.state, "w:gone") and not r.hexists(k.state, "w:late")
    finally:
        pubsub.close()
    audit_keyspace(r)


# -- every key keeps a TTL, in every path --------------------------------------------------
def server_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _acquire_args(token: str, wait_ms: int, channel: bytes, ttl_ms: int = 60_000) -> tuple:
    return (token, ttl_ms, b"audit", "{}", wait_ms, channel, 300, STATE_KEEP_MS, 1)


def test_every_path_leaves_every_key_with_a_ttl(r: redis.Redis) -> None:
    kt = key_tuple("audit")
    k = keys("audit")

    def run(script: Any, args: tuple) -> Any:
        reply = calls.run(r, script, kt, args)
        audit_keyspace(r)
        return reply

    granted, serial = run(ACQUIRE, _acquire_args("holder", 0, b"-"))
    assert granted == 1
    # A waiter queued without a wake-up channel, and one with a channel
    # nobody listens on.
    assert run(ACQUIRE, _acquire_args("deaf", 20_000, b"-"))[0] == 0
    assert run(ACQUIRE, _acquire_args("dead", 20_000, b"pnobody"))[0] == 0
    # Released: the channel-less waiter gets a reservation it cannot hear of.
    assert run(RELEASE, ("holder", 300, 1, STATE_KEEP_MS, serial)) == 1
    assert r.hexists(k.state, "r:deaf")
    # A late retry of that release.
    assert run(RELEASE, ("holder", 300, 1, STATE_KEEP_MS, serial)) == 1
    # The reservation runs out; the next script run drops it, and a newcomer
    # gets the permit; then a retry of that acquire.
    expiry = r.zscore(k.lease, "deaf")
    wait_until(lambda: server_ms(r) > expiry, timeout=5)
    granted, serial = run(ACQUIRE, _acquire_args("late", 0, b"-"))
    assert granted == 1
    assert run(ACQUIRE, _acquire_args("late", 0, b"-")) == [1, serial]  # its retry
    # The state is lost (evicted) under a live permit: the release still
    # releases, and writes no key without a TTL; its retry finds nothing to
    # tell a release from a loss by, and says lost.
    r.delete(k.state)
    assert run(RELEASE, ("late", 300, 1, STATE_KEEP_MS, serial)) == 1
    assert run(RELEASE, ("late", 300, 1, STATE_KEEP_MS, serial)) == 0
    # A release script from before the keep argument (a rolling upgrade).
    assert run(ACQUIRE, _acquire_args("old", 0, b"-"))[0] == 1
    r.delete(k.state)
    assert run(RELEASE, ("old", 300, 1)) == 1
    # Cancel, clear, and a waiter that gives up, each after a grant.
    assert run(ACQUIRE, _acquire_args("c", 0, b"-"))[0] == 1
    assert run(ACQUIRE, _acquire_args("w", 20_000, b"-"))[0] == 0
    assert run(CANCEL, ("w", 300, 1)) == 0
    assert run(CANCEL, ("c", 300, 1)) == 1
    assert run(ACQUIRE, _acquire_args("x", 0, b"-"))[0] == 1
    assert clear_semaphore(r, KS, "audit") == 1
    audit_keyspace(r)
