"""The admin page's "By template" table, above the rows."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import redis
from django.test import Client, override_settings
from django.urls import reverse

from django_redislock.core.drivers.lock import Lock
from django_redislock.core.drivers.semaphore import Semaphore
from django_redislock.core.engine.keys import KeySpace
from tests.test_summary import WAIT, Waiters, queued

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_clients")]

KS = KeySpace("redislock")
COLUMNS = ["Template", "Kind", "Held", "Holders", "Longest held", "Waiters", "Busiest names"]


@pytest.fixture
def page(superuser_client: Client) -> Client:
    return superuser_client


class _Summary(HTMLParser):
    """The summary table: its header, and per row {td class: text}, and links."""

    def __init__(self) -> None:
        super().__init__()
        self.found = False
        self.head: list[str] = []
        self.rows: list[dict[str, str]] = []
        self.links: list[list[str]] = []
        self.headings: list[str] = []
        self._inside = False
        self._cell: str | None = None
        self._text: list[str] = []
        self._heading: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "h2":
            self._heading = []
        if tag == "table" and a.get("id") == "redislock-summary":
            self._inside = self.found = True
        if not self._inside:
            return
        if tag == "tr":
            self.rows.append({})
            self.links.append([])
        elif tag in ("td", "th"):
            self._cell, self._text = a.get("class", "th"), []
        elif tag == "a":
            self.links[-1].append(a["href"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "h2" and self._heading is not None:
            self.headings.append("".join(self._heading).strip())
            self._heading = None
        if not self._inside:
            return
        if tag == "table":
            self._inside = False
        elif tag == "th" and self._cell is not None:
            self.head.append("".join(self._text).strip())
            self._cell = None
        elif tag == "td" and self._cell is not None:
            self.rows[-1][self._cell] = " ".join("".join(self._text).split())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._heading is not None:
            self._heading.append(data)
        if self._cell is not None:
            self._text.append(data)


def summary_of(response: Any) -> _Summary:
    parsed = _Summary()
    parsed.feed(response.content.decode())
    parsed.rows = [row for row in parsed.rows if row]
    parsed.links = parsed.links[1:]  # the header row has none
    return parsed


def take(r: redis.Redis, name: str, template: str | None) -> Lock:
    lock = Lock(r, name, ttl=600, wait=0, keyspace=KS)
    lock.metric_name = template
    assert lock.acquire()
    return lock


def test_summary_above_the_rows(page: Client, r: redis.Redis) -> None:
    handles: list[Lock | Semaphore] = [
        take(r, "purchase:1", "purchase:{product_id}"),
        take(r, "purchase:2", "purchase:{product_id}"),
        take(r, "adhoc", None),
    ]
    sem = Semaphore(r, "exports:alice", 3, ttl=600, wait=0, keyspace=KS)
    sem.metric_name = "exports-per-user"
    assert sem.acquire()
    handles.append(sem)
    waiters = Waiters()
    waiters.queue(lambda: Lock(r, "purchase:2", ttl=600, wait=WAIT, keyspace=KS), 2)
    try:
        queued(r, 2)
        response = page.get(reverse("admin:django_redislock_locks"))
        assert response.status_code == 200
        html = response.content.decode()
        summary = summary_of(response)
        assert summary.head == COLUMNS
        assert summary.headings[:2] == ["By template", "Held"]
        assert html.index('id="redislock-summary"') < html.index('id="result_list"')
        got = [
            [row["template"], row["kind"], row["held"], row["holders"], row["waiters"]]
            for row in summary.rows
        ]
        assert got == [
            ["purchase:{product_id}", "lock", "2", "-", "2"],
            ["exports-per-user", "semaphore", "1", "1", "0"],
            ["(no template)", "lock", "1", "-", "0"],
        ]
        busiest = summary.rows[0]["busiest"]
        assert busiest.startswith("purchase:2 (2 waiting, ")
        assert " purchase:1 (0 waiting, " in busiest
        # Each busiest name links to the page filtered to exactly that name.
        link = urlsplit(summary.links[0][0])
        assert link.path == reverse("admin:django_redislock_locks")
        assert parse_qs(link.query) == {"pattern": ["purchase:2"], "literal": ["1"]}
        filtered = summary_of(page.get(summary.links[0][0]))
        assert [(row["template"], row["held"]) for row in filtered.rows] == [
            ("purchase:{product_id}", "1")
        ]
    finally:
        for handle in handles:
            handle.release()
        waiters.join()


def test_templates_and_names_are_escaped(page: Client, r: redis.Redis) -> None:
    lock = take(r, "<b>x</b>\n:1", "<script>{id}")
    lone = take(r, "lone\udcff", "<script>{id}")
    response = page.get(reverse("admin:django_redislock_locks"))
    html = response.content.decode()
    assert "<script>{id}" not in html and "<b>x</b>" not in html
    summary = summary_of(response)
    [row] = summary.rows
    assert row["template"] == "<script>{id}"
    assert "<b>x</b>\\n:1 (0 waiting, " in row["busiest"]
    assert "lone\\udcff (0 waiting, " in row["busiest"]
    # A lone surrogate has no URL form: that name is shown without a link.
    assert len(summary.links[0]) == 1
    lock.release()
    lone.release()


def test_no_summary_when_nothing_is_held(page: Client, r: redis.Redis) -> None:
    response = page.get(reverse("admin:django_redislock_locks"))
    assert not summary_of(response).found
    assert "No locks held." in response.content.decode()


def test_no_summary_when_redis_is_down(page: Client, redis_factory: Any) -> None:
    server = redis_factory().start()
    caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": server.url}}
    with override_settings(CACHES=caches):
        server.kill()
        response = page.get(reverse("admin:django_redislock_locks"))
    assert response.status_code == 503
    assert not summary_of(response).found
