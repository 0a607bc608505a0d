"""``manage.py redislocks list --summary``: one line per template above the rows."""

from __future__ import annotations

import json
import re
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.management import call_command

from django_redislock.core.drivers.lock import Lock
from django_redislock.core.drivers.semaphore import Semaphore
from django_redislock.core.engine.keys import KeySpace
from django_redislock.core.ops.inspection import BUSIEST, HeldLock, TemplateSummary
from django_redislock.ops.display import SUMMARY_COLUMNS, render_summary
from tests.test_summary import WAIT, Waiters, queued

KS = KeySpace("redislock")
TIME = re.compile(r"^\d{1,2}s$")
SUMMARY_HEADER = "TEMPLATE               KIND       HELD  HOLDERS  LONGEST HELD  WAITERS  BUSIEST"


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("redislocks", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def cells(header: str, line: str) -> list[str]:
    """A table line cut at the header's column starts, each cell stripped."""
    starts = [m.start() for m in re.finditer(r"(?<!\S)\S+(?: \S+)*", header)]
    bounds = [*starts, None]
    return [line[bounds[i] : bounds[i + 1]].strip() for i in range(len(starts))]


pytestmark = pytest.mark.usefixtures("fresh_clients")


@pytest.fixture
def contended(r: redis.Redis) -> Any:
    """Two purchase locks (one with 2 waiters), an ad-hoc lock, a semaphore."""
    handles: list[Lock | Semaphore] = []
    for name, template in (
        ("purchase:1", "purchase:{product_id}"),
        ("purchase:2", "purchase:{product_id}"),
        ("nightly", None),
    ):
        lock = Lock(r, name, ttl=300, wait=0, keyspace=KS, label="lbl")
        lock.metric_name = template
        assert lock.acquire()
        handles.append(lock)
    sem = Semaphore(r, "exports:alice", 5, ttl=300, wait=0, keyspace=KS)
    sem.metric_name = "exports-per-user"
    assert sem.acquire()
    handles.append(sem)
    waiters = Waiters()
    waiters.queue(lambda: Lock(r, "purchase:1", ttl=300, wait=WAIT, keyspace=KS), 2)
    try:
        queued(r, 2)
        yield handles
    finally:
        for handle in handles:
            handle.release()
        waiters.join()


def test_summary_table_above_the_rows(contended: Any) -> None:
    out, err = run("list", "--summary")
    assert err == ""
    lines = out.splitlines()
    assert lines[0] == SUMMARY_HEADER
    assert tuple(cells(SUMMARY_HEADER, lines[0])) == SUMMARY_COLUMNS
    rows = [cells(SUMMARY_HEADER, line) for line in lines[1:4]]
    for row in rows:
        assert TIME.match(row[4]), row
        row[4] = "T"
        row[6] = re.sub(r"\d+s\)", "Ts)", row[6])
    assert rows == [
        [
            "purchase:{product_id}",
            "lock",
            "2",
            "-",
            "T",
            "2",
            "purchase:1 (2 waiting, Ts); purchase:2 (0 waiting, Ts)",
        ],
        ["exports-per-user", "semaphore", "1", "1", "T", "0", "exports:alice (0 waiting, Ts)"],
        ["(no template)", "lock", "1", "-", "T", "0", "nightly (0 waiting, Ts)"],
    ]
    # A blank line, then the rows exactly as without --summary.
    assert lines[4] == ""
    assert lines[5].startswith("NAME ")
    plain, _ = run("list")
    assert [line[:30] for line in lines[5:]] == [line[:30] for line in plain.splitlines()]


def test_summary_json_is_an_object_with_the_rows_unchanged(contended: Any) -> None:
    plain = json.loads(run("list", "--format", "json")[0])
    data = json.loads(run("list", "--format", "json", "--summary")[0])
    # The same shape with and without --summary: JSON always carries the summary.
    assert set(data) == set(plain) == {"schema", "read_at", "locks", "summary"}
    rows = plain["locks"]

    def timeless(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # Ages and leases move on between the two runs; nothing else does.
        drop = {"held_for", "lease_left", "expires_at", "waited", "gives_up_in"}
        return [
            {
                **{k: v for k, v in item.items() if k not in drop},
                "permits": [{k: v for k, v in p.items() if k not in drop} for p in item["permits"]],
                "waiting": [{k: v for k, v in w.items() if k not in drop} for w in item["waiting"]],
            }
            for item in items
        ]

    assert timeless(data["locks"]) == timeless(rows)
    assert [(e["template"], e["held"]) for e in data["summary"]] == [
        (e["template"], e["held"]) for e in plain["summary"]
    ]
    types = {
        "template": (str, type(None)),
        "kind": str,
        "held": int,
        "holders": int,
        "longest_held": (int, float),
        "waiters": int,
        "busiest": list,
    }
    for entry in data["summary"]:
        assert set(entry) == set(types)
        for key, kind in types.items():
            assert isinstance(entry[key], kind), (key, entry[key])
        for busy in entry["busiest"]:
            assert set(busy) == {"name", "waiters", "held_for"}
    assert [
        (e["template"], e["kind"], e["held"], e["holders"], e["waiters"]) for e in data["summary"]
    ] == [
        ("purchase:{product_id}", "lock", 2, 2, 2),
        ("exports-per-user", "semaphore", 1, 1, 0),
        (None, "lock", 1, 1, 0),
    ]
    assert data["summary"][0]["busiest"][0]["name"] == "purchase:1"
    assert data["summary"][0]["busiest"][0]["waiters"] == 2


def test_summary_follows_pattern_kind_and_the_common_options(contended: Any) -> None:
    data = json.loads(
        run("list", "--summary", "--format", "json", "--pattern", "purchase:*", "-v", "2")[0]
    )
    assert [(e["template"], e["held"]) for e in data["summary"]] == [("purchase:{product_id}", 2)]
    data = json.loads(run("list", "--kind", "semaphore", "--summary", "--format=json")[0])
    assert [(e["template"], e["kind"]) for e in data["summary"]] == [
        ("exports-per-user", "semaphore")
    ]
    out, _ = run("list", "--summary", "--pattern", "nightly", "--literal", "--no-color")
    assert out.splitlines()[1].startswith("(no template)  lock  1     -        ")


def test_summary_with_nothing_held(r: redis.Redis) -> None:
    assert run("list", "--summary") == ("No locks held.\n", "")
    data = json.loads(run("list", "--summary", "--format", "json")[0])
    assert (data["schema"], data["locks"], data["summary"]) == (1, [], [])


def test_summary_escapes_templates_and_names(r: redis.Redis) -> None:
    lock = Lock(r, "evil\x1b[2J:1", ttl=300, wait=0, keyspace=KS)
    lock.metric_name = "evil\n{id}"
    assert lock.acquire()
    out, _ = run("list", "--summary")
    assert out.splitlines()[1].startswith("evil\\n{id}  lock")
    assert "evil\\x1b[2J:1 (0 waiting, " in out.splitlines()[1]
    assert "\x1b" not in out
    data = json.loads(run("list", "--summary", "--format", "json")[0])
    assert data["summary"][0]["template"] == "evil\n{id}"
    assert data["summary"][0]["busiest"][0]["name"] == "evil\x1b[2J:1"
    lock.release()


# -- what docs/operating.rst says ---------------------------------------------------
def _doc_example() -> list[str]:
    text = (Path(__file__).resolve().parents[1] / "docs" / "operating.rst").read_text()
    block = text.split("    $ python manage.py redislocks list --summary\n", 1)[1]
    return [line[4:] for line in block.split("\n\n", 1)[0].splitlines()]


def _held(name: str, waiters: int, held_for: float) -> HeldLock:
    return HeldLock(name, "lock", "h", 1, "t", "", None, held_for, 30.0, waiters, (), 1)


def test_the_documented_example_is_what_the_command_prints() -> None:
    """docs/operating.rst, Summary by template: the example output, line for line."""
    summaries = [
        TemplateSummary(
            "purchase:{product_id}",
            "lock",
            212,
            212,
            41,
            37,
            (_held("purchase:7", 12, 41), _held("purchase:3", 9, 2), _held("purchase:9", 4, 1)),
        ),
        TemplateSummary(
            "exports-per-user",
            "semaphore",
            3,
            7,
            185,
            2,
            (
                _held("exports:alice", 2, 185),
                _held("exports:bob", 0, 12),
                _held("exports:carol", 0, 4),
            ),
        ),
        TemplateSummary(None, "lock", 1, 1, 7, 0, (_held("nightly", 0, 7),)),
    ]
    assert render_summary(summaries) == _doc_example()
    assert BUSIEST == 3  # "up to three names"


def test_the_summary_reads_nothing_more_from_redis(r: redis.Redis) -> None:
    """docs/operating.rst: "The summary reads nothing more from Redis: its
    waiters and ages come from the same reads as the rows"."""
    for i in range(5):
        lock = Lock(r, f"purchase:{i}", ttl=300, wait=0, keyspace=KS)
        lock.metric_name = "purchase:{product_id}"
        assert lock.acquire()
    run("list")  # scripts loaded, clients connected

    def commands(*args: str) -> int:
        before = int(r.info("stats")["total_commands_processed"])
        run(*args)
        # Less the INFO that read ``before``.
        return int(r.info("stats")["total_commands_processed"]) - before - 1

    plain = commands("list")
    assert plain > 0
    assert commands("list", "--summary") == plain
    assert commands("list", "--summary", "--format", "json") == plain
    assert (
        "The summary\nreads nothing more from Redis"
        in Path(Path(__file__).resolve().parents[1] / "docs" / "operating.rst").read_text()
    )
