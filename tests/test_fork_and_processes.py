"""Many processes, crashed holders, and handles inherited across fork."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
import traceback
from typing import Any

import pytest
import redis

from django_redislock.core import Lock, LockNotOwned, this_process
from django_redislock.core.io import background
from django_redislock.core.process import TOKENS_PER_READ, new_token
from tests.helpers_oracles import Occupancy, audit_keyspace, plant_sentinel, wait_until

# Python 3.12+ warns about fork() in a process with threads (the test runner's
# listener threads); these tests fork on purpose and the children touch no lock
# the parent's threads hold.
pytestmark = pytest.mark.filterwarnings("ignore:This process .* fork:DeprecationWarning")

ctx = multiprocessing.get_context("fork")


def _contender(
    url: str, barrier: Any, start_at: Any, oracle: Occupancy, rounds: int, errors: Any
) -> None:
    try:
        client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
        barrier.wait(30)
        # Everyone starts at the same scheduled instant.
        delay = start_at.value - time.time()
        if delay > 0:
            time.sleep(delay)
        lock = Lock(client, "crowd", ttl=20, wait=60)
        for _ in range(rounds):
            if not lock.acquire():
                errors.put("acquire timed out")
                return
            with oracle.section():
                pass
            lock.release()
        client.close()
    except BaseException:
        errors.put(traceback.format_exc())


def test_many_processes_never_overlap(redis_server: Any, r: redis.Redis) -> None:
    plant_sentinel(r)
    procs_n, rounds = 24, 20
    oracle = Occupancy(ctx)
    barrier = ctx.Barrier(procs_n + 1)
    start_at = ctx.Value("d", 0.0)
    errors = ctx.Queue()
    procs = [
        ctx.Process(
            target=_contender,
            args=(redis_server.url, barrier, start_at, oracle, rounds, errors),
        )
        for _ in range(procs_n)
    ]
    for p in procs:
        p.start()
    try:
        start_at.value = time.time() + 0.3
        barrier.wait(30)
        for p in procs:
            p.join(60)
    finally:
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)  # type: ignore[arg-type]
                p.join(5)
    failures = []
    while not errors.empty():
        failures.append(errors.get(timeout=1))
    assert not failures, failures[0]
    assert all(p.exitcode == 0 for p in procs)
    total = procs_n * rounds
    assert oracle.entries.value == total
    assert oracle.violations.value == 0
    assert oracle.unsafe.value == total
    audit_keyspace(r)
    assert not r.exists(Lock(r, "crowd").keys.lease)
    assert r.llen(Lock(r, "crowd").keys.queue) == 0


def test_the_oracle_sees_overlap() -> None:
    # The oracle must be able to fail: two sections at once are counted.
    oracle = Occupancy(ctx)
    with oracle.section(), oracle.section():
        pass
    assert oracle.violations.value == 1
    assert oracle.entries.value == 2 and oracle.inside.value == 0


def _doomed_holder(url: str, ready: Any) -> None:
    client = redis.Redis.from_url(url, socket_timeout=5)
    lock = Lock(client, "doomed", ttl=2, wait=0)
    ready.send(lock.acquire())
    time.sleep(60)  # killed long before this


def test_sigkilled_holder_frees_the_lock_within_its_ttl(redis_server: Any, r: redis.Redis) -> None:
    plant_sentinel(r)
    parent_end, child_end = ctx.Pipe()
    child = ctx.Process(target=_doomed_holder, args=(redis_server.url, child_end))
    child.start()
    try:
        assert parent_end.poll(20)
        assert parent_end.recv() is True
        waiter = Lock(r, "doomed", ttl=10, wait=10)
        result: dict[str, Any] = {}
        checked = threading.Event()

        def wait_for_it() -> None:
            result["ok"] = waiter.acquire()
            result["at"] = time.monotonic()
            checked.wait(10)
            if result["ok"]:
                waiter.release()

        t = threading.Thread(target=wait_for_it)
        t.start()
        wait_until(lambda: r.llen(waiter.keys.queue) == 1)
        killed_at = time.monotonic()
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join(5)
        wait_until(lambda: "ok" in result, timeout=15)
        assert result["ok"] is True
        # Within about the TTL, never the full wait.
        assert result["at"] - killed_at < 2 + 3
        assert r.hget(waiter.keys.lease, "t") == waiter.token.encode()  # type: ignore[union-attr]
        checked.set()
        t.join(10)
        assert not r.exists(waiter.keys.lease)
        audit_keyspace(r)
    finally:
        checked.set()
        if child.is_alive():
            os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
            child.join(5)


def _child_of_holder(lock: Lock, parent_released: Any, out: Any) -> None:
    try:
        report: dict[str, Any] = {"held": lock.held, "owned": lock.owned()}
        for action in ("release", "extend"):
            try:
                getattr(lock, action)()
                report[action] = "no error"
            except LockNotOwned as exc:
                report[action] = type(exc).__name__
        report["renewing"] = background.current().running
        report["try_while_parent_holds"] = lock.acquire(wait=0)
        out.send(report)
        parent_released.wait(20)
        report2 = {"acquired": lock.acquire(wait=10), "fence": lock.fence}
        report2["renewing"] = background.current().running
        lock.release()
        out.send(report2)
    except BaseException:
        out.send({"error": traceback.format_exc()})


def test_forked_child_cannot_release_parents_lease(r: redis.Redis) -> None:
    plant_sentinel(r)
    lock = Lock(r, "forked", ttl=3, wait=0, renew=True)
    assert lock.acquire()
    parent_fence = lock.fence
    wait_until(lambda: background.current().running)
    parent_released = ctx.Event()
    parent_end, child_end = ctx.Pipe()
    child = ctx.Process(target=_child_of_holder, args=(lock, parent_released, child_end))
    child.start()
    try:
        assert parent_end.poll(20)
        report = parent_end.recv()
        assert "error" not in report, report.get("error")
        assert report == {
            "held": False,
            "owned": False,
            "release": "LockNotOwned",
            "extend": "LockNotOwned",
            "renewing": False,
            "try_while_parent_holds": False,
        }
        # The parent's lease is untouched, and still renewed by the parent.
        assert lock.owned()
        assert r.hget(lock.keys.lease, "t") == lock.token.encode()  # type: ignore[union-attr]
        lock.release()
        parent_released.set()
        assert parent_end.poll(20)
        report2 = parent_end.recv()
        assert "error" not in report2, report2.get("error")
        assert report2["acquired"] is True
        assert report2["fence"] > parent_fence
        child.join(10)
        assert child.exitcode == 0
        audit_keyspace(r)
    finally:
        parent_released.set()
        if child.is_alive():
            os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
            child.join(5)


def test_the_process_id_read_once_is_the_child_s_after_a_fork() -> None:
    # Handles compare it with their own on every call: a child must never see its parent's.
    assert this_process.pid == os.getpid()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and leave without running the parent's cleanup
        try:
            os.write(write, b"1" if this_process.pid == os.getpid() else b"0")
        finally:
            os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 1) == b"1"
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert this_process.pid == os.getpid()


def test_a_forked_child_never_hands_out_its_parent_s_tokens() -> None:
    # Tokens are read from the system a batch at a time: a child that went on
    # with the rest of its parent's batch would give its acquisitions the
    # parent's tokens, and either could then release the other's lease.
    new_token()  # the parent is part-way through a batch
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and leave without running the parent's cleanup
        try:
            os.write(write, "".join(new_token() for _ in range(2 * TOKENS_PER_READ)).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        data = b""
        while chunk := os.read(read, 65536):
            data += chunk
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    child = {data[i : i + 16].decode() for i in range(0, len(data), 16)}
    parent = {new_token() for _ in range(2 * TOKENS_PER_READ)}
    assert len(child) == len(parent) == 2 * TOKENS_PER_READ
    assert not child & parent


def test_threads_never_draw_the_same_token() -> None:
    drawn: list[list[str]] = [[] for _ in range(8)]
    start = threading.Barrier(len(drawn))

    def draw(mine: list[str]) -> None:
        start.wait(10)
        mine.extend(new_token() for _ in range(20 * TOKENS_PER_READ))

    threads = [threading.Thread(target=draw, args=(mine,)) for mine in drawn]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    tokens = [token for mine in drawn for token in mine]
    assert len(tokens) == len(drawn) * 20 * TOKENS_PER_READ
    assert len(set(tokens)) == len(tokens)
    assert all(len(token) == 16 and int(token, 16) >= 0 for token in tokens)


def _queued_waiter(url: str) -> None:
    client = redis.Redis.from_url(url, socket_timeout=5)
    Lock(client, "dead-waiter", ttl=10, wait=30).acquire()
    time.sleep(60)  # killed long before this


def test_sigkilled_waiter_does_not_hold_up_the_queue(redis_server: Any, r: redis.Redis) -> None:
    plant_sentinel(r)
    holder = Lock(r, "dead-waiter", ttl=30, wait=0)
    assert holder.acquire()
    checked = threading.Event()
    child = ctx.Process(target=_queued_waiter, args=(redis_server.url,))
    child.start()
    try:
        wait_until(lambda: r.llen(holder.keys.queue) == 1)
        live = Lock(r, "dead-waiter", ttl=10, wait=20)
        result: dict[str, Any] = {}

        def wait_for_it() -> None:
            result["ok"] = live.acquire()
            result["at"] = time.monotonic()
            checked.wait(10)
            if result["ok"]:
                live.release()

        t = threading.Thread(target=wait_for_it)
        t.start()
        wait_until(lambda: r.llen(holder.keys.queue) == 2)
        # The first-come order's element: <token>|<since>|<deadline>|<channel>|...
        dead_entry = r.lindex(holder.keys.queue, 0).decode()  # type: ignore[union-attr]
        dead_channel = dead_entry.split("|")[3][1:]
        assert r.pubsub_numsub(dead_channel)[0][1] == 1
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join(5)
        # Redis learns of the closed connection on its next turn of the event
        # loop, and until then a PUBLISH still counts the dead subscriber; the
        # handed lease would then cost the live waiter the old holder's TTL
        # (docs/internals.rst: its fallback timer). Wait until Redis has noticed.
        wait_until(lambda: r.pubsub_numsub(dead_channel)[0][1] == 0)
        # The dead waiter is first in line, but nobody listens on its channel
        # any more: the turn passes to the live waiter at once, by notification
        # (not after the old holder's TTL, its fallback timer).
        released_at = time.monotonic()
        holder.release()
        wait_until(lambda: "ok" in result, timeout=20)
        assert result["ok"] is True
        assert result["at"] - released_at < 2
        checked.set()
        t.join(10)
        audit_keyspace(r)
    finally:
        checked.set()
        if child.is_alive():
            os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
            child.join(5)
