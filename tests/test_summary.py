"""The per-template summary: what the owner metadata stores, and how rows group.

Names carry ids ("purchase:42"), so rows group by the template the lock was
taken under (``metric_name``: the decorator's key template, a throttling
rule's name), which each lease and permit stores in its owner JSON as ``t``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis

from django_redislock import redis_lock, redis_locked
from django_redislock.core.drivers import base
from django_redislock.core.drivers.lock import Lock
from django_redislock.core.drivers.semaphore import Semaphore
from django_redislock.core.engine.keys import KeySpace
from django_redislock.core.ops.inspection import BUSIEST, HeldLock, list_locks, summarize
from django_redislock.locking.factories import get_lock, get_semaphore
from django_redislock.ops.metrics import label_of
from tests.faults.harness import wait_until

KS = KeySpace("redislock")
# Long enough for any wait below; every waiter is let in well before.
WAIT = 30.0


pytestmark = pytest.mark.usefixtures("fresh_clients")


def take(r: redis.Redis, name: str, template: str | None = None, *, label: str = "") -> Lock:
    lock = Lock(r, name, ttl=300, wait=0, keyspace=KS, label=label)
    lock.metric_name = template
    assert lock.acquire()
    return lock


def permit(
    r: redis.Redis, name: str, limit: int, template: str | None = None, *, wait: float = 0
) -> Semaphore:
    sem = Semaphore(r, name, limit, ttl=300, wait=wait, keyspace=KS)
    sem.metric_name = template
    assert sem.acquire()
    return sem


class Waiters:
    """Callers queued on held locks or semaphores, each in a thread of its own.

    Each takes what it waits for when it is handed over and gives it back at
    once; ``join`` checks that every one of them got in.
    """

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.got: list[str] = []
        self._mutex = threading.Lock()

    def queue(self, make: Callable[[], Lock | Semaphore], count: int = 1) -> None:
        for _ in range(count):
            thread = threading.Thread(target=self._wait, args=(make,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _wait(self, make: Callable[[], Lock | Semaphore]) -> None:
        handle = make()
        if handle.acquire():
            handle.release()
            with self._mutex:
                self.got.append(handle.name)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(WAIT + 5)
            assert not thread.is_alive()
        assert len(self.got) == len(self.threads)


def queued(r: redis.Redis, count: int) -> None:
    """Until ``count`` callers wait in all, as the listing counts them."""
    wait_until(
        lambda: sum(row.waiters for row in list_locks(r, KS)) == count,
        10,
        f"{count} waiters queued",
    )


# -- what an acquire stores --------------------------------------------------------
def owner_of(r: redis.Redis, lock: Lock) -> dict[str, Any]:
    raw = r.hget(lock.keys.lease, "o")
    assert raw is not None
    data = json.loads(raw)
    assert isinstance(data, dict)
    return data


def test_the_template_is_stored_under_one_short_key(r: redis.Redis) -> None:
    """docs/operating.rst: "``t`` in the owner JSON": 7 bytes plus the template
    per acquire, "and nothing for a lock without one" (the next test)."""
    lock = take(r, "purchase:42", "purchase:{product_id}", label="POST /buy/42")
    data = owner_of(r, lock)
    assert data == {
        "host": data["host"],
        "pid": os.getpid(),
        "thread": "MainThread",
        "label": "POST /buy/42",
        "t": "purchase:{product_id}",
    }
    # The whole cost: the key, its quotes, a colon and a comma, and the template.
    raw = r.hget(lock.keys.lease, "o")
    assert raw is not None
    without = base._owner_json(os.getpid(), "MainThread", "POST /buy/42")
    assert len(raw) - len(without.encode()) == len(',"t":""') + len("purchase:{product_id}")
    lock.release()


def test_an_ad_hoc_lock_stores_no_template_at_all(r: redis.Redis) -> None:
    lock = take(r, "adhoc:1")
    assert "t" not in owner_of(r, lock)
    lock.release()


def test_a_template_that_is_not_a_str_is_left_out(r: redis.Redis) -> None:
    lock = Lock(r, "odd", ttl=300, wait=0, keyspace=KS)
    lock.metric_name = ["not", "hashable"]  # type: ignore[assignment]
    assert lock.acquire()
    assert "t" not in owner_of(r, lock)
    lock.release()


def test_the_owner_json_is_still_made_once_per_process_thread_label_and_template(
    r: redis.Redis,
) -> None:
    base._owner_json.cache_clear()
    for _ in range(3):
        for template in ("purchase:{product_id}", None):
            lock = Lock(r, "cached", ttl=300, wait=0, keyspace=KS, label="l")
            lock.metric_name = template
            assert lock.acquire()
            lock.release()
    info = base._owner_json.cache_info()
    assert (info.misses, info.hits) == (2, 4)


def test_semaphore_permits_store_their_template(r: redis.Redis) -> None:
    sem = permit(r, "exports:alice", 2, "exports-per-user")
    raw = r.hget(sem.keys.state, f"o:{sem.token}")
    assert raw is not None and json.loads(raw)["t"] == "exports-per-user"
    [row] = list_locks(r, KS)
    assert row.template == "exports-per-user"
    assert [h.template for h in row.holders] == ["exports-per-user"]
    sem.release()


# -- grouping ----------------------------------------------------------------------
def test_several_templates_with_holders_and_queued_waiters(r: redis.Redis) -> None:
    holders: list[Lock | Semaphore] = [
        take(r, "purchase:1", "purchase:{product_id}"),
        take(r, "purchase:2", "purchase:{product_id}"),
        take(r, "purchase:3", "purchase:{product_id}"),
        take(r, "report:mon", "report:{day}"),
        take(r, "adhoc:x"),
        permit(r, "exports:alice", 1, "exports-per-user"),
        permit(r, "exports:bob", 2, "exports-per-user"),
        permit(r, "exports:bob", 2, "exports-per-user"),
    ]
    waiters = Waiters()

    def lock(name: str) -> Callable[[], Lock]:
        return lambda: Lock(r, name, ttl=300, wait=WAIT, keyspace=KS)

    try:
        waiters.queue(lock("purchase:1"), 2)
        waiters.queue(lock("purchase:3"))
        waiters.queue(lock("adhoc:x"))
        waiters.queue(lambda: Semaphore(r, "exports:alice", 1, ttl=300, wait=WAIT, keyspace=KS))
        queued(r, 5)
        rows = list_locks(r, KS)
        summary = summarize(rows)
        got = [
            (s.template, s.kind, s.held, s.holders, s.waiters, [b.name for b in s.busiest])
            for s in summary
        ]
        assert got == [
            ("purchase:{product_id}", "lock", 3, 3, 3, ["purchase:1", "purchase:3", "purchase:2"]),
            ("exports-per-user", "semaphore", 2, 3, 1, ["exports:alice", "exports:bob"]),
            (None, "lock", 1, 1, 1, ["adhoc:x"]),
            ("report:{day}", "lock", 1, 1, 0, ["report:mon"]),
        ]
        for s in summary:
            members = [row for row in rows if row.template == s.template]
            assert s.longest_held == max(row.held_for for row in members)
    finally:
        for handle in holders:
            handle.release()
        waiters.join()
    assert list_locks(r, KS) == []


def test_busiest_names_are_the_most_waited_for_then_the_longest_held(r: redis.Redis) -> None:
    rows = [
        HeldLock("a:1", "lock", "h", 1, "t", "", 1, 5.0, 10.0, 0, (), 1, template="a"),
        HeldLock("a:2", "lock", "h", 1, "t", "", 2, 9.0, 10.0, 0, (), 1, template="a"),
        HeldLock("a:3", "lock", "h", 1, "t", "", 3, 1.0, 10.0, 4, (), 1, template="a"),
        HeldLock("a:4", "lock", "h", 1, "t", "", 4, 2.0, 10.0, 0, (), 1, template="a"),
    ]
    [s] = summarize(rows)
    assert BUSIEST == 3
    assert [b.name for b in s.busiest] == ["a:3", "a:2", "a:1"]
    assert [b.name for b in summarize(rows, busiest=1)[0].busiest] == ["a:3"]
    assert (s.held, s.holders, s.longest_held, s.waiters) == (4, 0, 9.0, 4)
    with pytest.raises(ValueError, match="busiest must be a whole number, 0 or more"):
        summarize(rows, busiest=-1)


def test_the_same_template_on_a_lock_and_a_semaphore_makes_two_lines(r: redis.Redis) -> None:
    lock = take(r, "exports:1", "exports")
    sem = permit(r, "exports:2", 3, "exports")
    assert [(s.template, s.kind) for s in summarize(list_locks(r, KS))] == [
        ("exports", "lock"),
        ("exports", "semaphore"),
    ]
    lock.release()
    sem.release()


# -- entries written before templates were stored -------------------------------------
OLD_OWNER = '{"host":"h","pid":1,"thread":"t","label":"old"}'


def test_an_old_lease_without_a_template_groups_with_the_ad_hoc_ones(r: redis.Redis) -> None:
    old = take(r, "purchase:7", "purchase:{product_id}")
    r.hset(old.keys.lease, "o", OLD_OWNER)
    new = take(r, "purchase:8", "purchase:{product_id}")
    adhoc = take(r, "adhoc:1")
    rows = {row.name: row for row in list_locks(r, KS)}
    assert rows["purchase:7"].template is None
    assert (rows["purchase:7"].label, rows["purchase:7"].host) == ("old", "h")
    assert [(s.template, s.held) for s in summarize(rows.values())] == [
        (None, 2),
        ("purchase:{product_id}", 1),
    ]
    for lock in (old, new, adhoc):
        lock.release()


@pytest.mark.parametrize(
    "owner",
    [
        '{"host":"h","pid":1,"thread":"t","label":"l","t":""}',
        '{"host":"h","pid":1,"thread":"t","label":"l","t":7}',
        '{"host":"h","pid":1,"thread":"t","label":"l","t":null}',
        "not json",
        "",
    ],
)
def test_a_template_that_is_empty_or_not_text_counts_as_none(r: redis.Redis, owner: str) -> None:
    lock = take(r, "odd:1", "odd")
    r.hset(lock.keys.lease, "o", owner)
    [row] = list_locks(r, KS)
    assert row.template is None and row.holders[0].template is None
    lock.release()


def test_a_semaphore_goes_by_its_first_permit_that_has_a_template(r: redis.Redis) -> None:
    old = permit(r, "exports:carol", 3, "exports-per-user")
    new = permit(r, "exports:carol", 3, "exports-per-user")
    # The longest-held permit, which speaks for the row, is of the old format.
    acquired = int(r.hget(old.keys.state, f"a:{old.token}") or 0)
    r.hset(
        old.keys.state, mapping={f"o:{old.token}": OLD_OWNER, f"a:{old.token}": acquired - 60_000}
    )
    [row] = list_locks(r, KS)
    assert [h.template for h in row.holders] == [None, "exports-per-user"]
    assert row.template == "exports-per-user"
    old.release()
    new.release()


# -- what the Django layer stores ------------------------------------------------------
def test_the_django_layer_stores_its_templates(r: redis.Redis) -> None:
    entered, go = threading.Event(), threading.Event()

    @redis_locked("purchase:{product_id}", wait=WAIT)
    def buy(product_id: int) -> None:
        entered.set()
        assert go.wait(WAIT)

    holder = threading.Thread(target=buy, args=(42,))
    holder.start()
    waiter = threading.Thread(target=buy, args=(42,))
    try:
        assert entered.wait(WAIT)
        waiter.start()
        queued(r, 1)
        named = get_lock("job:1", metric_name="job")
        assert named.acquire()
        # The same name metrics give it.
        assert label_of(named) == "job"
        sem = get_semaphore("uploads:alice", 2, metric_name="uploads-per-user")
        assert sem.acquire()
        with redis_lock("job:2", metric_name="job"), redis_lock("adhoc:3"):
            got = [(s.template, s.kind, s.held, s.waiters) for s in summarize(list_locks(r, KS))]
        assert got == [
            ("purchase:{product_id}", "lock", 1, 1),
            ("job", "lock", 2, 0),
            ("uploads-per-user", "semaphore", 1, 0),
            (None, "lock", 1, 0),
        ]
        named.release()
        sem.release()
    finally:
        go.set()
        holder.join(WAIT)
        if waiter.ident is not None:
            waiter.join(WAIT)
    assert not holder.is_alive() and not waiter.is_alive()


@pytest.mark.urls("tests.urls_throttle")
def test_a_throttling_rule_stores_its_name(settings: Any, r: redis.Redis) -> None:
    from django.test import Client

    from tests.test_middleware import MW
    from tests.testapp import views_throttle

    middleware = list(settings.MIDDLEWARE)
    at = middleware.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1
    settings.MIDDLEWARE = [*middleware[:at], MW, *middleware[at:]]
    rule = {"name": "reports", "path": r"^/reports/", "limit": 2, "wait": 0}
    settings.REDISLOCK = {"THROTTLE": [rule]}
    entered = views_throttle.entered.setdefault("summary", threading.Event())
    gate = views_throttle.gates.setdefault("summary", threading.Event())
    statuses: list[int] = []

    def request() -> None:
        statuses.append(Client().get("/reports/slow/", {"gate": "summary"}).status_code)

    thread = threading.Thread(target=request)
    thread.start()
    try:
        assert entered.wait(WAIT)
        [row] = list_locks(r, KS)
        assert (row.name, row.kind, row.template) == ("throttle:reports", "semaphore", "reports")
        assert row.label == "GET /reports/slow/"
    finally:
        gate.set()
        thread.join(WAIT)
        views_throttle.entered.pop("summary", None)
        views_throttle.gates.pop("summary", None)
    assert statuses == [200]
