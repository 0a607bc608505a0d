"""Read-write locks for operators: ``list_locks``, ``manage.py redislocks`` and the admin page."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from io import StringIO
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from django_redislock.core import KeySpace, ReadWriteLock
from django_redislock.core.exceptions import LockLost
from django_redislock.core.ops.force import release
from django_redislock.core.ops.inspection import KINDS, find, list_locks, summarize
from django_redislock.ops.admin import selection
from tests.helpers_oracles import wait_until

KS = KeySpace("redislock")
OWNER = f"{socket.gethostname()}:{os.getpid()}/MainThread"
TIME = re.compile(r"^(\d+s|\d+m\d\ds)$")


pytestmark = pytest.mark.usefixtures("fresh_clients")


def hold(client: redis.Redis, mode: str, name: str = "doc", label: str = "") -> ReadWriteLock:
    lock = ReadWriteLock(client, name, mode, ttl=300, wait=0, keyspace=KS, label=label)  # type: ignore[arg-type]
    assert lock.acquire()
    return lock


def run(*args: str) -> str:
    out = StringIO()
    call_command("redislocks", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_list_shows_readers_then_the_writer(r: redis.Redis) -> None:
    assert "rwlock" in KINDS
    a, b = hold(r, "read", label="report"), hold(r, "read")
    (row,) = list_locks(r, KS)
    assert row.kind == "rwlock" and row.name == "doc" and row.fence is None
    assert {h.token for h in row.holders} == {a.token, b.token}
    assert {h.mode for h in row.holders} == {"read"}
    assert row.limit is None and row.waiters == 0
    data = json.loads(json.dumps(row.as_dict()))
    assert data["kind"] == "rwlock" and data["holders"] == 2 and data["fence"] is None
    a.release()
    b.release()
    assert list_locks(r, KS) == []
    w = hold(r, "write", label="rebuild")
    (row,) = list_locks(r, KS, kinds=("rwlock",))
    assert row.fence == w.fence and row.label == "rebuild"
    assert [h.mode for h in row.holders] == ["write"]
    assert list_locks(r, KS, kinds=("lock", "semaphore")) == []
    rows, missing = find(r, KS, ["doc", "nope"])
    assert [x.kind for x in rows] == ["rwlock"] and missing == ["nope"]
    assert [s.kind for s in summarize(rows)] == ["rwlock"]
    w.release()


def test_waiters_are_counted(r: redis.Redis) -> None:
    reader = hold(r, "read")
    waiter = ReadWriteLock(r, "doc", "write", wait=20, keyspace=KS)
    thread = threading.Thread(target=lambda: waiter.acquire() and waiter.release())
    thread.start()
    wait_until(lambda: r.llen(KS.rwlock("doc").queue) == 1)
    (row,) = list_locks(r, KS)
    assert row.waiters == 1
    # Force-release wakes the waiting writer; the reader learns of it at release.
    result = release(r, KS, [row])
    assert result.released == [row]
    thread.join(10)
    with pytest.raises(LockLost):
        reader.release()


def test_command_table_lines(r: redis.Redis) -> None:
    hold(r, "read", "catalogue", label="browse")
    hold(r, "read", "catalogue")
    w = hold(r, "write", "prices", label="reprice")
    lines = run("list").splitlines()
    assert lines[0].split() == [
        "NAME",
        "KIND",
        "HOLDERS",
        "FENCE",
        "HELD",
        "FOR",
        "LEASE",
        "LEFT",
        "RENEWED",
        "WAITERS",
        "ID",
        "OWNER",
        "LABEL",
    ]
    catalogue = lines[1].split()
    assert catalogue[:4] == ["catalogue", "rwlock", "2", "readers"] and catalogue[4] == "-"
    assert catalogue[-3:] == ["0", "2", "readers"]
    readers = [line.split() for line in lines[2:4]]
    # held for, lease left, renewed, id, owner (label)
    assert sorted(len(x) for x in readers) == [5, 6]
    assert all(TIME.match(x[0]) and x[2] == "off" and x[4] == OWNER for x in readers)
    assert any(x[5:] == ["browse"] for x in readers)
    prices = lines[4].split()
    assert prices[:4] == ["prices", "rwlock", "writer", str(w.fence)]
    assert prices[-5:-3] == ["off", "0"] and prices[-2:] == [OWNER, "reprice"]
    assert len(lines) == 5
    data = json.loads(run("list", "--format", "json"))["locks"]
    assert [(x["name"], x["kind"], x["holders"]) for x in data] == [
        ("catalogue", "rwlock", 2),
        ("prices", "rwlock", 1),
    ]
    assert run("list", "--kind", "rwlock") == run("list")
    assert run("list", "--kind", "lock") == "No locks held.\n"


def test_command_clear_releases_readers_and_writer(r: redis.Redis) -> None:
    reader = hold(r, "read", "catalogue")
    writer = hold(r, "write", "prices")
    out = run("clear", "catalogue", "prices", "--noinput")
    assert "Released rwlock 'catalogue' (1 reader, longest held by" in out
    assert f"Released rwlock 'prices' (writer, fence {writer.fence}, held by {OWNER}" in out
    assert list_locks(r, KS) == []
    for lock in (reader, writer):
        with pytest.raises(LockLost):
            lock.release()


@pytest.mark.django_db
def test_admin_page_lists_readers_and_releases(r: redis.Redis, django_user_model: Any) -> None:
    url = reverse("admin:django_redislock_locks")
    root = django_user_model.objects.create_user("root", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(root)
    hold(r, "read", "catalogue", label="browse")
    hold(r, "read", "catalogue", label="search")
    w = hold(r, "write", "prices")
    page = client.get(url).content.decode()
    assert "rwlock 2 readers" in page and page.count('<td class="kind">reader</td>') == 2
    assert "browse" in page and "search" in page
    assert "rwlock writer" in page and str(w.fence) in page
    rows = {row.name: row for row in list_locks(r, KS)}
    confirm = client.post(url, {"selected": selection(rows["prices"])}).content.decode()
    assert f"writer, fence {w.fence}" in confirm
    response = client.post(
        url, {"selected": selection(rows["catalogue"]), "confirm": "yes"}, follow=True
    )
    assert "Released rwlock &#x27;catalogue&#x27;." in response.content.decode()
    assert [row.name for row in list_locks(r, KS)] == ["prices"]


def test_hostile_and_long_names_are_listed_exactly(r: redis.Redis) -> None:
    names = ["a\nb", "{brace}", "glob*?[x]", "ü\udcff", "n" * 500]
    held = [hold(r, "read" if i % 2 else "write", name) for i, name in enumerate(names)]
    rows = list_locks(r, KS)
    assert sorted(row.name for row in rows) == sorted(names)
    assert [row.name for row in list_locks(r, KS, "glob*?[x]", literal=True)] == ["glob*?[x]"]
    assert not list_locks(r, KS, "n" * 499, literal=True)
    for lock in held:
        lock.release()
    assert list_locks(r, KS) == []
