"""The sync drivers are generated from the asyncio ones: what that fixed and keeps.

Each test here found a place where the hand-written sync and asyncio twins
had drifted apart; the generated drivers, the primitives modules and the one
reconnection policy of the notifiers keep them together.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

from django_redislock.core import AsyncLock, KeySpace, LockNotOwned, RedisUnavailable
from django_redislock.core.io.wakeups_base import (
    BACKOFF_MAX,
    BACKOFF_MIN,
    LIVENESS_INTERVAL,
    Reconnect,
)
from tests.drive import Drive
from tests.servers import free_port

ROOT = Path(__file__).resolve().parent.parent


async def test_the_renew_max_stop_is_logged_by_the_renew_logger(
    drive: Drive, caplog: pytest.LogCaptureFixture
) -> None:
    # Lock logged it to django_redislock.acquire, AsyncLock to .renew.
    lock = drive.Lock(drive.client, "twins-renew-max", ttl=0.6, wait=0, renew=True, renew_max=0.3)
    with caplog.at_level(logging.INFO, logger="django_redislock.renew"):
        assert await drive(lock.acquire())
        # Not released: the lease runs out by itself once renewal stops.
        await drive.until(
            lambda: any("stopped renewing" in rec.getMessage() for rec in caplog.records),
            timeout=10,
        )
    stops = [rec for rec in caplog.records if "stopped renewing" in rec.getMessage()]
    assert [rec.name for rec in stops] == ["django_redislock.renew"]


def _read_child(fd: int, pid: int) -> str:
    try:
        ready, _, _ = select.select([fd], [], [], 20)
        return os.read(fd, 200).decode() if ready else "nothing in 20 s"
    finally:
        os.close(fd)
        os.waitpid(pid, 0)


async def test_a_child_forked_inside_the_holding_task_cannot_release(
    ar: redis.asyncio.Redis,
) -> None:
    # The child of a fork inside the task that holds the lock runs on in that
    # same task. Lock looks at the process id first and says LockNotOwned;
    # AsyncLock judged ownership by the task alone, and asyncio (which knows
    # its loop runs in the parent) failed the check with a RuntimeError.
    lock = AsyncLock(ar, "twins-fork", ttl=30, wait=0)
    assert await lock.acquire()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            os.close(read_fd)
            outcome = [lock.held]
            for call in (lock.extend, lock.release):
                try:
                    # No loop runs in the child: the check must come first.
                    await call()
                    outcome.append("done")
                except LockNotOwned:
                    outcome.append("LockNotOwned")
                except BaseException as exc:
                    outcome.append(type(exc).__name__)
            os.write(write_fd, repr(outcome).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    report = await asyncio.get_running_loop().run_in_executor(None, _read_child, read_fd, pid)
    assert report == repr([False, "LockNotOwned", "LockNotOwned"])
    assert await lock.owned()
    await lock.release()


class _Boom(Exception):
    """Not a Redis error: a bug, not Redis being unavailable."""


@pytest.mark.parametrize("kind", ["semaphore", "rwlock"])
async def test_owned_reports_only_redis_errors_as_unavailable(
    drive: Drive, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    # Semaphore and ReadWriteLock caught Exception where Lock caught RedisError:
    # a bug in the caller's client came out as RedisUnavailable.
    handle: Any = (
        drive.Semaphore(drive.client, "twins-owned", 2, wait=0)
        if kind == "semaphore"
        else drive.ReadWriteLock(drive.client, "twins-owned", "read", wait=0)
    )
    assert await drive(handle.acquire())
    try:

        def broken(*args: object) -> None:
            raise _Boom("not Redis")

        monkeypatch.setattr(drive.client, "zscore", broken)
        with pytest.raises(_Boom):
            await drive(handle.owned())

        def down(*args: object) -> None:
            raise redis.ConnectionError("Redis is down")

        monkeypatch.setattr(drive.client, "zscore", down)
        with pytest.raises(RedisUnavailable):
            await drive(handle.owned())
    finally:
        monkeypatch.undo()
        await drive(handle.release())


# -- the notifiers' one reconnection policy -----------------------------------------------


def test_reconnect_backs_off_within_an_outage() -> None:
    policy = Reconnect()
    delays = [policy.failed(0.0) for _ in range(7)]
    assert delays[0] == BACKOFF_MIN
    assert delays == sorted(delays) and delays[-1] == BACKOFF_MAX
    assert policy.first is False


def test_reconnect_starts_again_after_the_channel_stayed_up() -> None:
    policy = Reconnect()
    for _ in range(4):
        policy.failed(0.0)
    assert policy.up(1.0) == 4  # the outage it ends, told once
    assert policy.up(1.5) == 0
    # Up only briefly: the same outage goes on, and backs off further.
    assert policy.failed(1.0 + LIVENESS_INTERVAL / 2) > BACKOFF_MIN
    assert policy.first is False
    policy.up(10.0)
    # Up for LIVENESS_INTERVAL: a new outage, from the bottom, worth a warning.
    assert policy.failed(10.0 + LIVENESS_INTERVAL) == BACKOFF_MIN
    assert policy.first is True


async def test_a_flapping_channel_warns_once_per_outage(
    redis_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # The asyncio notifier counted each subscription as the end of an outage:
    # a connection that drops again and again right after subscribing logged
    # a warning every time (and never backed off from the bottom again). The
    # sync notifier warned once per outage; both now follow one policy.
    from django_redislock.core.io.wakeups_async import AsyncNotifier
    from tests.faults.proxy import FaultProxy

    server = redis_factory(port=free_port(), unix=False).start()
    proxy = FaultProxy(("127.0.0.1", server.port))
    client = redis.asyncio.Redis.from_url(proxy.url, socket_timeout=5, socket_connect_timeout=5)
    notifier = AsyncNotifier(client, KeySpace("twins-flap"))
    try:
        notifier.register("waiter", b"")
        with caplog.at_level(logging.DEBUG, logger="django_redislock.notify"):
            for _ in range(3):
                assert await notifier.wait_ready(10)
                proxy.reset()
                for _ in range(400):
                    if not notifier.is_ready():
                        break
                    await asyncio.sleep(0.025)
                assert not notifier.is_ready(), "the reset was not noticed"
            assert await notifier.wait_ready(10)
        lost = [rec for rec in caplog.records if "wake-up channel lost" in rec.getMessage()]
        assert len(lost) >= 3, lost
        assert [rec.levelno for rec in lost].count(logging.WARNING) == 1
    finally:
        notifier.unregister("waiter")
        if notifier._task is not None:
            notifier._task.cancel()
            await asyncio.gather(notifier._task, return_exceptions=True)
        await client.aclose()
        proxy.close()
