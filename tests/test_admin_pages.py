"""The "Held locks" admin page at scale: pages, a total, natural order, the
time Redis was read, and an optional reload.

A thousand held names made a page of 650 KB sorted as strings (``cart:0,
cart:1, cart:10, cart:100``), with no total and no time. The last test lays
the paginated page out in a headless Chromium (skipped where none is installed).
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from pathlib import Path

import pytest
import redis
from django.test import Client
from django.urls import reverse

from django_redislock.core.drivers.lock import Lock
from django_redislock.core.engine.keys import KeySpace
from django_redislock.ops.pages import PAGE_SIZE, REFRESH_CHOICES
from tests.test_admin_layout import CHROMIUM, chromium_dom

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_clients")]

KS = KeySpace("redislock")
URL = "/admin/django_redislock/locks/"
NAME = re.compile(r'<td class="name"><code>([^<]*)</code></td>')


@pytest.fixture
def page(superuser_client: Client) -> Client:
    return superuser_client


@pytest.fixture
def carts(r: redis.Redis) -> list[Lock]:
    """250 held locks, ``cart:0`` to ``cart:249``, taken in a scrambled order."""
    locks = []
    for i in sorted(range(250), key=lambda n: str(n)):
        lock = Lock(r, f"cart:{i}", ttl=600, wait=0, keyspace=KS)
        lock.metric_name = "cart:{id}"
        assert lock.acquire()
        locks.append(lock)
    return locks


def names(html: str) -> list[str]:
    return NAME.findall(html)


def test_a_page_of_names_in_natural_order_under_a_total(page: Client, carts: list[Lock]) -> None:
    assert reverse("admin:django_redislock_locks") == URL
    html = page.get(URL).content.decode()
    assert PAGE_SIZE == 100
    assert names(html) == [f"cart:{i}" for i in range(100)]
    assert '<p class="redislock-total">250 held; showing 1 to 100.</p>' in html
    # The summary covers every name, not only this page's.
    assert re.search(r'<td class="held">250</td>', html)
    links = re.findall(r'<p class="paginator redislock-pages">(.*?)</p>', html, re.S)
    assert len(links) == 1
    assert '<span class="this-page">1</span>' in links[0]
    assert f'<a href="{URL}?p=2">2</a>' in links[0]
    assert f'<a href="{URL}?p=3">3</a>' in links[0]
    html = page.get(URL + "?p=3").content.decode()
    assert names(html) == [f"cart:{i}" for i in range(200, 250)]
    assert "250 held; showing 201 to 250." in html
    # Past the end: the last page; not a number: the first.
    assert names(page.get(URL + "?p=99").content.decode())[0] == "cart:200"
    assert names(page.get(URL + "?p=x").content.decode())[0] == "cart:0"


def test_the_pattern_follows_the_pages(page: Client, carts: list[Lock]) -> None:
    html = page.get(URL + "?pattern=cart:1*").content.decode()
    # cart:1, cart:10-19, cart:100-199: 111 names.
    assert "111 held matching <code>cart:1*</code>; showing 1 to 100." in html
    assert names(html)[:3] == ["cart:1", "cart:10", "cart:11"]
    assert f'<a href="{URL}?pattern=cart%3A1%2A&amp;p=2">2</a>' in html
    html = page.get(URL + "?pattern=cart:1*&p=2").content.decode()
    assert names(html) == [f"cart:{i}" for i in range(189, 200)]


def test_one_page_has_no_page_links(page: Client, r: redis.Redis) -> None:
    for name in ["b:10", "b:9", "a"]:
        assert Lock(r, name, ttl=600, wait=0, keyspace=KS).acquire()
    html = page.get(URL).content.decode()
    assert names(html) == ["a", "b:9", "b:10"]
    assert '<p class="redislock-total">3 held.</p>' in html
    assert '<p class="paginator redislock-pages">' not in html


def test_a_thousand_names_make_a_small_page(page: Client, r: redis.Redis) -> None:
    """The report: 1,000 names made a page of 650 KB."""
    for i in range(1000):
        lock = Lock(r, f"cart:{i}", ttl=600, wait=0, keyspace=KS, label=f"POST /carts/{i}/")
        assert lock.acquire()
    html = page.get(URL).content.decode()
    assert "1000 held; showing 1 to 100." in html
    assert len(html.encode()) < 120_000


def test_the_page_says_when_redis_was_read(page: Client, carts: list[Lock]) -> None:
    html = page.get(URL).content.decode()
    found = re.search(r'Read from Redis at <time datetime="([^"]+)">([^<]+)</time>\.', html)
    assert found, html
    instant = datetime.strptime(found.group(1), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
    # Redis's clock, on this same machine.
    assert abs(instant - time.time()) < 60
    assert found.group(2) == found.group(1).replace("T", " ")[:19] + " UTC"


def test_nothing_held_still_says_when(page: Client) -> None:
    html = page.get(URL).content.decode()
    assert "Read from Redis at <time datetime=" in html
    assert "No locks held." in html


@pytest.mark.parametrize("seconds", [s for s in REFRESH_CHOICES if s])
def test_reload_on_request_and_kept_by_every_link(
    page: Client, carts: list[Lock], seconds: int
) -> None:
    html = page.get(URL).content.decode()
    assert 'http-equiv="refresh"' not in html  # off unless asked
    html = page.get(f"{URL}?refresh={seconds}&p=2").content.decode()
    assert f'<meta http-equiv="refresh" content="{seconds}">' in html
    assert f'<option value="{seconds}" selected>{seconds} s</option>' in html
    assert f'<a href="{URL}?p=3&amp;refresh={seconds}">3</a>' in html
    # The filter and the release form carry it too.
    assert f'<input type="hidden" name="refresh" value="{seconds}">' in html
    assert '<input type="hidden" name="p" value="2">' in html


@pytest.mark.parametrize("asked", ["1", "7", "-5", "x", "3600"])
def test_only_the_offered_intervals_reload(page: Client, carts: list[Lock], asked: str) -> None:
    html = page.get(f"{URL}?refresh={asked}").content.decode()
    assert 'http-equiv="refresh"' not in html
    assert '<option value="0" selected>never</option>' in html


def test_release_returns_to_the_page_with_its_reload(page: Client, carts: list[Lock]) -> None:
    html = page.get(URL + "?refresh=30").content.decode()
    value = re.search(r'name="selected" value="([^"]+)"', html)
    assert value
    response = page.post(
        URL, {"selected": value.group(1), "confirm": "yes", "refresh": "30", "pattern": ""}
    )
    assert response.status_code == 302
    assert response["Location"] == URL + "?refresh=30"


PAGER = """<script>
window.addEventListener("load", function () {
  var pages = document.querySelector("p.paginator.redislock-pages");
  var box = pages.getBoundingClientRect();
  document.body.setAttribute("data-page-width", document.documentElement.scrollWidth);
  document.body.setAttribute("data-pages-visible", box.height > 0 && box.right <= 1280);
  var rows = document.querySelectorAll("#result_list tbody tr");
  document.body.setAttribute("data-rows", rows.length);
  var status = document.getElementById("redislock-status");
  document.body.setAttribute("data-status", status.innerText);
});
</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed")
def test_the_paginated_page_renders_in_chromium(
    page: Client, carts: list[Lock], tmp_path: Path
) -> None:
    html = page.get(URL + "?refresh=60&p=2").content.decode()
    # The reload would fire in a browser left open; not within this page's load.
    dom, stderr = chromium_dom(html, tmp_path, PAGER)
    width = re.search(r'data-page-width="(\d+)"', dom)
    assert width, stderr[-2000:]
    assert int(width.group(1)) <= 1280
    assert 'data-pages-visible="true"' in dom
    assert 'data-rows="100"' in dom
    assert re.search(r'data-status="Read from Redis at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\.', dom)
