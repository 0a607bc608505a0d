"""Claims the README and docs/ make that no other test pins down.

Each test names the sentence it backs; when the text changes, change the test
with it (and the other way round).
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

from django_redislock import connection
from django_redislock.conf import DEFAULTS
from django_redislock.core.base import DEFAULT_GRACE, STATE_KEEP_MS
from django_redislock.core.exceptions import LockLost
from django_redislock.core.keys import KeySpace
from django_redislock.core.lock import Lock
from django_redislock.core.lock_async import AsyncLock
from django_redislock.core.semaphore import Semaphore
from tests.faults.harness import Worker, wait_until

README = (Path(__file__).resolve().parents[1] / "README.rst").read_text()
KS = KeySpace()


def test_state_hash_expires_ten_seconds_after_the_lease(r: redis.Redis) -> None:
    """README, Keys: "the state hash the lease plus 10 seconds"; guarantees:
    "after the state hash expired (10 seconds after the lease ...)"."""
    assert STATE_KEEP_MS == 10_000
    assert "the state hash the lease plus 10 seconds" in README
    lock = Lock(r, "state-keep", ttl=1, wait=0)
    assert lock.acquire()
    lease_ms, state_ms = r.pttl(lock.keys.lease), r.pttl(lock.keys.state)
    assert 0 < lease_ms <= 1000
    assert 10_000 < state_ms <= 11_000
    lock.extend(2)
    assert 11_000 < r.pttl(lock.keys.state) <= 12_000
    lock.release()


def test_the_librarys_clients_retry_a_broken_connection_once_never_a_timeout() -> None:
    """README, Settings: "one quick retry on a broken connection, never on a timeout"."""
    connection.reset()
    try:
        sync_policy = connection.get_client().connection_pool.connection_kwargs["retry"]

        async def async_policy() -> Any:
            return connection.get_async_client().connection_pool.connection_kwargs["retry"]

        for policy in (sync_policy, asyncio.run(async_policy())):
            assert policy._retries == 1
            assert redis.exceptions.ConnectionError in policy._supported_errors
            assert redis.exceptions.TimeoutError not in policy._supported_errors
    finally:
        connection.reset()


def test_settings_table_matches_the_defaults() -> None:
    """README, Settings: every key of the table, with the default it states."""
    section = README.split("\nSettings\n========\n", 1)[1].split("\nSystem checks\n", 1)[0]
    rows = re.findall(r"^``([A-Z_]+)``\s{2,}\S.*?\s{2,}(\S+)\s{2,}", section, re.MULTILINE)
    assert {key for key, _ in rows} == set(DEFAULTS)
    for key, shown in rows:
        text = shown.strip("`")
        value = ast.literal_eval(text)
        assert value == DEFAULTS[key], (key, shown, DEFAULTS[key])


def test_semaphore_grace_period_is_two_seconds() -> None:
    """README, semaphores: "reserved for the oldest live waiter for a short grace period (2 s)"."""
    assert DEFAULT_GRACE == 2.0
    assert "grace\n  period (2 s)" in README


def test_a_woken_semaphore_waiter_that_stops_costs_at_most_the_grace(
    redis_server: Any, r: redis.Redis
) -> None:
    """README, semaphores: a waiter "that dies or stops after being woken costs
    the next waiter at most the grace period"."""
    name = "grace-claim"
    queue = KS.semaphore(name).queue
    holder = Semaphore(r, name, 1, ttl=30, wait=0)
    assert holder.acquire()
    stopped = Worker(redis_server.url)
    got: dict[str, float] = {}
    try:
        stopped.send(json.dumps({"op": "permit", "name": name, "limit": 1, "ttl": 30, "wait": 30}))
        wait_until(lambda: r.llen(queue) == 1, 10, "the first waiter to queue")
        stopped.stop()  # woken later, it cannot claim: as if it died after the wake-up
        other = redis_server.client(socket_timeout=5)
        # Its wait ends well before the test does, whatever happens.
        nxt = Semaphore(other, name, 1, ttl=30, wait=DEFAULT_GRACE + 8)

        def second() -> None:
            try:
                if nxt.acquire():
                    got["at"] = time.monotonic()
                    nxt.release()
            finally:
                other.close()

        thread = threading.Thread(target=second, daemon=True)
        thread.start()
        wait_until(lambda: r.llen(queue) == 2, 10, "the second waiter to queue")
        released = time.monotonic()
        holder.release()
        thread.join(DEFAULT_GRACE + 20)
        assert not thread.is_alive()
        assert "at" in got, "the next waiter never got the permit"
        # The grace, plus a generous allowance for a loaded host.
        assert got["at"] - released <= DEFAULT_GRACE + 1.0, got["at"] - released
    finally:
        stopped.close()


def test_held_turns_false_at_once_when_a_loss_is_known(r: redis.Redis) -> None:
    """README, Renewal: a loss "marks the lock lost: ``held`` turns False and
    ``remaining`` 0 at once"; docs/reliability.rst: "``held`` turning False"."""
    lock = Lock(r, "held-claim", ttl=30, wait=0)
    assert lock.acquire()
    r.delete(lock.keys.lease)
    with pytest.raises(LockLost):
        lock.extend()
    assert lock.lost
    assert lock.held is False
    assert lock.remaining == 0


def test_held_turns_false_when_renewal_finds_the_lease_gone(r: redis.Redis) -> None:
    lost = threading.Event()
    lock = Lock(r, "held-renew-claim", ttl=0.6, wait=0, renew=True, on_lost=lambda _: lost.set())
    assert lock.acquire()
    r.delete(lock.keys.lease)
    assert lost.wait(5), "the renewal never reported the loss"
    assert lock.held is False and lock.remaining == 0
    with pytest.raises(LockLost):
        lock.release()


async def test_async_held_turns_false_at_once_when_a_loss_is_known(
    redis_server: Any, r: redis.Redis
) -> None:
    client = redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=5)
    try:
        lock = AsyncLock(client, "held-async-claim", ttl=30, wait=0)
        assert await lock.acquire()
        r.delete(lock.keys.lease)
        with pytest.raises(LockLost):
            await lock.extend()
        assert lock.held is False and lock.remaining == 0
    finally:
        await client.aclose()


def test_validity_ends_a_hundredth_of_the_ttl_and_2_ms_early(r: redis.Redis) -> None:
    """README, Implementation: "``held`` turns false at ``sent + ttl - ttl/100 - 2 ms``"."""
    lock = Lock(r, "validity-claim", ttl=2, wait=0)
    before = time.monotonic()
    assert lock.acquire()
    after = time.monotonic()
    # The end of validity, seen from now, lies between the two send-time bounds.
    end = time.monotonic() + lock.remaining
    assert before + 2 - 0.02 - 0.002 - 0.01 <= end <= after + 2 - 0.02 - 0.002 + 0.01
    assert "``sent + ttl - ttl/100 - 2 ms``" in README
    lock.release()


def test_a_repeated_semaphore_release_reports_success(r: redis.Redis) -> None:
    """README, semaphores: "``LockLost`` at release or refresh means the permit
    had expired or was force-released meanwhile": a release sent again after
    its reply was lost (a retrying client) must not report a false loss."""
    sem = Semaphore(r, "repeat-permit", 1, ttl=5, wait=0)
    assert sem.acquire()
    keys, token = sem._key_tuple, sem.token
    assert token is not None
    assert sem._release_call(token) == 1
    assert sem._release_call(token) == 1  # the same release, run again
    other = Semaphore(r, "repeat-permit", 1, ttl=5, wait=0)
    assert other.acquire()
    assert keys == other._key_tuple and other.owned()
    other.release()
