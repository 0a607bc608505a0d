"""The fault scenarios. Each returns the figures it measured, as a plain dict.

The test suite runs them with quick parameters and asserts the targets; the
report (``python -m tests.faults.report``) runs the same functions and writes
the figures into ``docs/reliability.rst``. Randomised timing comes from a
seeded RNG whose seed is printed, so any failure can be replayed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import multiprocessing
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.backoff
import redis.retry

from django_redislock.core.drivers.lock import Lock
from django_redislock.core.drivers.lock_async import AsyncLock
from django_redislock.core.engine.keys import KeySpace
from django_redislock.core.exceptions import (
    LockLost,
    LockNotOwned,
    RedisUnavailable,
)
from django_redislock.core.io import breaker

from .harness import (
    Bound,
    ServerPool,
    Worker,
    bounded_async_client,
    bounded_client,
    call_bound,
    wait_until,
)
from .oracles import FenceTable, FreezeTiming, KeyspaceAudit, SharedOracles, TokenLedger
from .worker import contend, contend_through_freeze

KS = KeySpace()
AUDIT = KeyspaceAudit()


def _audit(client: redis.Redis, **kwargs: Any) -> list[str]:
    return AUDIT.check(client, **kwargs)


def _queue_state(admin: redis.Redis, name: str) -> tuple[int, list[Any]]:
    """Queue length and the waiter fields left in the state hash of ``name``."""
    keys = KS.lock(name)
    # Waiter fields are named by their token (32 hex digits); the rest is bookkeeping.
    waiters = [f for f in admin.hkeys(keys.state) if len(f) == 32]
    return int(admin.llen(keys.queue)), waiters


def _fence_db() -> FenceTable:
    fd, path = tempfile.mkstemp(prefix="redislock-fence-", suffix=".sqlite3")
    os.close(fd)
    return FenceTable(path).create()


# -- 1. contended acquisitions across processes -----------------------------------
def contended_run(
    pool: ServerPool,
    *,
    seed: int,
    seconds: float,
    quota: int,
    processes: int = 4,
    names: int = 2,
    use_lock: bool = True,
    script_flush_every: float | None = 0.5,
) -> dict[str, Any]:
    """Processes contend for a few locks; the oracles count every overlap.

    While they run, the test process flushes Redis's script cache now and then,
    so EVALSHA keeps meeting NOSCRIPT and falling back to EVAL mid-run.
    """
    server = pool.server()
    admin = server.admin()
    AUDIT.plant(admin)
    ctx = multiprocessing.get_context("spawn")
    oracles = SharedOracles(ctx, names)
    stats = ctx.RawArray("q", processes * 3)
    lock_names = [f"contended:{i}" for i in range(names)]
    procs = [
        ctx.Process(
            target=contend,
            args=(
                server.url,
                lock_names,
                oracles,
                seed + n,
                seconds,
                quota // processes,
                5.0,
                use_lock,
                stats,
                n,
            ),
            daemon=True,
        )
        for n in range(processes)
    ]
    started = time.monotonic()
    for p in procs:
        p.start()
    flushes = 0
    try:
        while any(p.is_alive() for p in procs):
            if time.monotonic() - started > seconds + 60:
                raise AssertionError("contending processes did not finish")
            if script_flush_every:
                time.sleep(script_flush_every)
                admin.script_flush()
                flushes += 1
            else:
                time.sleep(0.1)
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
    elapsed = time.monotonic() - started
    result: dict[str, Any] = dict(oracles.summary())
    result.update(
        seconds=elapsed,
        rate=result["acquisitions"] / elapsed,
        busy=sum(stats[n * 3 + 1] for n in range(processes)),
        errors=sum(stats[n * 3 + 2] for n in range(processes)),
        per_process=[stats[n * 3] for n in range(processes)],
        processes=processes,
        locks=names,
        script_flushes=flushes,
        exit_codes=[p.exitcode for p in procs],
        audit=_audit(admin),
    )
    admin.close()
    return result


# -- 2. holder SIGKILLed -------------------------------------------------------------
def holder_killed(pool: ServerPool, rng: random.Random, repeats: int) -> dict[str, Any]:
    """A holder process is SIGKILLed mid-lease; a queued waiter gets the lock.

    Measures the time from the kill to the waiter's acquisition against the
    lease time Redis had left at the kill (the best any lock can do) and the TTL.
    """
    server = pool.server()
    admin = server.admin()
    AUDIT.plant(admin)
    client = bounded_client(server.url, timeout=1.0)
    runs = []
    for n in range(repeats):
        name = f"killed:{n}"
        ttl = rng.uniform(0.4, 1.2)
        worker = Worker(server.url)
        try:
            worker.send(json.dumps({"op": "acquire", "name": name, "ttl": ttl}))
            held = worker.read()
            assert held["ok"], held
            waiter = Lock(client, name, ttl=5, wait=ttl * 4 + 5)
            got: dict[str, Any] = {}
            ready = threading.Event()

            def wait_for_it(
                lock: Lock = waiter, out: dict[str, Any] = got, ready: threading.Event = ready
            ) -> None:
                ready.set()
                out["ok"] = lock.acquire()
                out["at"] = time.monotonic()
                if out["ok"]:
                    out["fence"] = lock.fence
                    lock.release()  # only the acquiring thread may

            thread = threading.Thread(target=wait_for_it, daemon=True)
            thread.start()
            ready.wait(5)
            queued = functools.partial(lambda nm: _queue_state(admin, nm)[0] >= 1, name)
            wait_until(queued, 5, "the waiter to queue")
            time.sleep(rng.uniform(0, ttl / 2))  # kill at a random point of the lease
            left = admin.pttl(KS.lock(name).lease) / 1000
            killed = time.monotonic()
            worker.kill()
            thread.join(ttl * 4 + 10)
            assert got.get("ok"), f"waiter did not get {name!r} after its holder died"
            free = got["at"] - killed
            assert got["fence"] > held["fence"]
            runs.append({"ttl": ttl, "left": left, "free": free, "late": free - left})
        finally:
            worker.close()
    client.close()
    return {
        "runs": runs,
        "max_late": max(r["late"] for r in runs),
        "max_free_over_ttl": max(r["free"] / r["ttl"] for r in runs),
        "audit": _audit(admin),
    }


# -- 3. holder paused past its lease, then writes with its fence ------------------
def holder_paused(pool: ServerPool, rng: random.Random, repeats: int) -> dict[str, Any]:
    """SIGSTOP the holder process past its lease; a new holder takes over and
    writes; the old one resumes and writes with its stale fence, then releases.

    The stale write must be rejected by ``UPDATE ... WHERE fence <= ?`` and the
    stale release must not delete the new holder's lease.
    """
    server = pool.server()
    admin = server.admin()
    AUDIT.plant(admin)
    client = bounded_client(server.url, timeout=1.0)
    table = _fence_db()
    attempted = rejected = release_lost = new_lease_intact = stale_held = 0
    try:
        for n in range(repeats):
            name = f"paused:{n}"
            ttl = rng.uniform(0.2, 0.6)
            worker = Worker(server.url)
            try:
                worker.send(json.dumps({"op": "acquire", "name": name, "ttl": ttl}))
                old = worker.read()
                assert old["ok"], old
                worker.stop()
                gone = functools.partial(lambda nm: not admin.exists(KS.lock(nm).lease), name)
                wait_until(gone, ttl * 3 + 2, "the paused holder's lease to expire")
                new = Lock(client, name, ttl=30, wait=0)
                assert new.acquire()
                assert new.fence is not None and new.fence > old["fence"]
                assert table.write(new.fence, f"new {n}")
                time.sleep(rng.uniform(0, 0.05))
                worker.cont()
                worker.send(json.dumps({"op": "write", "db": table.path, "value": f"stale {n}"}))
                stale = worker.read()
                attempted += 1
                rejected += not stale["ok"]
                stale_held += bool(stale["held"])
                worker.send(json.dumps({"op": "release"}))
                released = worker.read()
                release_lost += released.get("error") == "LockLost"
                token = admin.hget(KS.lock(name).lease, "t")
                new_lease_intact += token == (new.token or "").encode()
                assert new.owned()
                new.release()
                assert table.read() == (new.fence, f"new {n}")
            finally:
                worker.close()
    finally:
        client.close()
        os.unlink(table.path)
    return {
        "attempted": attempted,
        "rejected": rejected,
        "stale_release_lost": release_lost,
        "new_lease_intact": new_lease_intact,
        "stale_believed_held": stale_held,
        "audit": _audit(admin),
    }


# -- 4. a reply that arrives after the lease could have ended ------------------------
def late_reply(pool: ServerPool, rng: random.Random, repeats: int) -> dict[str, Any]:
    """The acquire's reply is delayed past the TTL: proxy latency, or Redis SIGSTOPped
    while the request is in flight. Either way: not acquired, nothing left behind."""
    server = pool.server()
    admin = server.admin()
    AUDIT.plant(admin)
    proxy = pool.proxy(server)
    client = bounded_client(proxy.url, timeout=3.0)
    direct = bounded_client(server.url, timeout=3.0)
    outcomes = {"latency": 0, "sigstop": 0}
    not_acquired = left_behind = 0
    for n in range(repeats):
        for how in outcomes:
            name = f"late:{how}:{n}"
            ttl = rng.uniform(0.15, 0.4)
            extra = rng.uniform(0.05, 0.3)
            if how == "latency":
                lock = Lock(client, name, ttl=ttl, wait=0)
                client.ping()
                with proxy.fault(latency=ttl + extra, direction="reply"):
                    ok = lock.acquire()
            else:
                lock = Lock(client, name, ttl=ttl, wait=0)
                client.ping()  # a pooled connection already open: the request goes out
                box: dict[str, bool] = {}
                with server.paused():
                    sent_before = proxy.requests_forwarded
                    thread = threading.Thread(
                        target=lambda lk=lock, b=box: b.update(ok=lk.acquire())
                    )
                    thread.start()
                    wait_until(
                        lambda s=sent_before: proxy.requests_forwarded > s,
                        10,
                        "the acquire to reach the frozen Redis",
                    )
                    time.sleep(ttl + extra)  # the fault: Redis frozen past the TTL
                thread.join(10)
                ok = box["ok"]
            outcomes[how] += 1
            not_acquired += not ok
            if ok:
                lock.release()
            # The late grant was handed back: the lock is free at once.
            left_behind += bool(admin.exists(KS.lock(name).lease))
            other = Lock(direct, name, ttl=1, wait=0)
            assert other.acquire(), f"{name!r} still taken after a late reply"
            other.release()
    client.close()
    direct.close()
    return {
        "tried": sum(outcomes.values()),
        "not_acquired": not_acquired,
        "left_behind": left_behind,
        "audit": _audit(admin),
    }


# -- 5. Redis stalled or blackholed: every call fails within its bound ---------------
def stalled(pool: ServerPool, rng: random.Random, *, timeout: float = 0.3) -> dict[str, Any]:
    """Every lock call against a SIGSTOPped Redis or a blackholed connection raises
    ``RedisUnavailable`` within the bound its timeouts promise, never hangs."""
    server = pool.server()
    admin = server.admin()
    proxy = pool.proxy(server)
    bound = Bound(call_bound(timeout))
    errors: dict[str, object] = {}
    for how in ("sigstop", "blackhole", "reset", "killed"):
        url = server.url if how in ("sigstop", "killed") else proxy.url
        client = bounded_client(url, timeout=timeout)
        held = Lock(client, f"stall:{how}", ttl=30)
        assert held.acquire()
        calls: dict[str, Callable[[], object]] = {
            "acquire": functools.partial(Lock(client, f"stall:{how}:other", ttl=5).acquire, 0),
            "acquire-wait": functools.partial(
                Lock(client, f"stall:{how}", ttl=5).acquire, rng.uniform(0.1, 0.5)
            ),
            "extend": held.extend,
            "owned": held.owned,
            "release": held.release,
        }
        if how == "sigstop":
            server.pause()
        elif how == "blackhole":
            proxy.blackhole = True
        elif how == "reset":
            proxy.refuse = True
            proxy.reset()
        else:
            server.kill()
        try:
            for label, call in calls.items():
                with bound.timed():
                    result: object
                    try:
                        result = call()
                    except RedisUnavailable:
                        result = "unavailable"
                key = f"{how}:{label}"
                if result != "unavailable":
                    errors[key] = result
        finally:
            if how == "sigstop":
                server.resume()
            elif how == "killed":
                server.start()
            proxy.heal()
        client.close()
    return {
        "calls": bound.calls,
        "longest": bound.longest,
        "promised": bound.promised,
        "hangs": bound.hangs,
        "not_unavailable": errors,
        "audit": _audit(admin, foreign=False),
    }


# -- 6. Redis killed and restarted, with and without persistence --------------------
def restarted(pool: ServerPool, *, persistence: bool) -> dict[str, Any]:
    """SIGKILL Redis under a held lease and start it again on the same port.

    Without persistence the lease is gone: a second holder gets in while the
    first still believes it holds (``held`` is True: a documented non-guarantee);
    the first learns ``LockLost`` at extend and at release, and its fenced write
    is rejected once the second holder has written. With ``appendfsync always``
    the lease survives the crash and the holder carries on.
    """
    server = pool.server(persistence=persistence)
    table = _fence_db()
    client = bounded_client(server.url, timeout=1.0)
    first = Lock(client, "restart", ttl=30, wait=0)
    assert first.acquire()
    assert first.fence is not None
    assert table.write(first.fence, "first")
    server.restart(kill=True)
    out: dict[str, Any] = {"persistence": persistence}
    second = Lock(client, "restart", ttl=30, wait=0)
    out["second_got_in"] = second.acquire()
    out["first_believed_held"] = first.held
    if out["second_got_in"]:
        assert second.fence is not None
        out["fence_increased"] = second.fence > first.fence
        out["second_write"] = table.write(second.fence, "second")
        # The stale holder writes again, after the new one: the fence refuses it.
        out["first_stale_write"] = table.write(first.fence, "first again")
    try:
        first.extend()
        out["extend"] = "ok"
    except LockLost:
        out["extend"] = "LockLost"
    try:
        first.release()
        out["release"] = "ok"
    except LockLost:
        out["release"] = "LockLost"
    if out["second_got_in"]:
        out["second_intact"] = second.owned()
        second.release()
    out["audit"] = _audit(server.admin(), foreign=False)
    client.close()
    os.unlink(table.path)
    return out


# -- 7. blackholed connection while a renewing holder holds -------------------------
def renewal_blackholed(
    pool: ServerPool, rng: random.Random, repeats: int, *, use_async: bool = False
) -> dict[str, Any]:
    """renew=True holder; its connection is blackholed. It must flag the loss
    (``on_lost``) by itself; we record how much of the lease Redis still had then."""
    server = pool.server()
    admin = server.admin()
    proxy = pool.proxy(server)
    runs = []
    missed = 0
    attempts = itertools.count()
    while len(runs) < repeats:
        name = f"renew:{next(attempts)}"
        ttl = rng.uniform(1.0, 2.0)
        seen: dict[str, float] = {}

        def on_lost(lock: Any, nm: str = name, s: dict[str, float] = seen) -> None:
            s["at"] = time.monotonic()
            s["pttl"] = admin.pttl(KS.lock(nm).lease)

        pause = rng.uniform(0, ttl)  # let a renewal or two happen first
        if use_async:
            start, pttl_at_cut = asyncio.run(
                _renew_async(proxy, admin, name, ttl, pause, on_lost, seen)
            )
        else:
            start, pttl_at_cut = _renew_sync(proxy, admin, name, ttl, pause, on_lost, seen)
        if pttl_at_cut <= 0:
            # No lease to cut: on a loaded host the acquire, or a renewal
            # before the cut, outlasted the 0.2 s socket timeout (the holder
            # rightly let the lease go, and reports that loss too). The cut
            # then tests nothing; another run, a bounded number of times.
            missed += 1
            assert missed <= 3, "no lease to cut (acquire or renewals timed out) in 4 runs"
            continue
        runs.append(
            {
                "ttl": ttl,
                "pttl_at_cut": pttl_at_cut,
                "flagged_after": seen["at"] - start,
                "pttl_when_flagged": seen["pttl"],
            }
        )
    return {
        "runs": runs,
        "missed": missed,
        # > 0: the holder knew before Redis expired the key; -2: it learnt after.
        "flagged_before_expiry": sum(r["pttl_when_flagged"] > 0 for r in runs),
        "audit": _audit(admin, foreign=False),
    }


def _renew_sync(
    proxy: Any,
    admin: redis.Redis,
    name: str,
    ttl: float,
    pause: float,
    on_lost: Any,
    seen: dict[str, float],
) -> tuple[float, int]:
    flagged = threading.Event()
    client = bounded_client(proxy.url, timeout=0.2)

    def report(lock: Any) -> None:
        on_lost(lock)
        flagged.set()

    lock = Lock(client, name, ttl=ttl, renew=True, on_lost=report)
    try:
        assert lock.acquire()
    except RedisUnavailable:
        client.close()
        return time.monotonic(), -2  # no lease to cut (see renewal_blackholed)
    time.sleep(pause)
    start = time.monotonic()
    proxy.blackhole = True
    # A holder that already knows its lease lost has none to cut (see above).
    pttl_at_cut = -2 if lock.lost else int(admin.pttl(KS.lock(name).lease))
    try:
        assert flagged.wait(ttl * 2 + 5), "the renewing holder never reported its loss"
    finally:
        proxy.heal()
        proxy.reset()
    with contextlib.suppress(LockLost, RedisUnavailable):
        lock.release()
    client.close()
    return start, pttl_at_cut


async def _renew_async(
    proxy: Any,
    admin: redis.Redis,
    name: str,
    ttl: float,
    pause: float,
    on_lost: Any,
    seen: dict[str, float],
) -> tuple[float, int]:
    flagged = asyncio.Event()
    client = bounded_async_client(proxy.url, timeout=0.2)

    def report(lock: Any) -> None:
        on_lost(lock)
        flagged.set()

    lock = AsyncLock(client, name, ttl=ttl, renew=True, on_lost=report)
    try:
        assert await lock.acquire()
    except RedisUnavailable:
        await client.aclose()
        return time.monotonic(), -2  # no lease to cut (see renewal_blackholed)
    await asyncio.sleep(pause)
    start = time.monotonic()
    proxy.blackhole = True
    # A holder that already knows its lease lost has none to cut (see above).
    pttl_at_cut = -2 if lock.lost else int(admin.pttl(KS.lock(name).lease))
    try:
        await asyncio.wait_for(flagged.wait(), ttl * 2 + 5)
    finally:
        proxy.heal()
        proxy.reset()
    with contextlib.suppress(LockLost, RedisUnavailable):
        await lock.release()
    await client.aclose()
    return start, pttl_at_cut


# -- 8. the connection misbehaves but Redis is fine -----------------------------------
def _retrying_client(url: str) -> redis.Redis:
    """A client that retries timeouts too, as redis-py's default policy does (and
    a caller's own client may): a lost reply makes it send the script again."""
    return redis.Redis.from_url(
        url,
        socket_timeout=0.5,
        socket_connect_timeout=0.5,
        retry=redis.retry.Retry(redis.backoff.ExponentialBackoff(cap=0.1, base=0.01), 1),
        retry_on_error=[redis.exceptions.ConnectionError, redis.exceptions.TimeoutError],
    )


def flaky_connection(pool: ServerPool, rng: random.Random, repeats: int) -> dict[str, Any]:
    """Frames split into tiny chunks, connections reset, a reply dropped.

    A dropped reply is tried with the library's own client (which does not
    retry a timeout) and with a client that does. Either way the caller is
    told the truth: an acquire either holds or leaves nothing behind, and a
    release whose reply was lost never reports a false ``LockLost``.

    A dropped reply is a timeout, which opens its pool's breaker for a
    window (tests/test_breaker.py): here the breaker is off, so that what
    each call tells its caller is checked one call right after another.
    """
    previous = breaker.set_window(0)
    try:
        return _flaky_connection(pool, rng, repeats)
    finally:
        breaker.set_window(previous)


def _flaky_connection(pool: ServerPool, rng: random.Random, repeats: int) -> dict[str, Any]:
    server = pool.server()
    admin = server.admin()
    AUDIT.plant(admin)
    proxy = pool.proxy(server)
    clients = {
        "library": bounded_client(proxy.url, timeout=0.5),
        "retrying": _retrying_client(proxy.url),
    }
    client = clients["library"]
    out: dict[str, Any] = {"split_ok": 0, "reset_ok": 0}
    for kind in clients:
        out[f"dropped_acquire_{kind}"] = []
        out[f"dropped_release_{kind}"] = []
    out["left_behind"] = 0
    # The scripts loaded first, whole: what is split below is the frames of
    # script calls and their replies. A first call's script source (40 KB),
    # forwarded a byte at a time, tested only the proxy's pace, which on a
    # loaded host outlasted the 0.5 s socket timeout.
    warm = Lock(client, "split:warm", ttl=5)
    assert warm.acquire()
    warm.extend()
    warm.release()
    for n in range(repeats):
        with proxy.fault(split=rng.choice([1, 2, 3, 7])):
            lock = Lock(client, f"split:{n}", ttl=5)
            assert lock.acquire() and lock.owned()
            lock.extend()
            lock.release()
            out["split_ok"] += 1
        lock = Lock(client, f"reset:{n}", ttl=5)
        assert lock.acquire()
        proxy.reset()  # the pooled connection dies under the holder
        lock.extend()  # one retry on a new connection
        lock.release()
        out["reset_ok"] += 1
        for kind, dropping in clients.items():
            # The acquire ran but its reply was lost.
            name = f"drop-acquire:{kind}:{n}"
            lock = Lock(dropping, name, ttl=5, wait=0)
            proxy.drop_replies = 1
            try:
                outcome = "acquired" if lock.acquire() else "busy"
            except RedisUnavailable:
                outcome = "unavailable"
            proxy.heal()
            if outcome == "acquired":
                assert lock.owned()
                lock.release()
            else:
                # Not acquired: nothing may be left granted to nobody, once the
                # give-back (off the caller's path) had a round trip or two.
                lease = KS.lock(name).lease
                try:
                    wait_until(lambda lease=lease: not admin.exists(lease), 1.0, "the give-back")
                except AssertionError:
                    out["left_behind"] += 1
            out[f"dropped_acquire_{kind}"].append(outcome)
            # The release ran but its reply was lost.
            name = f"drop-release:{kind}:{n}"
            lock = Lock(dropping, name, ttl=5, wait=0)
            assert lock.acquire()
            proxy.drop_replies = 1
            try:
                lock.release()
                outcome = "released"
            except LockLost:
                outcome = "LockLost"
            except RedisUnavailable:
                outcome = "unavailable"
            proxy.heal()
            out[f"dropped_release_{kind}"].append(outcome)
            lease = KS.lock(name).lease
            wait_until(lambda lease=lease: not admin.exists(lease), 1.0, "the release")
    for c in clients.values():
        c.close()
    out["audit"] = _audit(admin)
    return out


# -- 9. cancellation of an async acquire at every await ------------------------------
async def _cancel_points(
    url: str, admin: redis.Redis, contended: bool, limit: int
) -> dict[str, Any]:
    """Cancel an acquire after 0, 1, 2, ... event-loop iterations.

    Uncontended, up to the first k at which it completes; contended (another
    process holds the lock, so the acquire queues and waits), up to ``limit``.
    After each, no lease of ours and no queue entry may be left.
    """
    client = bounded_async_client(url, timeout=2)
    name = f"cancel:{'contended' if contended else 'free'}"
    holder = Lock(bounded_client(url), name, ttl=60)
    if contended:
        assert holder.acquire()
    tried = leaked = completed = 0
    swallowed: list[int] = []
    stuck: list[int] = []
    stacks: list[str] = []
    try:
        for k in range(limit):
            lock = AsyncLock(client, name, ttl=30, wait=10 if contended else 0)
            got = asyncio.Event()

            async def attempt(lk: AsyncLock = lock, flag: asyncio.Event = got, k: int = k) -> None:
                if await lk.acquire():
                    me = asyncio.current_task()
                    if me is not None and getattr(me, "cancelling", lambda: 0)():
                        # The cancel was swallowed below the lock (asyncio.wait_for
                        # on Python 3.11, inside redis-py's send): acquire returned
                        # normally. Not a leak, but the caller was not cancelled.
                        swallowed.append(k)
                        flag.set()
                        await lk.release()
                        return
                    flag.set()
                    try:
                        await asyncio.Event().wait()  # hold until cancelled
                    finally:
                        await lk.release()

            task = asyncio.ensure_future(attempt())
            for _ in range(k):
                await asyncio.sleep(0)
            acquired_before_cancel = got.is_set()
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=5)
            if not done:
                # The cancellation was lost somewhere: report it, then end the task.
                stuck.append(k)
                import io

                buf = io.StringIO()
                task.print_stack(file=buf)
                stacks.append(buf.getvalue())
                task.cancel()
                await asyncio.wait([task], timeout=5)
            with contextlib.suppress(asyncio.CancelledError):
                await task
            tried += 1
            completed += acquired_before_cancel
            lease = admin.hget(KS.lock(name).lease, "t")
            queue, waiters = _queue_state(admin, name)
            expected = holder.token.encode() if contended and holder.token else None
            if lease != expected or queue or waiters:
                leaked += 1
            if acquired_before_cancel:
                break  # every await of the acquire has been tried
    finally:
        if contended:
            holder.release()
        await client.aclose()
    return {
        "tried": tried,
        "leaked": leaked,
        "completed": completed,
        "cancel_swallowed_at": swallowed,
        "stuck_at": stuck,
        "stacks": stacks,
    }


def async_cancellation(pool: ServerPool, *, limit: int = 60) -> dict[str, Any]:
    server = pool.server()
    admin = server.admin()
    AUDIT.plant(admin)
    free = asyncio.run(_cancel_points(server.url, admin, False, limit))
    busy = asyncio.run(_cancel_points(server.url, admin, True, limit))
    return {"free": free, "contended": busy, "audit": _audit(admin)}


# -- 10. fork while holding ---------------------------------------------------------------
def fork_while_holding(pool: ServerPool) -> dict[str, Any]:
    """A forked child inherits the handle, not the lease: it can neither release
    nor extend it, and the parent keeps it."""
    server = pool.server()
    client = bounded_client(server.url)
    lock = Lock(client, "fork", ttl=30)
    assert lock.acquire()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report and leave without running any cleanup
        status = 1
        try:
            seen: dict[str, Any] = {"held": lock.held, "owned": lock.owned()}
            for action in ("release", "extend"):
                try:
                    getattr(lock, action)()
                    seen[action] = "ok"
                except LockNotOwned as exc:
                    seen[action] = type(exc).__name__
            seen["reacquire"] = lock.acquire(wait=0)
            os.write(write_fd, json.dumps(seen).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read_fd) as f:
        child = json.loads(f.read() or "{}")
    child["exit"] = os.waitstatus_to_exitcode(status)
    child["parent_still_owns"] = lock.owned()
    lock.release()
    client.close()
    return child


# -- 11. eviction ----------------------------------------------------------------------------
def eviction(pool: ServerPool) -> dict[str, Any]:
    """A maxmemory policy other than noeviction is warned about; and shown to bite:
    with volatile-ttl the lease (short TTL) is the first key Redis evicts."""
    from django_redislock import connection

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("django_redislock.connection")
    handler = Keep(logging.WARNING)
    logger.addHandler(handler)
    out: dict[str, Any] = {}
    try:
        for policy in ("noeviction", "allkeys-lru", "volatile-ttl"):
            server = pool.server(extra=("--maxmemory-policy", policy))
            client = bounded_client(server.url)
            records.clear()
            connection._warn_eviction(client)
            out[policy] = any(policy in r.getMessage() for r in records)
            if policy == "volatile-ttl":
                out["evicted_lease"] = _evict_lease(server.admin(), client)
            client.close()
    finally:
        logger.removeHandler(handler)
    return out


def _evict_lease(admin: redis.Redis, client: redis.Redis) -> dict[str, Any]:
    lock = Lock(client, "evict", ttl=60, wait=0)
    assert lock.acquire()
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory", used + 256 * 1024)
    filler = b"x" * 1024
    writes = 0
    while admin.exists(KS.lock("evict").lease) and writes < 20000:
        admin.set(f"filler:{writes}", filler, ex=3600)
        writes += 1
    admin.config_set("maxmemory", 0)
    second = Lock(client, "evict", ttl=60, wait=0)
    got_in = second.acquire()
    result = {"writes": writes, "second_got_in": got_in, "first_believed_held": lock.held}
    if got_in:
        second.release()
    with contextlib.suppress(LockLost):
        lock.release()
    return result


# -- 12. hostile names and bad arguments -------------------------------------------------------
HOSTILE_NAMES = [
    "*",
    "?",
    "[a-z]",
    "\\",
    "{",
    "}",
    "{}",
    "{tag}",
    "}{",
    "a{b}c",
    "redislock:L:{0000000000000000}:=x",
    ":",
    "::",
    " ",
    "\t",
    "\n",
    "\r\n",
    "\x00",
    "a\x00b",
    "\ud800",
    "\udfff",
    "é",
    "e\u0301",
    "\u202e",
    "🔒",
    "ﷺ" * 40,
    "x" * 120,
    "x" * 121,
    "x" * 100_000,
    "$1\r\n",
    "*1\r\n$4\r\nPING\r\n",
    "-ERR",
    "' OR 1=1 --",
    "../../etc/passwd",
    "%s%n",
    "__proto__",
    "nil",
    "false",
    "0",
    "-1",
]
BAD_ARGUMENTS: list[tuple[str, dict[str, Any]]] = [
    ("", {}),
    ("name", {"ttl": 0}),
    ("name", {"ttl": -1}),
    ("name", {"ttl": float("nan")}),
    ("name", {"ttl": float("inf")}),
    ("name", {"ttl": True}),
    ("name", {"ttl": "30"}),
    ("name", {"ttl": None}),
    ("name", {"wait": -0.1}),
    ("name", {"wait": float("nan")}),
    ("name", {"wait": "1"}),
    ("name", {"renew_max": 0}),
    ("name", {"drift_factor": 0.9}),
    ("name", {"grace": 0}),
]


def hostile_names(pool: ServerPool) -> dict[str, Any]:
    """Every hostile name maps to its own keys under the prefix, in one hash slot;
    every bad argument is refused at construction with a message naming it."""
    server = pool.server()
    admin = server.admin()
    AUDIT.plant(admin)
    client = bounded_client(server.url)
    held = []
    problems: list[str] = []
    names = dict.fromkeys(HOSTILE_NAMES + [chr(c) for c in range(1, 32)])
    for name in names:
        lock = Lock(client, name, ttl=30, wait=0)
        # All held at once: two names sharing a key would make one acquire fail.
        if not lock.acquire():
            problems.append(f"{name[:20]!r} collided with another name")
            continue
        keys = lock.keys
        if not (keys.lease.startswith(b"redislock:L:{") and len(keys.lease) < 250):
            problems.append(f"{name[:20]!r} maps outside the layout: {keys.lease[:60]!r}")
        slots = {redis.crc.key_slot(k) for k in (keys.lease, keys.queue, keys.state)}
        if len(slots) != 1:
            problems.append(f"{name[:20]!r} spans hash slots {slots}")
        held.append(lock)
    # Another process must see the same names busy (key derivation is stable).
    other = bounded_client(server.url)
    for lock in held:
        if Lock(other, lock.name, ttl=1, wait=0).acquire():
            problems.append(f"{lock.name[:20]!r} acquired twice")
    for lock in held:
        lock.release()
    refused = 0
    for name, kwargs in BAD_ARGUMENTS:
        try:
            Lock(client, name, **kwargs)
        except (TypeError, ValueError) as exc:
            refused += 1
            arg = next(iter(kwargs), "name")
            if arg not in str(exc):
                problems.append(f"error for bad {arg} does not name it: {exc}")
        else:
            problems.append(f"accepted {name!r} {kwargs}")
    for bad in (None, 7, b"bytes"):
        try:
            Lock(client, bad, ttl=1)  # type: ignore[arg-type]
        except TypeError:
            refused += 1
        else:
            problems.append(f"accepted name {bad!r}")
    client.close()
    other.close()
    return {
        "names": len(held),
        "bad_arguments": len(BAD_ARGUMENTS) + 3,
        "refused": refused,
        "problems": problems,
        "audit": _audit(admin),
    }


# -- 13. Redis down or stalled at request time (Django layer) -----------------------------
MIDDLEWARE = "django_redislock.middleware.ConcurrencyLimitMiddleware"
THROTTLE = [{"name": "faults", "path": r"^/plain/", "limit": 2, "per": "global", "wait": 0}]


def request_time(pool: ServerPool, *, timeout: float = 0.3) -> dict[str, Any]:
    """Requests while Redis is frozen (SIGSTOP) or dead, on both request paths:
    a ``redis_locked`` view fails closed (503 with Retry-After) unless it asked to
    fail open; the throttling middleware fails open (the view runs) unless
    ``THROTTLE_FAIL_OPEN`` is False. All within the bound; never a 500.

    Needs configured Django settings (the test settings).
    """
    from django.conf import settings
    from django.test import AsyncClient, Client, override_settings

    from django_redislock import connection

    server = pool.server()
    dead = f"redis://127.0.0.1:{server.port}/0"
    # One bounded call per request: the eviction-policy check runs off the
    # request path (connection.check_eviction).
    bound = Bound(call_bound(timeout))
    statuses: dict[str, list[int]] = {}
    took: dict[str, float] = {}
    middleware = [MIDDLEWARE, *settings.MIDDLEWARE]

    def request(label: str, client: Any, url: str) -> None:
        with bound.timed():
            response = client.get(url)
            if asyncio.iscoroutine(response):
                response = asyncio.run(response)
        took[label] = round(bound.samples[-1], 3)
        statuses.setdefault(label, []).append(response.status_code)
        if response.status_code == 503 and not response.has_header("Retry-After"):
            statuses.setdefault("503 without Retry-After", []).append(503)

    for how in ("stalled", "dead"):
        if how == "stalled":
            server.pause()
        else:
            server.resume()
            server.kill()
        caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": dead}}
        base = {"SOCKET_TIMEOUT": timeout, "CONNECT_TIMEOUT": timeout, "TIMEOUT": 5}
        try:
            for fail_open in (True, False):
                redislock = {**base, "THROTTLE": THROTTLE, "THROTTLE_FAIL_OPEN": fail_open}
                with override_settings(
                    CACHES=caches,
                    REDISLOCK=redislock,
                    ROOT_URLCONF="tests.faults.urls",
                    MIDDLEWARE=middleware,
                ):
                    connection.reset()
                    sync, aio = (
                        Client(raise_request_exception=False),
                        AsyncClient(raise_request_exception=False),
                    )
                    mode = "open" if fail_open else "closed"
                    request(f"{how} throttle-{mode} sync", sync, "/plain/")
                    request(f"{how} throttle-{mode} async", aio, "/plain/")
                    if not fail_open:
                        continue
                    for url in ("/locked/", "/locked-open/", "/locked-async/"):
                        request(f"{how} {url} sync", sync, url)
                        request(f"{how} {url} async", aio, url)
        finally:
            connection.reset()
            if how == "stalled":
                server.resume()
    return {
        "statuses": statuses,
        "took": took,
        "calls": bound.calls,
        "longest": bound.longest,
        "promised": bound.promised,
        "hangs": bound.hangs,
    }


# -- 14. semaphore permits: killed holders, cancelled waiters, contention ------------------
def _live_permits(admin: redis.Redis, name: str) -> int:
    seconds, micros = admin.time()
    now_ms = seconds * 1000 + micros // 1000
    return int(admin.zcount(KS.semaphore(name).lease, now_ms + 1, "+inf"))


async def _cancel_permit_points(url: str, admin: redis.Redis, limit: int) -> dict[str, int]:
    from django_redislock.core.drivers.semaphore_async import AsyncSemaphore

    client = bounded_async_client(url, timeout=2)
    tried = leaked = 0
    try:
        for contended in (False, True):
            name = f"permits:cancel:{contended}"
            blocker = AsyncSemaphore(client, name, 1, ttl=60)
            if contended:
                assert await blocker.acquire()
            for k in range(limit):
                sem = AsyncSemaphore(client, name, 1, ttl=30, wait=10 if contended else 0)

                async def attempt(s: Any = sem) -> None:
                    if await s.acquire():
                        try:
                            await asyncio.Event().wait()
                        finally:
                            await s.release()

                task = asyncio.ensure_future(attempt())
                for _ in range(k):
                    await asyncio.sleep(0)
                task.cancel()
                # A cancelled acquire ends within its cleanup round trip.
                done, _ = await asyncio.wait([task], timeout=2)
                tried += 1
                keys = KS.semaphore(name)
                expected = 1 if contended else 0
                if not done or _live_permits(admin, name) != expected or admin.llen(keys.queue):
                    leaked += 1
                if not done:
                    task.cancel()
                    await asyncio.wait([task], timeout=5)
            if contended:
                await blocker.release()
    finally:
        await client.aclose()
    return {"tried": tried, "leaked": leaked}


def permits(
    pool: ServerPool, rng: random.Random, *, threads: int = 6, rounds: int = 150
) -> dict[str, Any]:
    """Permits are never over-granted and never leak: contention across threads
    (occupancy oracle) and a SIGKILLed permit holder."""
    from django_redislock.core.drivers.semaphore import Semaphore

    server = pool.server()
    admin = server.admin()
    AUDIT.plant(admin)
    limit = 2
    inside = [0]
    over = [0]
    mutex = threading.Lock()
    errors: list[BaseException] = []

    def contend(seed: int) -> None:
        local = random.Random(seed)
        client = bounded_client(server.url, timeout=2)
        sem = Semaphore(client, "permits", limit, ttl=10, wait=10)
        try:
            for _ in range(rounds):
                assert sem.acquire()
                with mutex:
                    inside[0] += 1
                    over[0] += inside[0] > limit
                time.sleep(local.random() * 0.001)
                with mutex:
                    inside[0] -= 1
                sem.release()
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            client.close()

    workers = [
        threading.Thread(target=contend, args=(rng.randrange(2**32),)) for _ in range(threads)
    ]
    for t in workers:
        t.start()
    for t in workers:
        t.join(60)
    assert not errors, errors
    # A holder killed with its permit: the permit comes back after its TTL.
    ttl = rng.uniform(0.3, 0.8)
    worker = Worker(server.url)
    try:
        worker.send(json.dumps({"op": "permit", "name": "permits:killed", "limit": 1, "ttl": ttl}))
        assert worker.read()["ok"]
        worker.kill()
    finally:
        worker.close()
    started = time.monotonic()
    sem = Semaphore(bounded_client(server.url), "permits:killed", 1, ttl=5, wait=ttl + 5)
    assert sem.acquire()
    back_after = time.monotonic() - started
    sem.release()
    leaked = sum(_live_permits(admin, n) for n in ("permits", "permits:killed"))
    return {
        "acquisitions": threads * rounds,
        "over_limit": over[0],
        "killed_permit_back_after": back_after,
        "killed_permit_ttl": ttl,
        "leaked": leaked,
        "audit": _audit(admin),
    }


def permit_cancellation(pool: ServerPool, *, limit: int = 12) -> dict[str, Any]:
    """Cancel an ``AsyncSemaphore.acquire`` after 0, 1, 2, ... loop iterations,
    free and contended: no permit and no queue entry may outlive the task."""
    server = pool.server()
    admin = server.admin()
    result: dict[str, Any] = dict(asyncio.run(_cancel_permit_points(server.url, admin, limit)))
    result["audit"] = _audit(admin, foreign=False)
    return result


# -- 15. Redis frozen past the socket timeout, under contention ----------------------------
# How long after Redis resumes (or after its attempt ended, if later) a lease
# granted to nobody may still be seen: a round trip, and a generous margin for
# the resumed server and the processes giving the lease back to be scheduled.
ORPHAN_MARGIN = 0.5


def frozen_redis(
    pool: ServerPool,
    rng: random.Random,
    *,
    freezes: int = 3,
    socket_timeout: float = 0.5,
    processes: int = 4,
    names: int = 2,
    wait: float = 1.0,
    ttl: float = 5.0,
    calm: float = 1.5,
) -> dict[str, Any]:
    """Processes contend for a few locks, with the library's own clients, while
    Redis is SIGSTOPped again and again, each time for 2 to 4 socket timeouts
    (shorter than the lease TTL), then SIGCONTed.

    Judged: every call ends within its bound (``freeze_bound``: the socket
    timeout plus slack, plus the wait for a waiting acquire); the oracles see no
    overlap and no lost update; and no lease stays granted to nobody: every
    lease in Redis belongs to a live attempt (``TokenLedger``), or is gone within
    ``ORPHAN_MARGIN`` of Redis resuming (or of its attempt ending, if later).
    """
    server = pool.server()
    admin = server.admin()
    AUDIT.plant(admin)
    ctx = multiprocessing.get_context("spawn")
    oracles = SharedOracles(ctx, names)
    ledger = TokenLedger(ctx, processes)
    timing = FreezeTiming(ctx, processes)
    stop = ctx.Event()
    lock_names = [f"frozen:{i}" for i in range(names)]
    leases = [KS.lock(n).lease for n in lock_names]
    seed = rng.randrange(2**32)
    procs = [
        ctx.Process(
            target=contend_through_freeze,
            args=(
                server.url,
                lock_names,
                oracles,
                ledger,
                timing,
                seed + n,
                n,
                stop,
                socket_timeout,
                wait,
                ttl,
            ),
            daemon=True,
        )
        for n in range(processes)
    ]
    orphans: dict[bytes, float] = {}
    resumed = {"at": 0.0}
    frozen_for: list[float] = []
    frozen_at: list[float] = []
    gained: list[int] = []

    def watch(seconds: float, *, until_empty: bool = False) -> None:
        """Read every lease about every 5 ms; age each one granted to nobody."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            read_at = time.monotonic()
            pipe = admin.pipeline(transaction=False)
            for key in leases:
                pipe.hget(key, "t")
            tokens = [t for t in pipe.execute() if t is not None]
            for token in tokens:
                died = ledger.died_at(token)
                if died is not None and died < read_at:
                    age = read_at - max(died, resumed["at"])
                    orphans[token] = max(orphans.get(token, 0.0), age)
            if until_empty and not tokens:
                return
            time.sleep(0.005)

    for p in procs:
        p.start()
    try:
        wait_until(
            lambda: sum(oracles.entries) >= 20 * processes, 60, "the contending processes to start"
        )
        watch(calm)
        for _ in range(freezes):
            length = rng.uniform(2 * socket_timeout, 4 * socket_timeout)
            frozen_at.append(time.monotonic())
            with server.paused():
                time.sleep(length)
                before = sum(oracles.entries)
            resumed["at"] = time.monotonic()
            frozen_for.append(length)
            watch(calm)
            gained.append(sum(oracles.entries) - before)  # work resumed with Redis
    finally:
        stop.set()
        for p in procs:
            p.join(wait + 4 * socket_timeout + 30)
            if p.is_alive():
                p.kill()
                p.join(5)
    # Every attempt has ended: whatever lease is left is granted to nobody.
    watch(ttl + 1, until_empty=True)
    ages = sorted(orphans.values(), reverse=True)
    result: dict[str, Any] = dict(oracles.summary())
    result.update(timing.summary())
    for call in result["slowest"]:
        # When the call started, against the start of the nearest freeze
        # (negative: before it).
        started = call.pop("started")
        nearest = min(frozen_at, key=lambda at: abs(started - at), default=None)
        call["since_freeze"] = None if nearest is None else round(started - nearest, 3)
        call["took"] = round(call["took"], 3)
    result.update(
        processes=processes,
        locks=names,
        socket_timeout=socket_timeout,
        wait=wait,
        ttl=ttl,
        frozen_for=frozen_for,
        acquisitions_after_each=gained,
        orphans=len(ages),
        orphan_longest=ages[0] if ages else 0.0,
        orphan_ages=[round(a, 3) for a in ages[:10]],
        orphan_margin=ORPHAN_MARGIN,
        exit_codes=[p.exitcode for p in procs],
        audit=_audit(admin),
    )
    admin.close()
    return result
