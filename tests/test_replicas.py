"""``replicas=N``: a new lease counts only once N replicas acknowledged it (WAIT)."""

from __future__ import annotations

import contextlib
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from django.test import override_settings

from django_redislock import ReplicationTimeout
from django_redislock.core import AsyncLock, Lock, LockError, RedisUnavailable
from django_redislock.locks import get_lock
from tests.servers import RedisServer, free_port
from tests.topologies import wait_until


class Pair:
    def __init__(self) -> None:
        port = free_port()
        self.primary = RedisServer(port=port, unix=False, directory=tempfile.mkdtemp())
        self.replica = RedisServer(
            port=free_port(),
            unix=False,
            directory=tempfile.mkdtemp(),
            extra=("--replicaof", "127.0.0.1", str(port)),
        )

    def linked(self) -> bool:
        with self.replica.client(socket_timeout=1) as c:
            return bool(c.info("replication").get("master_link_status") == "up")

    @contextlib.contextmanager
    def replica_cut_off(self) -> Iterator[None]:
        """Stop the replica and drop its link: no write reaches it meanwhile."""
        self.replica.pause()
        try:
            with self.primary.client(socket_timeout=2) as c:
                # Raw: redis-py 5.0's client_kill_filter() refuses the type "replica".
                c.execute_command("CLIENT", "KILL", "TYPE", "replica")
            yield
        finally:
            self.replica.resume()
        wait_until("the replica to reconnect", self.linked, 20)


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    p = Pair()
    try:
        p.primary.start()
        p.replica.start()
        wait_until("the replica to sync", p.linked, 20)
        yield p
    finally:
        p.replica.cleanup()
        p.primary.cleanup()


@pytest.fixture
def primary(pair: Pair) -> Iterator[redis.Redis]:
    client = pair.primary.client(socket_timeout=5)
    client.flushall()
    yield client
    client.close()


class CountingRedis(redis.Redis):
    """Counts commands sent on their own and pipelines executed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands: list[Any] = []
        self.pipelines = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.commands.append(args[0])
        return super().execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        self.pipelines += 1
        return super().pipeline(transaction, shard_hint)


def test_acknowledged_lease_is_on_the_replica(pair: Pair, primary: redis.Redis) -> None:
    counting = CountingRedis(host="127.0.0.1", port=pair.primary.port, socket_timeout=5)
    lock = Lock(counting, "acked", ttl=10, wait=0, replicas=1, replicas_timeout=2)
    assert lock.acquire()  # the first may need EVAL after NOSCRIPT: warm up
    lock.release()
    counting.commands.clear()
    counting.pipelines = 0
    assert lock.acquire()
    # One pipeline (EVALSHA + WAIT), nothing else: still one round trip.
    assert (counting.pipelines, counting.commands) == (1, [])
    with pair.replica.client(socket_timeout=2) as c:
        assert c.hget(lock.keys.lease, "t") == lock.token.encode()  # type: ignore[union-attr]
    lock.release()
    counting.close()


def test_script_reloaded_inside_the_pipeline(pair: Pair, primary: redis.Redis) -> None:
    primary.script_flush()
    lock = Lock(primary, "fresh", ttl=10, wait=0, replicas=1, replicas_timeout=2)
    assert lock.acquire()  # NOSCRIPT in the pipeline: EVAL + WAIT again
    lock.release()


def test_no_acknowledgement_gives_the_lease_back(pair: Pair, primary: redis.Redis) -> None:
    with pair.replica_cut_off():
        lock = Lock(primary, "fragile", ttl=10, wait=5, replicas=1, replicas_timeout=0.2)
        with pytest.raises(ReplicationTimeout) as info:
            lock.acquire()
        assert (info.value.acked, info.value.wanted) == (0, 1)
        assert "0 of 1 replica(s)" in str(info.value)
        assert isinstance(info.value, RedisUnavailable)  # the unavailable policy applies
        assert isinstance(info.value, LockError)
        assert not lock.held
        assert primary.exists(lock.keys.lease) == 0
        with pytest.raises(ReplicationTimeout), lock:
            pytest.fail("the body must not run")
        # Without asking for acknowledgement the lock is simply free.
        plain = Lock(primary, "fragile", ttl=10, wait=0)
        assert plain.acquire()
        plain.release()


def test_more_replicas_than_exist(pair: Pair, primary: redis.Redis) -> None:
    lock = Lock(primary, "two", ttl=10, wait=0, replicas=2, replicas_timeout=0.1)
    with pytest.raises(ReplicationTimeout) as info:
        lock.acquire()
    assert info.value.acked == 1
    assert primary.exists(lock.keys.lease) == 0


def test_give_back_hands_the_turn_to_the_next_waiter(pair: Pair, primary: redis.Redis) -> None:
    holder = Lock(primary, "queue", ttl=30, wait=0)
    assert holder.acquire()
    outcome: dict[str, Any] = {}

    def demanding() -> None:
        try:
            Lock(primary, "queue", ttl=30, wait=10, replicas=2, replicas_timeout=0.1).acquire()
        except ReplicationTimeout as exc:
            outcome["demanding"] = exc

    def patient() -> None:
        lock = Lock(primary, "queue", ttl=30, wait=10)
        outcome["patient"] = lock.acquire()
        lock.release()

    first = threading.Thread(target=demanding)
    first.start()
    wait_until("the first waiter to queue", lambda: primary.llen(holder.keys.queue) == 1, 10)
    second = threading.Thread(target=patient)
    second.start()
    wait_until("the second waiter to queue", lambda: primary.llen(holder.keys.queue) == 2, 10)
    holder.release()
    first.join(15)
    second.join(15)
    assert isinstance(outcome["demanding"], ReplicationTimeout)
    assert outcome["patient"] is True


async def test_async_acknowledgement(pair: Pair, primary: redis.Redis) -> None:
    client = redis.asyncio.Redis(host="127.0.0.1", port=pair.primary.port, socket_timeout=5)
    try:
        lock = AsyncLock(client, "async-acked", ttl=10, wait=0, replicas=1, replicas_timeout=2)
        assert await lock.acquire()
        await lock.release()
        with pair.replica_cut_off():
            lock = AsyncLock(client, "async-acked", ttl=10, wait=0, replicas=1,
                             replicas_timeout=0.2)
            with pytest.raises(ReplicationTimeout):
                await lock.acquire()
            assert await client.exists(lock.keys.lease) == 0
            assert not lock.held
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"replicas": -1}, "replicas must be a whole number"),
        ({"replicas": True}, "replicas must be a whole number"),
        ({"replicas": 1.5}, "replicas must be a whole number"),
        ({"replicas_timeout": 0}, "replicas_timeout must be a finite number"),
    ],
)
def test_bad_arguments(primary: redis.Redis, options: dict[str, Any], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        Lock(primary, "x", **options)


def test_settings_apply_to_get_lock() -> None:
    with override_settings(REDISLOCK={"REPLICAS": 2, "REPLICAS_TIMEOUT": 0.5}):
        lock = get_lock("configured")
        assert (lock.replicas, lock.replicas_timeout) == (2, 0.5)
        assert get_lock("configured", replicas=0).replicas == 0
    assert get_lock("configured").replicas == 0  # the default: off


def test_off_by_default_sends_no_wait(primary: redis.Redis, pair: Pair) -> None:
    counting = CountingRedis(host="127.0.0.1", port=pair.primary.port, socket_timeout=5)
    lock = Lock(counting, "plain", ttl=10, wait=0)
    assert lock.acquire()
    lock.release()
    counting.commands.clear()
    assert lock.acquire()
    assert counting.pipelines == 0
    assert counting.commands == ["EVALSHA"]
    lock.release()
    counting.close()

