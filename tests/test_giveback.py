"""Give-back off the caller's path: an acquire whose reply was lost while Redis
was frozen still runs when Redis resumes; the cancel enqueued for it must run
after it, within about one round trip, and free the name."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

from django_redislock.core import Lock, RedisUnavailable
from django_redislock.core.engine import scripts
from django_redislock.core.engine.protocol import may_have_run
from django_redislock.core.io import calls, calls_async, giveback, giveback_async
from tests.servers import RedisServer
from tests.topologies import wait_until

# "About one round trip" on a loaded 2-core host.
LANDS_WITHIN = 1.0


@pytest.fixture
def server(redis_factory: Any) -> Iterator[RedisServer]:
    s: RedisServer = redis_factory().start()
    yield s
    s.resume()


def _acquire_args(lock: Lock, token: str) -> tuple[Any, ...]:
    return lock._args_acquire(token, 30_000, "test", 0, b"-")


def _preload(server: RedisServer) -> None:
    # Cached scripts: a NOSCRIPT attempt would count as a call of its own.
    with server.client(socket_timeout=5) as c:
        for script in (scripts.ACQUIRE, scripts.CANCEL, scripts.RELEASE):
            c.script_load(script.source)


def _scripts_run(server: RedisServer) -> int:
    with server.client(socket_timeout=5) as c:
        stats = c.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{n}", {}).get("calls", 0)) for n in ("eval", "evalsha"))


def _given_back(server: RedisServer, lock: Lock, before: int) -> bool:
    """The late acquire and the cancel both ran (two scripts), and no lease is left."""
    with server.client(socket_timeout=5) as c:
        return _scripts_run(server) >= before + 2 and not c.exists(lock.keys.lease)


def _free_soon_after_resume(server: RedisServer, lock: Lock, before: int) -> float:
    """Resume Redis; seconds until the late grant was given back."""
    server.resume()
    resumed = time.monotonic()
    wait_until("the late grant to be given back", lambda: _given_back(server, lock, before), 10)
    return time.monotonic() - resumed


def test_give_back_lands_after_the_late_acquire(server: RedisServer) -> None:
    client = redis.Redis(unix_socket_path=server.socket_path, socket_timeout=0.5)
    lock = Lock(client, "late", ttl=30, wait=0)
    try:
        token = "t" * 32
        calls.run(client, scripts.RELEASE, lock._key_tuple, ("warm",))  # cached, connected
        _preload(server)
        before = _scripts_run(server)
        server.pause()
        with pytest.raises(RedisUnavailable) as info:
            calls.run(client, scripts.ACQUIRE, lock._key_tuple, _acquire_args(lock, token))
        assert may_have_run(info.value)
        sent_from: list[int] = []

        def cancel() -> Any:
            sent_from.append(threading.get_ident())
            return calls.run(client, scripts.CANCEL, lock._key_tuple, (token,))

        giveback.submit(cancel, within=30, after=info.value, what=f"lock {lock.name!r}")
        # The caller only enqueues: the cancel is sent from another thread,
        # never the caller's (which, Redis being frozen, it would hold up).
        assert threading.get_ident() not in sent_from
        time.sleep(1.2)  # frozen past a few attempts' timeouts
        assert _free_soon_after_resume(server, lock, before) < LANDS_WITHIN
        assert sent_from and threading.get_ident() not in sent_from
        # Once the late reply is read, the give-back is sent again: whatever
        # order the first attempts ran in, nothing of the late grant is left.
        pending = info.value.pending  # type: ignore[attr-defined]
        assert pending is not None and pending.done.wait(10) and pending.answered
        wait_until("the late grant to be gone", lambda: not client.exists(lock.keys.lease), 10)
        # And the name is free for the next caller.
        assert Lock(client, "late", ttl=5, wait=0).acquire()
    finally:
        client.close()


def test_give_back_gives_up_at_its_deadline(server: RedisServer, caplog: Any) -> None:
    client = redis.Redis(unix_socket_path=server.socket_path, socket_timeout=0.2)
    lock = Lock(client, "hopeless", ttl=30, wait=0)
    done: list[bool] = []
    try:
        server.pause()

        def cancel() -> None:
            try:
                calls.run(client, scripts.CANCEL, lock._key_tuple, ("x",))
            finally:
                done.append(True)

        with caplog.at_level("WARNING", logger="django_redislock.giveback"):
            giveback.submit(cancel, within=0.6, what="a test lease")
            wait_until("the give-back to give up", lambda: "gave up" in caplog.text, 10)
        assert done  # it tried, and stopped
    finally:
        server.resume()
        client.close()


async def test_async_give_back_lands_after_the_late_acquire(server: RedisServer) -> None:
    client = redis.asyncio.Redis(unix_socket_path=server.socket_path, socket_timeout=0.5)
    lock = Lock(redis.Redis(unix_socket_path=server.socket_path), "late-async", ttl=30)
    try:
        token = "a" * 32
        await calls_async.run_async(client, scripts.RELEASE, lock._key_tuple, ("warm",))
        _preload(server)
        before = _scripts_run(server)
        server.pause()
        with pytest.raises(RedisUnavailable) as info:
            await calls_async.run_async(
                client, scripts.ACQUIRE, lock._key_tuple, _acquire_args(lock, token)
            )
        task = giveback_async.submit_async(
            lambda: calls_async.run_async(client, scripts.CANCEL, lock._key_tuple, (token,)),
            within=30,
            after=info.value,
        )
        await asyncio.sleep(1.2)
        server.resume()
        resumed = time.monotonic()
        await asyncio.wait_for(task, 10)
        assert time.monotonic() - resumed < LANDS_WITHIN
        assert _given_back(server, lock, before)
        # Once the late reply is read, the give-back is sent again: nothing of
        # the late grant is left, whatever order the first attempts ran in.
        pending = info.value.pending  # type: ignore[attr-defined]
        deadline = time.monotonic() + 10
        while not (pending.done.is_set() and not lock.client.exists(lock.keys.lease)):
            assert time.monotonic() < deadline, "the late grant was not given back"
            await asyncio.sleep(0.02)
        assert pending.answered
    finally:
        server.resume()
        await asyncio.sleep(0)  # let the drained connection go back to the pool
        await client.aclose()
        lock.client.close()


def _give_back_in_child(socket_path: str, key: bytes, done: Any) -> None:
    client = redis.Redis(unix_socket_path=socket_path, socket_timeout=2)

    def mark() -> None:
        client.set(key, b"child")
        done.set()

    giveback.submit(mark, within=5)
    done.wait(10)
    client.close()


@pytest.mark.filterwarnings("ignore:This process .* fork:DeprecationWarning")
def test_a_forked_child_gets_its_own_worker(server: RedisServer) -> None:
    # The parent's worker thread exists before the fork; the child has none of
    # its threads, so it must start one of its own, with an empty queue.
    ran = threading.Event()
    giveback.submit(ran.set, within=5)
    assert ran.wait(5)
    ctx = multiprocessing.get_context("fork")
    done = ctx.Event()
    child = ctx.Process(
        target=_give_back_in_child, args=(server.socket_path, b"redislock-test:forked", done)
    )
    child.start()
    child.join(20)
    assert child.exitcode == 0
    assert done.is_set()
    with server.client(socket_timeout=5) as c:
        assert c.get(b"redislock-test:forked") == b"child"
