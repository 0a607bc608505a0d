"""docs/operating.rst: the sample of ``manage.py redislocks list`` is what it prints.

The same holders as the sample are made the way a project makes them (a
decorated view, a throttling middleware's permit, ``get_semaphore(label=...)``
and callers waiting), then the command's table is compared with the
sample's cell by cell. Host, process, thread, fence and times differ from
run to run: those cells are compared by shape.
"""

from __future__ import annotations

import re
import threading
import time
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path

from django_redislock import connection, redis_locked
from django_redislock.locking.factories import get_lock, get_semaphore
from tests.servers import RedisServer
from tests.test_library_logging import _run

ROOT = Path(__file__).resolve().parents[1]
OPERATING = (ROOT / "docs" / "operating.rst").read_text()
TIME = re.compile(r"^(\d+s|\d+m\d\ds)$")
OWNER = re.compile(r"^[^\s:]+:\d+/\S.*$")
IDENT = re.compile(r"^[0-9a-f]{16}$")
HOLDERS = re.compile(r"^\d+ holders?$")


def sample() -> list[str]:
    """The lines the docs show under ``$ python manage.py redislocks list``:
    the table, a blank line, then the waiters (the block ends at the next
    blank line)."""
    block = OPERATING.split("    $ python manage.py redislocks list\n", 1)[1]
    lines = []
    blanks = 0
    for line in block.splitlines():
        if not line.strip():
            blanks += 1
            if blanks == 2:
                break
            lines.append("")
            continue
        assert line.startswith("    "), line
        lines.append(line[4:])
    return lines


def columns(header: str) -> list[int]:
    """Where each column starts: a header cell may hold one space ("HELD FOR")."""
    return [m.start() for m in re.finditer(r"(?<!\S)\S+(?: \S+)*", header)]


def cells(starts: list[int], line: str) -> list[str]:
    bounds = [*starts, None]
    return [line[bounds[i] : bounds[i + 1]] for i in range(len(starts))]


def shape(column: str, cell: str) -> str:
    """What must be equal between the docs and a run, for one cell."""
    value = cell.strip()
    if not value:
        return ""
    if column in ("HELD FOR", "LEASE LEFT", "WAITED", "GIVES UP IN"):
        return "time" if TIME.match(value) else value
    if column == "ID" and IDENT.match(value):
        return "id"
    if column == "FENCE" and value.isdigit():
        return "token"
    if column == "OWNER" and OWNER.match(value):
        return "host:pid/thread"
    return value


# -- what the sample shows, held as a project would hold it ------------------------


# The view of a project's shop/views.py: the decorator labels a lock with the
# callable's module and qualified name.
def report(request: HttpRequest, pk: int) -> HttpResponse:
    waiters = [threading.Thread(target=wait_for_report, args=(pk,)) for _ in range(2)]
    for waiter in waiters:
        waiter.start()
    queue = get_lock(f"report:{pk}").keys.queue
    client = connection.get_client()
    deadline = time.monotonic() + 10
    while client.llen(queue) != 2:
        assert time.monotonic() < deadline, "the waiters did not queue"
        time.sleep(0.01)
    out = StringIO()
    call_command("redislocks", "list", stdout=out)
    report_waiters.extend(waiters)
    return HttpResponse(out.getvalue(), content_type="text/plain")


report.__module__ = "shop.views"
report = redis_locked("report:{pk}", timeout=30)(report)
report_waiters: list[threading.Thread] = []


def server_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def wait_for_report(pk: int) -> None:
    lock = get_lock(f"report:{pk}", timeout=5, wait=20)
    if lock.acquire():
        lock.release()


def buy(request: HttpRequest, pk: int) -> HttpResponse:
    # Runs under the throttling middleware's permit; the report is taken meanwhile.
    return report(request, pk=42)


urlpatterns = [path("products/<int:pk>/buy/", buy)]


@pytest.mark.urls(__name__)
def test_the_list_sample_is_what_the_command_prints(settings: Any) -> None:
    settings.MIDDLEWARE = [
        *settings.MIDDLEWARE,
        "django_redislock.middleware.ConcurrencyLimitMiddleware",
    ]
    settings.REDISLOCK = {
        "THROTTLE": [{"name": "buy", "path": r"^/products/", "limit": 10, "per": "global"}]
    }
    connection.reset()
    exports = [
        get_semaphore("exports", 5, label="nightly export"),
        get_semaphore("exports", 5, label="export csv"),
    ]
    try:
        assert exports[0].acquire()
        # The longest-held permit comes first: let the server's clock (whole
        # milliseconds in the listing) move on before the second one.
        client = connection.get_client()
        first = server_ms(client)
        deadline = time.monotonic() + 5
        while server_ms(client) < first + 2:
            assert time.monotonic() < deadline
        assert exports[1].acquire()
        response = Client().post("/products/7/buy/")
        assert response.status_code == 200, response.content
        printed = response.content.decode().splitlines()
    finally:
        for permit in exports:
            permit.release()
        for waiter in report_waiters:
            waiter.join(30)
        report_waiters.clear()
        connection.reset()

    documented = sample()
    assert len(printed) == len(documented), "\n".join(printed)
    # Two tables: the holders, then (after a blank line and a title) the waiters.
    cut = printed.index("")
    assert documented.index("") == cut and printed[cut + 1] == documented[cut + 1]
    tables = [
        (printed[:cut], documented[:cut]),
        (printed[cut + 2 :], documented[cut + 2 :]),
    ]
    for table, doc_table in tables:
        same_table(table, doc_table)


def same_table(printed: list[str], documented: list[str]) -> None:
    ours, theirs = columns(printed[0]), columns(documented[0])
    names = printed[0].split()
    assert documented[0].split() == names  # the same columns, in the same order
    headings = [cells(ours, printed[0])[i].strip() for i in range(len(ours))]
    for got, want in zip(printed[1:], documented[1:], strict=True):
        mine, doc = cells(ours, got), cells(theirs, want)
        # The docs' columns line up as the command lines them up: no cell
        # runs into the next one.
        assert all(not c or not c[0].isspace() or not c.strip() for c in doc), want
        assert [shape(h, c) for h, c in zip(headings, mine, strict=True)] == [
            shape(h, c) for h, c in zip(headings, doc, strict=True)
        ], f"\nprinted:    {got}\ndocumented: {want}"


def test_a_root_handler_gets_the_records_too(redis_server: RedisServer) -> None:
    """docs/operating.rst, Logging: nothing is printed until LOGGING gives
    ``django_redislock`` a handler; a handler of the root logger gets them too."""
    assert "a handler on the root logger gets its records too" in " ".join(OPERATING.split())
    root = (
        '{"version": 1, "handlers": {"err": {"class": "logging.StreamHandler"}}, '
        '"root": {"handlers": ["err"], "level": "INFO"}}'
    )
    run = _run(redis_server, root)
    assert run.returncode == 0, run.stderr
    assert "force-released lock 'held-by-a-crashed-worker'" in run.stderr
