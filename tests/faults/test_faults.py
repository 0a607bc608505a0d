"""The fault suite: each scenario with quick parameters, asserting its targets.

Seeds are printed (run with ``-s`` to see them, or read them in a failure's
captured output); ``REDISLOCK_FAULT_SEED=<seed>`` replays one.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import sys
import time
from typing import Any

import pytest
import redis

from . import scenarios
from .harness import ServerPool, bounded_async_client, bounded_client, make_rng
from .oracles import FreezeTiming, KeyspaceAudit, TokenLedger

pytestmark = pytest.mark.timeout(90)


# -- the harness itself can fail -----------------------------------------------------------
def test_proxy_faults_are_real(pool: ServerPool) -> None:
    """Each proxy switch does what it says (otherwise every scenario below is moot)."""
    server = pool.server()
    proxy = pool.proxy(server)
    client = bounded_client(proxy.url, timeout=0.3)
    assert client.ping()
    with proxy.fault(latency=0.2, direction="reply"):
        started = time.monotonic()
        client.ping()
        assert time.monotonic() - started >= 0.2
    with proxy.fault(blackhole=True), pytest.raises(redis.TimeoutError):
        client.ping()
    assert client.ping()  # a fresh connection, handshake done, before replies vanish
    with proxy.fault(drop_replies=True), pytest.raises(redis.TimeoutError):
        client.set("dropped", 1)
    assert server.admin().get("dropped") == b"1"  # the request did arrive
    with proxy.fault(split=1):
        assert client.echo(b"x" * 300) == b"x" * 300
    raw = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
    raw.sendall(b"PING\r\n")
    assert raw.recv(16) == b"+PONG\r\n"
    proxy.reset()
    with pytest.raises(OSError):
        raw.sendall(b"PING\r\n")
        if not raw.recv(16):
            raise ConnectionResetError
    raw.close()
    with proxy.fault(refuse=True), pytest.raises(redis.ConnectionError):
        bounded_client(proxy.url, timeout=0.3).ping()
    client.close()


def test_harness_clients_are_the_librarys(pool: ServerPool) -> None:
    """The scenarios' clients are built as the library builds its own from
    settings (same timeouts, same retry policy: a timeout is never retried), so
    the bounds they measure are the ones users get."""
    from django.test import override_settings

    from django_redislock import connection

    server = pool.server()
    caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": server.url}}
    keys = (
        "socket_timeout",
        "socket_connect_timeout",
        "retry",
        "retry_on_error",
        "decode_responses",
        "host",
        "port",
        "db",
    )

    async def async_kwargs() -> tuple[dict[str, Any], dict[str, Any]]:
        ours = bounded_async_client(server.url, timeout=0.7, connect_timeout=0.4)
        theirs = connection.get_async_client()
        try:
            return (
                dict(ours.connection_pool.connection_kwargs),
                dict(theirs.connection_pool.connection_kwargs),
            )
        finally:
            await ours.aclose()

    with override_settings(
        CACHES=caches, REDISLOCK={"SOCKET_TIMEOUT": 0.7, "CONNECT_TIMEOUT": 0.4}
    ):
        connection.reset()
        try:
            theirs = connection.get_client().connection_pool
            ours = bounded_client(server.url, timeout=0.7, connect_timeout=0.4).connection_pool
            assert ours.connection_class is theirs.connection_class
            for key in keys:
                assert _same(ours.connection_kwargs.get(key), theirs.connection_kwargs.get(key)), (
                    key
                )
            policy = ours.connection_kwargs["retry"]
            assert policy._retries == 1
            assert redis.TimeoutError not in policy._supported_errors
            ours_async, theirs_async = asyncio.run(async_kwargs())
            for key in keys:
                assert _same(ours_async.get(key), theirs_async.get(key)), key
        finally:
            connection.reset()


def _same(ours: Any, theirs: Any) -> bool:
    """Equal settings; a retry policy by what it does (redis-py 5.0's Retry
    has no equality of its own)."""
    if hasattr(ours, "_retries") and hasattr(theirs, "_retries"):
        return (type(ours), ours._retries, set(ours._supported_errors)) == (
            type(theirs),
            theirs._retries,
            set(theirs._supported_errors),
        )
    return bool(ours == theirs)


@pytest.mark.slow
def test_oracles_catch_overlap_without_the_lock(pool: ServerPool) -> None:
    """The same contending loop, unlocked: every oracle must see violations."""
    result = scenarios.contended_run(
        pool, seed=1, seconds=2, quota=10**9, use_lock=False, script_flush_every=None
    )
    assert result["occupancy"] > 0
    assert result["lost_updates"] > 0
    assert result["fence_order"] > 0


def test_token_ledger_tells_live_attempts_from_ended_ones() -> None:
    """The frozen-Redis oracle relies on it: a token is live until retired."""
    import multiprocessing

    ledger = TokenLedger(multiprocessing.get_context("spawn"), 2, ring=4)
    token = ledger.issue(1)
    assert ledger.parse(token) == (1, 1)
    assert ledger.died_at(token) is None
    ledger.retire(1, token)
    died = ledger.died_at(token.encode())
    assert died is not None and 0 < died <= time.monotonic()
    for _ in range(5):
        ledger.retire(1, ledger.issue(1))
    assert ledger.died_at(token) == 0.0  # ended long ago, entry reused
    assert ledger.died_at("f" * 32) is None and ledger.died_at(b"not a ledger token") is None


def test_keyspace_audit_catches_problems(pool: ServerPool) -> None:
    admin = pool.server().admin()
    audit = KeyspaceAudit()
    audit.plant(admin)
    assert audit.check(admin) == []
    admin.set("redislock:L:{0}:=x", 1)  # a library key without TTL
    admin.set("foreign:plain", "changed")
    problems = audit.check(admin)
    assert any("without TTL" in p for p in problems)
    assert any("foreign:plain" in p for p in problems)


# -- scenarios -------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_contended_acquisitions_quick_run(pool: ServerPool) -> None:
    """Processes contend for two locks for ~30 s (``REDISLOCK_CONTENDED_SECONDS``)
    while the script cache is flushed."""
    _, seed = make_rng("contended")
    seconds = float(os.environ.get("REDISLOCK_CONTENDED_SECONDS", "30"))
    result = scenarios.contended_run(pool, seed=seed, seconds=seconds, quota=10**9)
    print(f"[faults] contended: {result}")
    assert result["exit_codes"] == [0] * result["processes"]
    # Every process took locks, however fast the host let it: how many is a
    # measurement (python -m tests.faults.report), not a pass mark.
    assert all(n > 0 for n in result["per_process"]), result
    assert (result["occupancy"], result["lost_updates"], result["fence_order"]) == (0, 0, 0)
    assert result["errors"] == 0
    assert result["script_flushes"] > 10
    assert result["audit"] == []


def test_holder_sigkilled(pool: ServerPool, rng: random.Random) -> None:
    result = scenarios.holder_killed(pool, rng, repeats=3)
    # The waiter gets the lock when Redis expires the dead holder's lease,
    # give or take a wake-up: never later than the TTL, never hanging.
    for run in result["runs"]:
        assert run["free"] <= run["ttl"] + 0.5, run
    assert result["audit"] == []


def test_holder_paused_past_its_lease(pool: ServerPool, rng: random.Random) -> None:
    result = scenarios.holder_paused(pool, rng, repeats=3)
    assert result["attempted"] == result["rejected"] == 3
    assert result["new_lease_intact"] == 3  # the stale release did not free the new lease
    assert result["stale_release_lost"] == 3  # ... and told the stale holder LockLost
    assert result["stale_believed_held"] == 0  # its own clock had already told it
    assert result["audit"] == []


@pytest.mark.django_db(transaction=True)
def test_paused_holder_fence_rejected_by_fenced_update(
    pool: ServerPool, rng: random.Random
) -> None:
    """The fence of a holder paused past its lease, presented to ``fenced_update``
    after the new holder wrote, is refused and changes nothing."""
    fencing = pytest.importorskip("django_redislock.fencing")
    from tests.testapp.models import Product

    from .harness import Worker, wait_until

    server = pool.server()
    admin = server.admin()
    product = Product.objects.create(name="p", stock=10)
    qs = Product.objects.filter(pk=product.pk)
    worker = Worker(server.url)
    try:
        worker.send('{"op": "acquire", "name": "product", "ttl": 0.3}')
        old = worker.read()
        worker.stop()
        wait_until(lambda: not admin.exists(scenarios.KS.lock("product").lease), 5, "expiry")
        new = scenarios.Lock(bounded_client(server.url), "product", ttl=30)
        assert new.acquire()
        fencing.fenced_update(qs, new.fence, stock=9)
        worker.cont()
        with pytest.raises(fencing.StaleFence):
            fencing.fenced_update(qs, old["fence"], stock=0)
        assert Product.objects.get(pk=product.pk).stock == 9
        new.release()
    finally:
        worker.close()


def test_late_reply_counts_as_not_acquired(pool: ServerPool, rng: random.Random) -> None:
    result = scenarios.late_reply(pool, rng, repeats=2)
    assert result["not_acquired"] == result["tried"] == 4
    assert result["left_behind"] == 0
    assert result["audit"] == []


@pytest.mark.slow
def test_stalled_redis_calls_fail_within_bound(pool: ServerPool, rng: random.Random) -> None:
    result = scenarios.stalled(pool, rng)
    assert result["not_unavailable"] == {}
    assert result["hangs"] == 0, (result["longest"], result["promised"])
    assert result["audit"] == []


@pytest.mark.parametrize("persistence", [False, True], ids=["no-persistence", "aof-always"])
def test_redis_restarted(pool: ServerPool, persistence: bool) -> None:
    result = scenarios.restarted(pool, persistence=persistence)
    assert result["audit"] == []
    if persistence:
        assert result == {**result, "second_got_in": False, "extend": "ok", "release": "ok"}
    else:
        # The documented non-guarantee, shown: two holders at once ...
        assert result["second_got_in"] and result["first_believed_held"]
        # ... the old one learns of it, and the fence keeps it out of the data.
        assert result["extend"] == result["release"] == "LockLost"
        assert result["fence_increased"] and result["second_write"]
        assert result["first_stale_write"] is False
        assert result["second_intact"]


@pytest.mark.slow
@pytest.mark.parametrize("use_async", [False, True], ids=["Lock", "AsyncLock"])
def test_blackholed_renewal_flags_loss_before_expiry(
    pool: ServerPool, rng: random.Random, use_async: bool
) -> None:
    """The renewing holder reports the loss itself, while Redis still has the key:
    the holder can stop before anyone else can get in."""
    result = scenarios.renewal_blackholed(pool, rng, repeats=2, use_async=use_async)
    for run in result["runs"]:
        assert run["pttl_when_flagged"] > 0, run
        assert run["flagged_after"] <= run["pttl_at_cut"] / 1000, run
    assert result["audit"] == []


def test_flaky_connection(pool: ServerPool, rng: random.Random) -> None:
    result = scenarios.flaky_connection(pool, rng, repeats=2)
    assert result["split_ok"] == result["reset_ok"] == 2
    for kind in ("library", "retrying"):
        # A lost acquire reply: held, or told "unavailable" with nothing left behind.
        assert set(result[f"dropped_acquire_{kind}"]) <= {"acquired", "unavailable"}, result
        # A lost release reply: never a false LockLost (the lease is gone: checked
        # in the scenario). A client that sends it again is told "released":
        # the script remembers its own earlier release.
        assert "LockLost" not in result[f"dropped_release_{kind}"], result
    assert result["left_behind"] == 0
    assert result["audit"] == []


def test_script_flush_mid_run(pool: ServerPool) -> None:
    server = pool.server()
    admin = server.admin()
    client = bounded_client(server.url)
    for n in range(50):
        lock = scenarios.Lock(client, f"flush:{n % 3}", ttl=5)
        assert lock.acquire()
        admin.script_flush()
        lock.extend()
        admin.script_flush()
        lock.release()
    assert scenarios._audit(admin, foreign=False) == []


def test_eviction_policy_is_warned_about_and_bites(pool: ServerPool) -> None:
    result = scenarios.eviction(pool)
    assert result["noeviction"] is False
    assert result["allkeys-lru"] is True and result["volatile-ttl"] is True
    # Why: the lease (shortest TTL) is the first key volatile-ttl evicts.
    assert result["evicted_lease"]["second_got_in"]


def test_async_acquire_cancelled_at_every_await(pool: ServerPool) -> None:
    result = scenarios.async_cancellation(pool, limit=40)
    for case in ("free", "contended"):
        assert result[case]["leaked"] == 0, result[case]
        assert result[case]["stuck_at"] == [], result[case]
        assert result[case]["cancel_swallowed_at"] == [], result[case]
    assert result["free"]["completed"] == 1  # the sweep reached a completed acquire
    assert result["audit"] == []


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.skipif(sys.platform == "win32", reason="fork")
def test_fork_while_holding(pool: ServerPool) -> None:
    child = scenarios.fork_while_holding(pool)
    assert child == {
        "held": False,
        "owned": False,
        "release": "LockNotOwned",
        "extend": "LockNotOwned",
        "reacquire": False,
        "exit": 0,
        "parent_still_owns": True,
    }


def test_hostile_names(pool: ServerPool) -> None:
    result = scenarios.hostile_names(pool)
    assert result["problems"] == []
    assert result["refused"] == result["bad_arguments"]
    assert result["audit"] == []


@pytest.mark.slow
@pytest.mark.django_db
def test_redis_down_at_request_time(pool: ServerPool) -> None:
    """Decorator fails closed (503), middleware fails open (the view runs), both
    request paths, Redis frozen or dead: within the bound, never a 500."""
    result = scenarios.request_time(pool)
    statuses = result["statuses"]
    assert all(500 not in codes for codes in statuses.values()), statuses
    assert "503 without Retry-After" not in statuses
    expected = {
        "throttle-open": 200,
        "throttle-closed": 503,
        "/locked/": 503,
        "/locked-async/": 503,
        "/locked-open/": 200,
    }
    for how in ("stalled", "dead"):
        for what, status in expected.items():
            for path in ("sync", "async"):
                assert statuses[f"{how} {what} {path}"] == [status], (how, what, path)
    assert result["hangs"] == 0, result["took"]


@pytest.mark.timeout(150)
def test_redis_frozen_past_the_socket_timeout(pool: ServerPool, rng: random.Random) -> None:
    """Redis SIGSTOPped for 2 to 4 socket timeouts, five times, under contended
    locked work in four processes, with the library's own clients."""
    result = scenarios.frozen_redis(pool, rng, freezes=5, calm=1.0)
    print(f"[faults] frozen: {result}")
    assert result["exit_codes"] == [0] * result["processes"]
    # No double holder, no lost update, fences in order.
    assert (result["occupancy"], result["lost_updates"], result["fence_order"]) == (0, 0, 0)
    # No call outlived its bound: one socket timeout plus slack (plus the wait).
    for kind in FreezeTiming.KINDS:
        assert result[kind]["over_bound"] == 0, (kind, result[kind])
    # No lease granted to nobody once Redis is back, beyond a round trip and a margin.
    assert result["orphan_longest"] <= result["orphan_margin"], result["orphan_ages"]
    assert all(n > 0 for n in result["acquisitions_after_each"]), result
    assert result["audit"] == []


def test_permits_never_over_granted_nor_leaked(pool: ServerPool, rng: random.Random) -> None:
    result = scenarios.permits(pool, rng, threads=4, rounds=100)
    assert result["over_limit"] == 0
    assert result["leaked"] == 0
    assert result["killed_permit_back_after"] <= result["killed_permit_ttl"] + 0.5
    assert result["audit"] == []


def test_async_permit_cancelled_at_every_await(pool: ServerPool) -> None:
    result = scenarios.permit_cancellation(pool)
    assert result["leaked"] == 0, result
    assert result["audit"] == []
