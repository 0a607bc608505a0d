"""The "Held locks" admin page's table: its columns, its wrapping, its width.

The structural tests read the page's HTML; the last one lays the page out in a
headless Chromium 1280 px wide (skipped where Chromium is not installed).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from html.parser import HTMLParser
from io import StringIO
from pathlib import Path
from typing import Any

import django
import pytest
import redis
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from django_redislock import LockLost, redis_lock
from django_redislock.core.drivers.lock import Lock
from django_redislock.core.drivers.semaphore import Semaphore
from django_redislock.core.engine.keys import KeySpace
from django_redislock.ops.admin import short_fence

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_clients")]

KS = KeySpace("redislock")
COLUMNS = [
    "",
    "Name",
    "Kind",
    "Fence",
    "Held for",
    "Lease left",
    "Renewed",
    "Waiters",
    "Owner",
    "Label",
]
LONG_NAME = "report:" + "x" * 90
LONG_LABEL = "POST /exports/" + "y" * 100 + "/csv"
LONG_THREAD = "ThreadPoolExecutor-export-workers-with-a-rather-long-name_0"
LONG_TEMPLATE = "report:{request.user.organisation.pk}:" + "w" * 80


@pytest.fixture
def page_client(superuser_client: Client) -> Client:
    return superuser_client


def _take_permit(r: redis.Redis, label: str, thread_name: str) -> Semaphore:
    permits: list[Semaphore] = []

    def take() -> None:
        sem = Semaphore(r, "exports", 5, ttl=600, wait=0, keyspace=KS, label=label)
        sem.metric_name = "exports-" + "v" * 80
        assert sem.acquire()
        permits.append(sem)

    thread = threading.Thread(target=take, name=thread_name)
    thread.start()
    thread.join(10)
    return permits[0]


@pytest.fixture
def held(r: redis.Redis) -> dict[str, Any]:
    lock = Lock(r, LONG_NAME, ttl=600, wait=0, keyspace=KS, label=LONG_LABEL)
    lock.metric_name = LONG_TEMPLATE
    assert lock.acquire()

    first = _take_permit(r, "nightly export", LONG_THREAD)
    second = _take_permit(r, "export csv " + "z" * 80, "Thread-3")
    return {"lock": lock, "permits": [first, second]}


class _Table(HTMLParser):
    """Rows of the lock table: (tr class, [(td class, attrs of its spans, text)])."""

    def __init__(self) -> None:
        super().__init__()
        self.head: list[str] = []
        self.rows: list[tuple[str, list[tuple[str, list[dict[str, str]], str]]]] = []
        self.style = ""
        self._in_style = False
        self._cell: list[Any] | None = None
        self._th: list[str] | None = None
        self._inside = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "style":
            self._in_style = True
        elif tag == "table":
            self._inside = a.get("id") == "result_list"
        elif not self._inside:
            return
        elif tag == "tr" and self._th is None:
            self.rows.append((a.get("class", ""), []))
        elif tag == "th":
            self._th = []
        elif tag == "td":
            self._cell = [a.get("class", ""), [], ""]
        elif tag == "span" and self._cell is not None:
            self._cell[1].append(a)

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self._in_style = False
        elif tag == "table":
            self._inside = False
        elif tag == "th" and self._th is not None:
            self.head.append("".join(self._th).strip())
            self._th = None
        elif tag == "td" and self._cell is not None:
            self.rows[-1][1].append((self._cell[0], self._cell[1], self._cell[2].strip()))
            self._cell = None
        elif tag == "thead":
            self.rows.clear()

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.style += data
        elif self._th is not None:
            self._th.append(data)
        elif self._cell is not None:
            self._cell[2] += data


def _by_class(cells: list[tuple[str, list[dict[str, str]], str]]) -> dict[str, str]:
    return {css: text for css, _, text in cells}


def _table(client: Client) -> _Table:
    response = client.get(reverse("admin:django_redislock_locks"))
    assert response.status_code == 200
    table = _Table()
    table.feed(response.content.decode())
    return table


def test_every_row_has_the_header_columns(page_client: Client, held: dict[str, Any]) -> None:
    table = _table(page_client)
    assert table.head == COLUMNS
    assert [kind for kind, _ in table.rows] == ["semaphore", "permit", "permit", "lock"], [
        (kind, [t for _, _, t in cells]) for kind, cells in table.rows
    ]
    for _, cells in table.rows:
        assert len(cells) == len(COLUMNS)


def test_semaphore_permit_labels_are_in_the_label_column(
    page_client: Client, held: dict[str, Any]
) -> None:
    rows = dict(enumerate(_table(page_client).rows))
    semaphore, first, second = rows[0][1], rows[1][1], rows[2][1]
    by_class = _by_class(semaphore)
    assert (by_class["kind"], by_class["owner"], by_class["label"]) == (
        "semaphore 2/5",
        "2 holders",
        "",
    )
    labels = {_by_class(row)["label"] for row in (first, second)}
    owners = [_by_class(row)["owner"] for row in (first, second)]
    assert labels == {"nightly export", "export csv " + "z" * 80}
    assert any(owner.endswith("/" + LONG_THREAD) for owner in owners)
    assert not any("export" in owner.split("/")[0] for owner in owners)


def test_fence_abbreviated_with_the_whole_token_in_its_title(
    page_client: Client, held: dict[str, Any]
) -> None:
    fence = held["lock"].fence
    [lock_row] = [cells for kind, cells in _table(page_client).rows if kind == "lock"]
    [(_, spans, text)] = [cell for cell in lock_row if cell[0] == "fence"]
    assert spans == [{"title": str(fence)}]
    assert text == short_fence(fence) == "\u2026" + str(fence)[-6:]
    assert short_fence(42) == "42" and short_fence(None) == "-"


def test_the_table_wraps_instead_of_widening(page_client: Client, held: dict[str, Any]) -> None:
    style = re.sub(r"\s+", " ", _table(page_client).style)
    assert "#result_list.redislock-table { table-layout: fixed; width: 100%; }" in style
    assert "overflow-wrap: anywhere" in style
    assert "white-space: normal" in style


def test_redis_lock_labels_itself_with_where_it_was_taken(
    page_client: Client, r: redis.Redis
) -> None:
    with redis_lock("job:restock") as lock:
        line = _line_of('with redis_lock("job:restock") as lock:')
        expected = f"{__name__}.test_redis_lock_labels_itself_with_where_it_was_taken:{line}"
        [row] = _table(page_client).rows
        assert _by_class(row[1])["label"] == expected
        out = StringIO()
        call_command("redislocks", "list", stdout=out)
        assert out.getvalue().splitlines()[1].endswith("  " + expected)
        assert lock is not None
    # An explicit label still wins.
    with redis_lock("job:restock", label="nightly restock"):
        [row] = _table(page_client).rows
        assert _by_class(row[1])["label"] == "nightly restock"


def test_redislocks_clear_prints_the_default_label(r: redis.Redis) -> None:
    block = redis_lock("job:clear-me")
    line = _line_of('block = redis_lock("job:clear-me")')
    out = StringIO()
    with pytest.raises(LockLost), block:
        call_command("redislocks", "clear", "job:clear-me", "--noinput", stdout=out)
    label = f"{__name__}.test_redislocks_clear_prints_the_default_label:{line}"
    assert out.getvalue().endswith(f", label '{label}').\n")


def _line_of(source: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.strip() == source)


# -- a real browser, 1280 px wide ---------------------------------------------------------
CHROMIUM = next(
    (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
    None,
)
MEASURE = """<script>
window.addEventListener("load", function () {
  var table = document.getElementById("result_list");
  document.body.setAttribute("data-page-width", document.documentElement.scrollWidth);
  document.body.setAttribute("data-table-right", Math.ceil(table.getBoundingClientRect().right));
  var summary = document.getElementById("redislock-summary").getBoundingClientRect();
  document.body.setAttribute("data-summary-right", Math.ceil(summary.right));
});
</script>"""


def chromium_dom(page: str, tmp_path: Path, script: str) -> tuple[str, str]:
    """``page`` laid out by headless Chromium 1280 px wide, with ``script``
    run at load: (the DOM it leaves, Chromium's stderr)."""
    # The admin's own stylesheets, from Django's package, as files.
    static = Path(django.__file__).parent / "contrib" / "admin" / "static"
    page = page.replace('"/static/', f'"file://{static}/')
    page = page.replace("</body>", script + "</body>")
    target = tmp_path / "locks.html"
    target.write_text(page)
    assert CHROMIUM is not None
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--allow-file-access-from-files",
            "--window-size=1280,900",
            "--virtual-time-budget=3000",
            "--dump-dom",
            target.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    return done.stdout, done.stderr


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed")
def test_page_fits_1280px_in_chromium(
    page_client: Client, held: dict[str, Any], tmp_path: Path
) -> None:
    response = page_client.get(reverse("admin:django_redislock_locks"))
    dom, stderr = chromium_dom(response.content.decode(), tmp_path, MEASURE)
    width = re.search(r'data-page-width="(\d+)"', dom)
    right = re.search(r'data-table-right="(\d+)"', dom)
    summary = re.search(r'data-summary-right="(\d+)"', dom)
    assert width and right and summary, stderr[-2000:]
    assert int(width.group(1)) <= 1280
    assert int(right.group(1)) <= 1280
    assert int(summary.group(1)) <= 1280
