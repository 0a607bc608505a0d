"""Who is alive, who waits: the last renewal of each lease, the waiters of a
name, and force-releasing one permit of a semaphore by its ID.

Real Redis throughout; the killed holder is a real process, SIGKILLed.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from io import StringIO
from typing import Any

import pytest
import redis
from django.core.management import CommandError, call_command

from django_redislock import connection
from django_redislock.core.drivers.lock import Lock
from django_redislock.core.drivers.rwlock import ReadWriteLock
from django_redislock.core.drivers.semaphore import Semaphore
from django_redislock.core.engine.keys import KeySpace
from django_redislock.core.exceptions import LockLost
from django_redislock.core.ops.force import Shown, release, still_held
from django_redislock.core.ops.inspection import find, list_locks

KS = KeySpace("redislock")


@pytest.fixture(autouse=True)
def _fresh_clients() -> Any:
    connection.reset()
    yield
    connection.reset()


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("redislocks", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def only(r: redis.Redis, name: str, kind: str = "lock", waiters: int = 10) -> Any:
    rows, _ = find(r, KS, [name], kinds=(kind,), waiters=waiters)
    (row,) = rows
    return row


def wait_until(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def take_and_release(lock: Any) -> None:
    if lock.acquire():
        lock.release()


# -- the last renewal --------------------------------------------------------------------------
HOLDER = textwrap.dedent(
    """
    import sys, time, redis
    from django_redislock.core.drivers.lock import Lock
    from django_redislock.core.engine.keys import KeySpace
    client = redis.Redis(unix_socket_path=sys.argv[1], socket_timeout=5)
    lock = Lock(client, "job:7", ttl=9, wait=0, renew=True, keyspace=KeySpace("redislock"),
                label="nightly job")
    assert lock.acquire()
    print("held", flush=True)
    time.sleep(600)
    """
)


def test_a_killed_holders_last_renewal_stops_advancing(r: redis.Redis) -> None:
    path = r.connection_pool.connection_kwargs["path"]
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, path], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        holder = only(r, "job:7").holders[0]
        assert holder.renew and not holder.renewal_late
        # Renewed every third of its 9 s TTL while its process lives: the
        # last renewal moves on.
        seen = set()
        deadline = time.monotonic() + 20
        while len(seen) < 2:
            assert time.monotonic() < deadline, "the holder never renewed"
            row = only(r, "job:7")
            if row.holders[0].renewed_ago is not None:
                assert row.read_at is not None
                seen.add(round(row.read_at - row.holders[0].renewed_ago, 2))
            time.sleep(0.2)
        live = json.loads(run("list", "--format", "json")[0])["locks"][0]
        assert live["renew"] is True and live["renewed_at"] is not None
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        time.sleep(0.1)  # a renewal the process wrote before it died has run
        first = only(r, "job:7")
        renewed_at = first.read_at - first.holders[0].renewed_ago
        # Half the TTL after the last renewal (which came at most a third of
        # it before the kill), the lease says it is late: a third of the TTL
        # or more before it runs out, by which the row would be gone.
        deadline = time.monotonic() + 9
        while not (later := only(r, "job:7")).holders[0].renewal_late:
            assert time.monotonic() < deadline, "never late"
            time.sleep(0.1)
        assert later.holders[0].ident == first.holders[0].ident
        # The same instant: nobody renews it any more.
        assert later.read_at - later.holders[0].renewed_ago == pytest.approx(renewed_at, abs=0.002)
        assert later.holders[0].renewed_ago > 4.5 and later.lease_left is not None
        assert later.lease_left > 0
        table = run("list")[0].splitlines()
        assert "ago (late)" in table[1] and "nightly job" in table[1]
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_not_renewed_and_not_yet_renewed(r: redis.Redis) -> None:
    plain = Lock(r, "plain", ttl=300, wait=0, keyspace=KS)
    renewed = Lock(r, "renewed", ttl=300, wait=0, keyspace=KS, renew=True)
    assert plain.acquire() and renewed.acquire()
    try:
        rows = {row.name: row.holders[0] for row in list_locks(r, KS)}
        assert (rows["plain"].renew, rows["plain"].renewed_ago) == (False, None)
        assert (rows["renewed"].renew, rows["renewed"].renewed_ago) == (True, None)
        lines = {line.split()[0]: line for line in run("list")[0].splitlines()[1:]}
        assert "  off  " in lines["plain"] and "  not yet  " in lines["renewed"]
        # An explicit extend counts as a renewal of the lease.
        plain.extend()
        assert only(r, "plain").holders[0].renewed_ago is not None
    finally:
        plain.release()
        renewed.release()


def test_a_lease_handed_on_does_not_inherit_the_previous_holders_renewal(
    r: redis.Redis,
) -> None:
    first = Lock(r, "handed", ttl=300, wait=0, keyspace=KS)
    assert first.acquire()
    first.extend()
    assert only(r, "handed").holders[0].renewed_ago is not None
    second = Lock(r, "handed", ttl=300, wait=10, keyspace=KS)
    got, done = threading.Event(), threading.Event()

    def take() -> None:
        if second.acquire():
            got.set()
            done.wait(10)
            second.release()

    thread = threading.Thread(target=take)
    thread.start()
    wait_until(lambda: only(r, "handed").waiters == 1)
    first.release()
    assert got.wait(10)
    # Written over in place for the waiter, the lease still holds the first
    # holder's renewal field; it is not the new holder's.
    assert r.hget(KS.lock("handed").lease, "k") is not None
    assert only(r, "handed").holders[0].renewed_ago is None
    done.set()
    thread.join(10)


def test_permits_and_readers_show_their_renewal(r: redis.Redis) -> None:
    sem = Semaphore(r, "pool", 2, ttl=300, wait=0, keyspace=KS)
    reader = ReadWriteLock(r, "catalogue", "read", ttl=300, wait=0, keyspace=KS, renew=True)
    assert sem.acquire() and reader.acquire()
    try:
        assert only(r, "pool", "semaphore").holders[0].renewed_ago is None
        sem.extend()
        assert only(r, "pool", "semaphore").holders[0].renewed_ago is not None
        turn = only(r, "catalogue", "rwlock").holders[0]
        assert (turn.renew, turn.renewed_ago) == (True, None)
        reader.extend()
        assert only(r, "catalogue", "rwlock").holders[0].renewed_ago is not None
    finally:
        sem.release()
        reader.release()
    # Released, its renewal went with its other fields.
    assert not [f for f in r.hkeys(KS.semaphore("pool").state) if f.startswith(b"e:")]


# -- the waiters ----------------------------------------------------------------------------
def test_waiters_oldest_first_with_owner_and_how_long(r: redis.Redis) -> None:
    holder = Lock(r, "report:42", ttl=300, wait=0, keyspace=KS)
    assert holder.acquire()
    waiters = [
        Lock(r, "report:42", ttl=30, wait=30, keyspace=KS, label=f"waiter {i}") for i in range(4)
    ]
    threads = []
    try:
        for i, lock in enumerate(waiters):
            thread = threading.Thread(target=take_and_release, args=(lock,), name=f"w{i}")
            thread.start()
            threads.append(thread)
            wait_until(lambda n=i + 1: only(r, "report:42").waiters == n)
            time.sleep(0.3)
        row = only(r, "report:42", waiters=3)
        assert row.waiters == 4
        assert [w.label for w in row.waiting] == ["waiter 0", "waiter 1", "waiter 2"]
        assert [w.thread for w in row.waiting] == ["w0", "w1", "w2"]
        assert all(w.pid == os.getpid() for w in row.waiting)
        waited = [w.waited for w in row.waiting]
        assert all(x is not None for x in waited)
        # Oldest first, a little over 0.3 s apart; the oldest queued about
        # 4 x 0.3 s ago.
        assert waited == sorted(waited, reverse=True)  # type: ignore[type-var]
        assert 0.9 < waited[0] < 10  # type: ignore[operator]
        assert all(0 < w.gives_up_in <= 30 for w in row.waiting)
        # The command: a bounded list, and a count of the rest.
        out = run("list", "--waiters", "2")[0]
        lines = out.splitlines()
        at = lines.index("Waiting, oldest first:")
        assert lines[at + 1].split()[:4] == ["NAME", "KIND", "WAITED", "GIVES"]
        assert "waiter 0" in lines[at + 2] and "waiter 1" in lines[at + 3]
        assert "and 2 more waiting" in lines[at + 4]
        data = json.loads(run("list", "--format", "json", "--waiters", "2")[0])["locks"][0]
        assert data["waiters"] == 4
        assert [w["label"] for w in data["waiting"]] == ["waiter 0", "waiter 1"]
        assert set(data["waiting"][0]) == {
            "id",
            "host",
            "pid",
            "thread",
            "label",
            "waited",
            "gives_up_in",
        }
    finally:
        holder.release()
        for thread in threads:
            thread.join(30)


def test_ten_thousand_waiters_stay_fast_to_list(r: redis.Redis) -> None:
    holder = Lock(r, "crowded", ttl=300, wait=0, keyspace=KS)
    assert holder.acquire()
    state, queue = KS.lock("crowded").state, KS.lock("crowded").queue
    # 10,000 queue entries as the acquire script writes them (deadline|channel|
    # ttl|round|owner), put there directly: as many threads would take minutes.
    deadline = int(r.time()[0]) * 1000 + 300_000
    pipe = r.pipeline(transaction=False)
    for i in range(10_000):
        token = f"{i:016x}"
        owner = json.dumps({"host": "h", "pid": i, "thread": "t", "label": "", "w": 300_000})
        pipe.hset(state, token, f"{deadline}|-|30000|1|{owner}")
        pipe.rpush(queue, token)
    pipe.hset(state, "q", "0")
    pipe.execute()
    started = time.monotonic()
    row = only(r, "crowded")
    took = time.monotonic() - started
    assert row.waiters == 10_000 and [w.pid for w in row.waiting] == list(range(10))
    # A few ms on the server; bounded generously for a loaded machine.
    assert took < 1.0, took
    holder.release()


@pytest.mark.parametrize("kind", ["semaphore", "rwlock"])
def test_semaphore_and_rwlock_waiters_are_listed_with_owner(r: redis.Redis, kind: str) -> None:
    def make(label: str, wait: float) -> Any:
        if kind == "semaphore":
            return Semaphore(r, "one", 1, ttl=300, wait=wait, keyspace=KS, label=label)
        return ReadWriteLock(r, "one", "write", ttl=300, wait=wait, keyspace=KS, label=label)

    held = make("holder", 0)
    assert held.acquire()
    others = [make(f"waiter {i}", 20) for i in range(2)]
    threads = []
    served: list[str] = []

    def serve(lock: Any) -> None:
        if lock.acquire():
            served.append(lock.label)
            lock.release()

    try:
        for i, other in enumerate(others):
            thread = threading.Thread(target=serve, args=(other,), name=f"w{i}")
            thread.start()
            threads.append(thread)
            wait_until(lambda n=i + 1: only(r, "one", kind).waiters == n)
            time.sleep(0.3)
        waiting = only(r, "one", kind).waiting
        assert [(w.label, w.thread, w.pid) for w in waiting] == [
            ("waiter 0", "w0", os.getpid()),
            ("waiter 1", "w1", os.getpid()),
        ]
        first, second = (w.waited for w in waiting)
        assert first is not None and second is not None and first > second > 0.2
        assert all(0 < w.gives_up_in <= 20 for w in waiting)
    finally:
        held.release()
        for thread in threads:
            thread.join(30)
    # Served in turn, each woken on the channel its entry names (the owner
    # after it in the entry is not part of the channel).
    assert served == ["waiter 0", "waiter 1"]


# -- one permit, force-released by its ID ---------------------------------------------------
def test_clear_one_permit_by_its_id(r: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    sems = [Semaphore(r, "throttle", 3, ttl=300, wait=0, keyspace=KS) for _ in range(3)]
    for sem in sems:
        assert sem.acquire()
    try:
        listed = json.loads(run("list", "--format", "json")[0])["locks"][0]["permits"]
        ids = {p["id"] for p in listed}
        assert len(ids) == 3
        victim = sems[1]
        (victim_id,) = [
            h.ident for h in only(r, "throttle", "semaphore").holders if h.token == victim.token
        ]
        assert victim_id in ids
        with caplog.at_level(logging.WARNING, logger="django_redislock"):
            out, err = run("clear", "throttle", "--holder", victim_id, "--noinput")
        assert out.startswith("Released semaphore 'throttle' (1/3 permits") and err == ""
        owner = f"{socket.gethostname()}:{os.getpid()}/MainThread"
        assert out.splitlines()[1] == f"  holder {victim_id}: {owner}"
        left = only(r, "throttle", "semaphore")
        assert {h.ident for h in left.holders} == ids - {victim_id}
        # Exactly one permit came free: one more caller is admitted, not three.
        extra = [Semaphore(r, "throttle", 3, ttl=300, wait=0, keyspace=KS) for _ in range(2)]
        assert extra[0].acquire() and not extra[1].acquire()
        extra[0].release()
        with pytest.raises(LockLost):
            victim.extend()
        assert victim.loss is not None and victim.loss.cause == "force_released"
        assert victim.loss.forced_by.startswith("manage.py redislocks clear by ")
        (audit,) = [x for x in caplog.records if x.name == "django_redislock.inspect"]
        assert audit.forced_by.startswith("manage.py redislocks clear by ")  # type: ignore[attr-defined]
        for sem in (sems[0], sems[2]):
            sem.extend()
            assert sem.held
    finally:
        for sem in (sems[0], sems[2]):
            sem.release()


def test_a_newer_permit_is_never_cleared_by_the_old_id(r: redis.Redis) -> None:
    old = Semaphore(r, "pool", 1, ttl=300, wait=0, keyspace=KS)
    assert old.acquire()
    (shown,) = only(r, "pool", "semaphore").holders
    old.release()
    newer = Semaphore(r, "pool", 1, ttl=300, wait=0, keyspace=KS)
    assert newer.acquire()
    try:
        with pytest.raises(CommandError):
            call_command(
                "redislocks",
                "clear",
                "pool",
                "--holder",
                shown.ident,
                "--noinput",
                stdout=StringIO(),
                stderr=(err := StringIO()),
            )
        assert f"Not held: holder {shown.ident} of 'pool'" in err.getvalue()
        # Between reading and releasing, as the admin page does it: still
        # nothing of the newer holder goes, and no mark is left for it.
        current, gone = still_held(r, KS, [Shown("semaphore", "pool", frozenset({shown.ident}))])
        assert current == [] and gone
        assert release(r, KS, current).released == []
        newer.extend()
        assert newer.held
        assert not r.hexists(KS.forced("pool"), newer.token)
    finally:
        newer.release()


def test_holder_goes_with_one_name_and_waiters_is_not_negative(r: redis.Redis) -> None:
    for args, message in [
        (("clear", "a", "b", "--holder", "0" * 16), "--holder needs exactly one NAME"),
        (("clear", "--all", "--holder", "0" * 16), "--holder goes with one NAME"),
        (("list", "--waiters", "-1"), "--waiters must be 0 or more"),
    ]:
        with pytest.raises(CommandError, match=message):
            call_command("redislocks", *args, stdout=StringIO(), stderr=StringIO())
