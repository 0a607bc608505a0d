"""The lock engine at its edges: a loss the handle knows of, a stale handoff,
a late acquire after its give-back, the state's TTL on every path.

Each test here failed on the engine before the protocol's decisions moved
into ``core/engine/protocol.py``; the commit that added them says how.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

from django_redislock.core import AsyncLock, KeySpace, Lock, LockLost, RedisUnavailable
from django_redislock.core.engine import scripts
from django_redislock.core.engine.wakeup_message import NO_CHANNEL
from django_redislock.core.io import calls, calls_async, wakeups_base
from django_redislock.core.io.wakeups import Notifier
from django_redislock.core.ops.force import clear
from tests.drive import Drive
from tests.helpers_oracles import audit_keyspace, plant_sentinel, wait_until


# -- a loss the handle knows of is a loss everywhere (invariant 11) -----------
async def test_a_lease_cleared_and_found_gone_by_renewal_is_no_longer_held(
    drive: Drive, r: redis.Redis
) -> None:
    lost = drive.event()
    lock = drive.Lock(
        drive.client, "renewed", ttl=0.6, wait=0, renew=True, on_lost=lambda _lock: lost.set()
    )
    assert await drive(lock.acquire())
    try:
        assert clear(r, KeySpace(), names=["renewed"]).released
        other = drive.Lock(drive.client, "renewed", ttl=30, wait=0)
        assert await drive(other.acquire())
        await lost.wait(5)  # else the renewal did not notice the loss
        # Until now `held` stayed True for the rest of the validity window.
        assert lock.lost
        assert not lock.held
        assert lock.remaining == 0
        await drive(other.release())
    finally:
        with pytest.raises(LockLost):
            await drive(lock.release())


async def test_a_lease_found_gone_by_extend_is_no_longer_held(drive: Drive, r: redis.Redis) -> None:
    lock = drive.Lock(drive.client, "extended", ttl=30, wait=0)
    assert await drive(lock.acquire())
    assert clear(r, KeySpace(), names=["extended"]).released
    with pytest.raises(LockLost):
        await drive(lock.extend())
    assert not lock.held
    assert lock.remaining == 0
    with pytest.raises(LockLost):
        await drive(lock.release())


class _Pause:
    """Pauses the waiter thread or task at one point of its wait loop, once."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.resume = threading.Event()
        self.armed = False

    def hold(self) -> None:
        if self.armed:
            self.armed = False
            self.reached.set()
            assert self.resume.wait(20), "the test never resumed the waiter"


@pytest.fixture
def pause(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Pause]:
    probe = _Pause()
    yield probe
    probe.resume.set()


def _pause_before_retry(monkeypatch: pytest.MonkeyPatch, probe: _Pause, who: str) -> None:
    """Pause ``who`` (a thread name) just before it sends an acquire script."""
    run = calls.run

    def paused_run(client: Any, script: Any, keys: Any, args: Any) -> Any:
        if script is scripts.ACQUIRE and threading.current_thread().name == who:
            probe.hold()
        return run(client, script, keys, args)

    monkeypatch.setattr(calls, "run", paused_run)


def _pause_after_wakeup(monkeypatch: pytest.MonkeyPatch, probe: _Pause, who: str) -> None:
    """Pause ``who`` just after its sleep ended, before it looks at why."""
    wait = Notifier.wait

    def paused_wait(self: Notifier, event: Any, timeout: float) -> Any:
        result = wait(self, event, timeout)
        if threading.current_thread().name == who:
            probe.hold()
        return result

    monkeypatch.setattr(Notifier, "wait", paused_wait)


@pytest.mark.parametrize("point", ["after wake-up", "before retry"])
def test_a_lease_handed_in_an_earlier_round_is_never_taken(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch, pause: _Pause, point: str
) -> None:
    # The holder renews a short lease, so the waiter's timer wakes it every
    # few hundred ms to look again. The waiter is paused at `point`; the
    # holder releases, which hands the lease to the paused waiter (its
    # message waits unread); the handed lease expires and another handle takes
    # the lock. Resumed, the waiter must not take the stale fence: before, its
    # next sleep returned it at once and acquire() said True while the other
    # handle held the lock.
    plant_sentinel(r)
    holder = Lock(r, "stale", ttl=0.3, wait=0, renew=True)
    assert holder.acquire()
    waiter = Lock(r, "stale", ttl=0.3, wait=2)
    (_pause_after_wakeup if point == "after wake-up" else _pause_before_retry)(
        monkeypatch, pause, "stale-waiter"
    )
    outcome: dict[str, Any] = {}

    def wait_for_it() -> None:
        try:
            got = waiter.acquire()
            outcome["got"] = got
            outcome["redis_says"] = r.hget(waiter.keys.lease, "t")
            outcome["token"] = waiter.token
            if got:
                outcome["other_held"] = third.held
                waiter.release()
        except BaseException as exc:  # reported by the assertions below
            outcome["error"] = exc

    # Holds past the waiter's whole wait: the waiter has no honest way in.
    third = Lock(r, "stale", ttl=20, wait=0)
    t = threading.Thread(target=wait_for_it, name="stale-waiter")
    t.start()
    try:
        wait_until(lambda: r.llen(holder.keys.queue) == 1, timeout=10)
        pause.armed = True
        assert pause.reached.wait(10), "the waiter never reached the pause point"
        # The waiter is still queued from its last attempt: the release hands
        # it the lease, and it does not hear of it yet.
        assert r.llen(holder.keys.queue) == 1
        holder.release()
        handed = r.hget(holder.keys.lease, "t")
        assert handed is not None and handed.decode() != holder.token
        wait_until(lambda: not r.exists(holder.keys.lease), timeout=5)
        assert third.acquire()
        pause.resume.set()
        t.join(15)
        assert not t.is_alive()
        assert "error" not in outcome, outcome.get("error")
        assert not outcome["got"], (
            "two holders: the waiter took a stale handoff while another handle held the lock"
        )
        assert outcome["redis_says"] == third.token.encode()
    finally:
        pause.resume.set()
        t.join(10)
        if third.token is not None:
            third.release()
    audit_keyspace(r)


@pytest.mark.parametrize("point", ["after wake-up", "before retry"])
async def test_an_async_waiter_never_takes_a_lease_handed_in_an_earlier_round(
    redis_server: Any, r: redis.Redis, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    client = redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=5)
    holder = Lock(r, "stale-a", ttl=0.3, wait=0, renew=True)
    assert holder.acquire()
    waiter = AsyncLock(client, "stale-a", ttl=0.3, wait=2)
    reached, resume = asyncio.Event(), asyncio.Event()
    armed = {"on": False}
    run_async = calls_async.run_async

    async def hold() -> None:
        if armed["on"]:
            armed["on"] = False
            reached.set()
            await asyncio.wait_for(resume.wait(), 20)

    async def paused_run(c: Any, script: Any, keys: Any, args: Any) -> Any:
        if script is scripts.ACQUIRE and c is client:
            await hold()
        return await run_async(c, script, keys, args)

    # The waiter's sleep on its wake-up event (AsyncWakeup.take).
    sleep = wakeups_base.wait_for

    async def paused_sleep(aw: Any, timeout: float, undo: Any = None) -> Any:
        # The waiter's sleep: whether it ended by its timer or a wake-up,
        # pause it right after, before it looks at why.
        try:
            return await sleep(aw, timeout, undo)
        finally:
            await hold()

    if point == "before retry":
        monkeypatch.setattr(calls_async, "run_async", paused_run)
    else:
        monkeypatch.setattr(wakeups_base, "wait_for", paused_sleep)
    third = Lock(r, "stale-a", ttl=20, wait=0)

    async def wait_for_it() -> tuple[bool, Any, Any]:
        got = await waiter.acquire()
        says = r.hget(waiter.keys.lease, "t")
        token = waiter.token
        if got:
            await waiter.release()
        return got, says, token

    task = asyncio.create_task(wait_for_it())
    try:
        deadline = time.monotonic() + 10
        while r.llen(holder.keys.queue) != 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.005)
        armed["on"] = True
        await asyncio.wait_for(reached.wait(), 10)
        holder.release()
        deadline = time.monotonic() + 5
        while r.exists(holder.keys.lease):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.005)
        assert third.acquire()
        resume.set()
        got, says, _token = await asyncio.wait_for(task, 15)
        assert not got, (
            "two holders: the task took a stale handoff while another handle held the lock"
        )
        assert says == third.token.encode()
    finally:
        resume.set()
        if not task.done():
            task.cancel()
        if third.token is not None:
            third.release()
        await client.aclose()


# -- a late acquire after its give-back grants nothing (invariant 13) ---------
def test_an_acquire_that_arrives_after_its_give_back_grants_nothing(r: redis.Redis) -> None:
    # A frozen Redis reads a timed-out acquire only once it resumes, and the
    # give-back sent on another connection may run first. The acquire must
    # then grant nothing, or the name stays blocked for a whole lease with
    # nobody holding it.
    plant_sentinel(r)
    lock = Lock(r, "late", ttl=30, wait=0)
    token = "0123456789abcdef"
    keys = lock._key_tuple
    assert calls.run(r, scripts.CANCEL, keys, (token,)) == 0
    lock._round = 1
    args = lock._args_acquire(token, 30_000, "t", 0, NO_CHANNEL)
    assert calls.run(r, scripts.ACQUIRE, keys, args) == 0
    assert not r.exists(lock.keys.lease)
    queued = lock._args_acquire(token, 30_000, "t", 5_000, NO_CHANNEL)
    holder = Lock(r, "late", ttl=30, wait=0)
    assert holder.acquire()
    assert calls.run(r, scripts.ACQUIRE, keys, queued) == 0
    assert r.llen(lock.keys.queue) == 0, "a given-back token joined the queue"
    holder.release()
    assert Lock(r, "late", ttl=1, wait=0).acquire()
    audit_keyspace(r)


# -- every key keeps a TTL, in every path (invariant 2) -----------------------
def test_a_lease_found_already_handed_keeps_its_state_alive(r: redis.Redis) -> None:
    # A waiter queued without a wake-up channel finds its lease at its next
    # attempt, which restarts the lease with the waiter's TTL. The state must
    # live at least as long, or a release after it expired re-created it
    # without a TTL.
    plant_sentinel(r)
    holder = Lock(r, "handed", ttl=5, wait=0)
    assert holder.acquire()
    waiter = Lock(r, "handed", ttl=60, wait=0)
    token = "fedcba9876543210"
    waiter._round = 1
    queued = waiter._args_acquire(token, 1_000, "t", 5_000, NO_CHANNEL)
    assert calls.run(r, scripts.ACQUIRE, waiter._key_tuple, queued) > 0  # busy, queued
    holder.release()  # handed to the waiter, which has no channel
    assert r.hget(holder.keys.lease, "t") == token.encode()
    waiter._round = 2
    again = waiter._args_acquire(token, 60_000, "t", 5_000, NO_CHANNEL)
    fence = calls.run(r, scripts.ACQUIRE, waiter._key_tuple, again)
    assert int(fence) > 0
    assert r.pttl(holder.keys.state) >= r.pttl(holder.keys.lease) > 30_000
    assert calls.run(r, scripts.RELEASE, waiter._key_tuple, (token,)) == 1
    audit_keyspace(r)


def test_a_waiter_queued_by_the_previous_version_is_still_handed_the_lease(
    r: redis.Redis,
) -> None:
    # During a rolling upgrade a waiter of the previous version may be queued
    # (its entry has no round): it is handed the lease with the message that
    # version understands, "<token>:<fence>".
    plant_sentinel(r)
    holder = Lock(r, "upgrade", ttl=5, wait=0)
    assert holder.acquire()
    token = "0011223344556677"
    channel = b"redislock:P:test-upgrade"
    pubsub = r.pubsub()
    pubsub.subscribe(channel)
    try:
        assert wait_until(lambda: pubsub.get_message(timeout=0.1) is not None, timeout=5)
        deadline = int(r.time()[0]) * 1000 + 60_000
        owner = '{"host":"h","pid":1,"thread":"t","label":"old"}'
        r.rpush(holder.keys.queue, token)
        r.hset(
            holder.keys.state,
            mapping={token: f"{deadline}|p{channel.decode()}|5000|{owner}", "q": "1"},
        )
        holder.release()
        message = wait_until(lambda: pubsub.get_message(timeout=0.1), timeout=5)
        assert message["type"] == "message"
        handed_token, _, fence = message["data"].decode().partition(":")
        assert handed_token == token and fence.isdigit()
        assert r.hget(holder.keys.lease, "t") == token.encode()
        assert r.hget(holder.keys.lease, "o") == owner.encode()
    finally:
        pubsub.close()
    assert calls.run(r, scripts.RELEASE, holder._key_tuple, (token,)) == 1
    audit_keyspace(r)


def test_an_extend_to_a_shorter_ttl_whose_reply_was_lost_shortens_what_counts_as_held(
    redis_factory: Any,
) -> None:
    # The extend ran (the lease now ends 1.5 s after it) but its reply was
    # lost. The handle used to keep counting its 30 s lease as held, so it
    # believed it held the lock long after Redis had let it go.
    from tests.faults.proxy import FaultProxy
    from tests.servers import free_port

    server = redis_factory(port=free_port(), unix=False).start()
    proxy = FaultProxy(("127.0.0.1", server.port))
    client = redis.Redis.from_url(proxy.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    direct = server.client(socket_timeout=5)
    try:
        lock = Lock(client, "shorter", ttl=30, wait=0)
        assert lock.acquire()
        lock.extend()  # the script is cached: the reply dropped next is the extend's own
        proxy.drop_replies = 1
        with pytest.raises(RedisUnavailable):
            lock.extend(1.5)
        proxy.heal()
        assert 0 < direct.pttl(lock.keys.lease) <= 1500  # it did run
        assert lock.remaining <= 1.5
        wait_until(lambda: not direct.exists(lock.keys.lease), timeout=5)
        assert not lock.held
    finally:
        client.close()
        direct.close()
        proxy.close()
