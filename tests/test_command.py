"""``manage.py redislocks``: exact output, JSON schema, confirmation, dry run."""

from __future__ import annotations

import json
import os
import re
import socket
import time
from datetime import datetime
from io import StringIO
from typing import Any

import pytest
import redis
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_redislock.core.drivers.lock import Lock
from django_redislock.core.drivers.semaphore import Semaphore
from django_redislock.core.engine.keys import KeySpace
from django_redislock.core.exceptions import LockLost
from tests.helpers import start_waiter

KS = KeySpace("redislock")
COMMAND = "django_redislock.management.commands.redislocks"
OWNER = f"{socket.gethostname()}:{os.getpid()}/MainThread"
HEADER = (
    "NAME       KIND       HOLDERS  FENCE             HELD FOR  LEASE LEFT  RENEWED  WAITERS  "
    "ID                "
)
HOLDER_ID = re.compile(r"^[0-9a-f]{16}  $")
TIME = re.compile(r"^(\d+s|\d+m\d\ds)$")
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def instant(text: str) -> float:
    """Epoch seconds of an ISO instant of the JSON output."""
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


def hold(client: redis.Redis, name: str, *, label: str = "", ttl: float = 300) -> Lock:
    lock = Lock(client, name, ttl=ttl, wait=0, keyspace=KS, label=label)
    assert lock.acquire()
    return lock


def run(*args: str, **options: Any) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("redislocks", *args, stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


def fails(*args: str) -> tuple[str, str, str]:
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError) as info:
        call_command("redislocks", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue(), str(info.value)


def cells(header: str, line: str) -> list[str]:
    """Split a table line at the header's column starts (cells are padded)."""
    starts = [m.start() for m in re.finditer(r"(?<!\S)\S+(?: \S+)*", header)]
    bounds = [*starts, None]
    return [line[bounds[i] : bounds[i + 1]] for i in range(len(starts))]


def snapshot(r: redis.Redis) -> dict[bytes, bytes | None]:
    return {key: r.dump(key) for key in r.scan_iter()}


pytestmark = pytest.mark.usefixtures("fresh_clients")


def test_list_empty() -> None:
    assert run("list") == ("No locks held.\n", "")
    out, err = run("list", "--format", "json")
    assert err == ""
    data = json.loads(out)
    assert set(data) == {"schema", "read_at", "locks", "summary"}
    assert (data["schema"], data["locks"], data["summary"]) == (1, [], [])
    assert ISO.fullmatch(data["read_at"])


def test_list_table_exact(r: redis.Redis) -> None:
    a = hold(r, "report:42", label="POST /products/7/buy")
    b = hold(r, "nightly")
    sem = Semaphore(r, "exports", 5, ttl=300, wait=0, keyspace=KS, label="export csv")
    assert sem.acquire()
    out, err = run("list")
    assert err == ""
    lines = out.splitlines()
    header = HEADER + "OWNER".ljust(len(OWNER)) + "  LABEL"
    assert lines[0] == header
    assert len(lines) == 5
    rows = [cells(header, line) for line in lines[1:]]
    # RENEWED: nobody renews these (renew=False) nor extended them; ID: each
    # holder's, compared by shape.
    expected = [
        [
            "exports    ",
            "semaphore  ",
            "1/5      ",
            "-                 ",
            None,
            None,
            "         ",
            "0        ",
            "                  ",
            "1 holder",
            "",
        ],
        [
            "           ",
            "           ",
            "         ",
            "                  ",
            None,
            None,
            "off      ",
            "         ",
            None,
            OWNER + "  ",
            "export csv",
        ],
        [
            "nightly    ",
            "lock       ",
            "-        ",
            f"{b.fence:<18}",
            None,
            None,
            "off      ",
            "0        ",
            None,
            OWNER,
            "",
        ],
        [
            "report:42  ",
            "lock       ",
            "-        ",
            f"{a.fence:<18}",
            None,
            None,
            "off      ",
            "0        ",
            None,
            OWNER + "  ",
            "POST /products/7/buy",
        ],
    ]
    for got, want in zip(rows, expected, strict=True):
        held, left = got[4], got[5]
        assert TIME.match(held.rstrip()) and held == held.rstrip().ljust(10), held
        assert TIME.match(left.rstrip()) and left == left.rstrip().ljust(12), left
        assert int(held.rstrip()[:-1]) < 60
        assert left.rstrip().startswith(("4m", "5m00s"))
        got[4] = got[5] = None  # type: ignore[call-overload]
        if want[8] is None:
            assert HOLDER_ID.match(got[8]), got[8]
            got[8] = None  # type: ignore[call-overload]
        assert got == want
    # The IDs are those of the JSON's holders, which ``clear --holder`` takes.
    ids = {
        p["id"]
        for x in json.loads(run("list", "--format", "json")[0])["locks"]
        for p in x["permits"]
    }
    assert {row[8].strip() for row in (cells(header, line) for line in lines[2:])} == ids
    sem.release()


def test_list_json_schema(r: redis.Redis) -> None:
    lock = hold(r, "a", label="lbl")
    sem = Semaphore(r, "b", 2, ttl=300, wait=0, keyspace=KS)
    assert sem.acquire()
    out, _ = run("list", "--format", "json")
    top = json.loads(out)
    # One object whatever the options: the same keys with --summary.
    assert set(top) == {"schema", "read_at", "locks", "summary"}
    assert set(json.loads(run("list", "--format", "json", "--summary")[0])) == set(top)
    assert top["schema"] == 1
    data = top["locks"]
    assert isinstance(data, list) and len(data) == 2
    types = {
        "name": str,
        "kind": str,
        "host": str,
        "pid": int,
        "thread": str,
        "label": str,
        "fence": (int, type(None)),
        "held_for": (int, float),
        "lease_left": (int, float),
        "acquired_at": str,
        "expires_at": str,
        "waiters": int,
        "holders": int,
        "limit": int,
        "permits": list,
        "renew": bool,
        "renewed_ago": type(None),
        "renewed_at": type(None),
        "renewal_late": bool,
        "waiting": list,
    }
    read_at = instant(top["read_at"])
    # The server's clock and this one are the same machine's.
    assert abs(read_at - time.time()) < 60
    for item in data:
        assert set(item) == set(types)
        for key, kind in types.items():
            assert isinstance(item[key], kind), (key, item[key])
        assert ISO.fullmatch(item["acquired_at"]) and ISO.fullmatch(item["expires_at"])
        # Absolute instants are the ages counted from the row's own read, a
        # moment before the last one (``read_at``): never after it.
        acquired, expires = instant(item["acquired_at"]), instant(item["expires_at"])
        assert -0.002 < (read_at - item["held_for"]) - acquired < 1
        assert -0.002 < (read_at + item["lease_left"]) - expires < 1
        assert expires - acquired == pytest.approx(300, abs=0.002)
        for permit in item["permits"]:
            assert set(permit) == {
                "id",
                "renew",
                "renewed_ago",
                "renewed_at",
                "renewal_late",
                "host",
                "pid",
                "thread",
                "label",
                "held_for",
                "lease_left",
                "acquired_at",
                "expires_at",
            }
            assert ISO.fullmatch(permit["acquired_at"]) and ISO.fullmatch(permit["expires_at"])
    lock_row, sem_row = data
    assert (lock_row["name"], lock_row["kind"], lock_row["fence"]) == ("a", "lock", lock.fence)
    assert (lock_row["holders"], lock_row["limit"], lock_row["label"]) == (1, 1, "lbl")
    assert (sem_row["name"], sem_row["kind"], sem_row["fence"]) == ("b", "semaphore", None)
    assert (sem_row["holders"], sem_row["limit"]) == (1, 2)
    assert lock_row["pid"] == os.getpid() and lock_row["thread"] == "MainThread"
    sem.release()


def test_names_sort_as_people_count(r: redis.Redis) -> None:
    for n in (100, 10, 2, 1, 0):
        hold(r, f"cart:{n}")
    hold(r, "cart")
    hold(r, "cart:1:b")
    names = [item["name"] for item in json.loads(run("list", "--format", "json")[0])["locks"]]
    assert names == ["cart", "cart:0", "cart:1", "cart:1:b", "cart:2", "cart:10", "cart:100"]
    table = [line.split()[0] for line in run("list")[0].splitlines()[1:]]
    assert table == names


HOSTILE = [
    "new\nline",
    "tab\there",
    "esc\x1b[2J",
    "bidi\u202eevil",
    "back\\slash",
    "{br}*?[x]",
    "锁ünï",
    "long:" + "x" * 200,
]


def test_hostile_names_table_escaped_json_exact(r: redis.Redis) -> None:
    for name in HOSTILE:
        hold(r, name, label="l\nl")
    out, _ = run("list")
    lines = out.splitlines()
    assert len(lines) == 1 + len(HOSTILE)  # no name spilled onto a second line
    body = "\n".join(lines[1:])
    for shown in [
        "new\\nline",
        "tab\\there",
        "esc\\x1b[2J",
        "bidi\\u202eevil",
        "back\\\\slash",
        "{br}*?[x]",
        "锁ünï",
        "long:" + "x" * 200,
        "l\\nl",
    ]:
        assert shown in body
    assert "\x1b" not in out and "\u202e" not in out and "\t" not in out
    data = json.loads(run("list", "--format", "json")[0])["locks"]
    assert sorted(item["name"] for item in data) == sorted(HOSTILE)
    assert {item["label"] for item in data} == {"l\nl"}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_cleared_by_name(r: redis.Redis, name: str) -> None:
    lock = hold(r, name)
    hold(r, "other")
    out, err = run("clear", name, "--noinput")
    assert err == ""
    assert out.startswith("Released lock '")
    assert out.count("\n") == 1
    names = [item["name"] for item in json.loads(run("list", "--format", "json")[0])["locks"]]
    assert names == ["other"]
    with pytest.raises(LockLost):
        lock.release()


def test_pattern_and_literal(r: redis.Redis) -> None:
    for name in ("a*", "ab", "b"):
        hold(r, name)

    def listed(*args: str) -> list[str]:
        return [
            item["name"] for item in json.loads(run("list", "--format", "json", *args)[0])["locks"]
        ]

    assert listed("--pattern", "a*") == ["a*", "ab"]
    assert listed("--pattern", "a*", "--literal") == ["a*"]
    assert listed("--pattern", "a[*]") == ["a*"]
    assert listed("--pattern", "zz") == []
    assert fails("list", "--literal")[2] == (
        "--literal needs --pattern: it says how to read the pattern."
    )
    out, _ = run("clear", "--pattern", "a*", "--literal", "--noinput")
    assert out.startswith("Released lock 'a*'") and out.count("\n") == 1
    assert listed() == ["ab", "b"]


def test_clear_output_exact(r: redis.Redis) -> None:
    lock = hold(r, "report:42", label="POST /products/7/buy")
    out, err = run("clear", "report:42", "--noinput")
    assert err == ""
    assert re.fullmatch(
        re.escape(f"Released lock 'report:42' (fence {lock.fence}, held by {OWNER} for ")
        + r"\d+s"
        + re.escape(", label 'POST /products/7/buy').")
        + "\n",
        out,
    ), out


def test_clear_not_held_is_an_error(r: redis.Redis) -> None:
    hold(r, "held")
    out, err, message = fails("clear", "held", "nope", "--noinput")
    assert out.startswith("Released lock 'held' (")
    assert err == "Not held: 'nope'.\n"
    assert message == "Not everything asked for was released: 1 not held."
    out, err, message = fails("clear", "nope")
    assert (out, err) == ("", "Not held: 'nope'.\n")


def test_clear_needs_exactly_one_selection(r: redis.Redis) -> None:
    expected = (
        "Say what to release: NAME [NAME ...], or --pattern GLOB, or --all (exactly one of them)."
    )
    assert fails("clear")[2] == expected
    assert fails("clear", "x", "--all")[2] == expected
    assert fails("clear", "--pattern", "x", "--all")[2] == expected


def test_dry_run_changes_nothing(r: redis.Redis) -> None:
    lock = hold(r, "a")
    hold(r, "b")
    before = snapshot(r)
    out, err = run("clear", "--all", "--dry-run")
    assert err == ""
    lines = out.splitlines()
    assert [line.split(" (")[0] for line in lines] == [
        "Would release lock 'a'",
        "Would release lock 'b'",
    ]
    assert snapshot(r) == before
    assert lock.owned()


def test_confirmation_prompt(r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    hold(r, "a")
    prompts: list[str] = []
    answers = iter(["no", "yes"])

    def answer(prompt: str) -> str:
        prompts.append(prompt)
        return next(answers)

    monkeypatch.setattr("builtins.input", answer)
    monkeypatch.setattr(COMMAND + ".has_terminal", lambda: True)
    before = snapshot(r)
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError) as declined:
        call_command("redislocks", "clear", "a", stdout=out, stderr=err)
    # Declining is a failure of what was asked: exit status 1.
    assert (str(declined.value), declined.value.returncode) == (
        "Declined: nothing was released.",
        1,
    )
    lines = out.getvalue().splitlines()
    assert lines[0] == "These will be force-released:"
    assert lines[1].startswith("  lock 'a' (fence ")
    assert lines[2] == (
        "Waiters are woken at once; each former holder finds out at its next extend or release."
    )
    assert lines[3:] == ["Nothing released."]
    assert prompts == ["Type 'yes' to continue, or 'no' to cancel: "]
    assert snapshot(r) == before
    out2, _ = run("clear", "a")
    assert out2.splitlines()[-1].startswith("Released lock 'a' (")
    assert len(prompts) == 2
    assert run("list")[0] == "No locks held.\n"


def test_end_of_input_at_the_prompt_declines(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    hold(r, "a")

    def eof(prompt: str) -> str:
        raise EOFError

    monkeypatch.setattr("builtins.input", eof)
    monkeypatch.setattr(COMMAND + ".has_terminal", lambda: True)
    before = snapshot(r)
    out, _, message = fails("clear", "a")
    assert out.splitlines()[-2:] == ["", "Nothing released."]
    assert message == "Declined: nothing was released."
    assert snapshot(r) == before


def test_clear_without_a_terminal_refuses(r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    hold(r, "a")
    asked: list[str] = []
    monkeypatch.setattr("builtins.input", lambda prompt: asked.append(prompt) or "yes")
    monkeypatch.setattr(COMMAND + ".has_terminal", lambda: False)
    before = snapshot(r)
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError) as refused:
        call_command("redislocks", "clear", "a", stdout=out, stderr=err)
    assert str(refused.value) == (
        "No terminal to confirm on (stdin is not a terminal), so nothing was released. "
        "Run it from a terminal, or pass --no-input to release without asking; "
        "--dry-run shows what would go."
    )
    assert refused.value.returncode == 2
    assert (out.getvalue(), err.getvalue(), asked) == ("", "", [])
    assert snapshot(r) == before
    # --no-input (and --noinput) release without asking, terminal or not.
    out3, _ = run("clear", "a", "--no-input")
    assert out3.startswith("Released lock 'a' (")
    assert asked == []


def test_clear_all_leaves_foreign_keys(r: redis.Redis) -> None:
    hold(r, "mine")
    sem = Semaphore(r, "pool", 2, ttl=300, wait=0, keyspace=KS)
    assert sem.acquire()
    r.hset(b"other:L:{0123456789abcdef}:=x", mapping={"t": "1", "n": "x"})
    r.hset(b"redislock:L:{0123456789abcdef}:=x", mapping={"t": "1", "n": "x"})
    r.set(b"redislock:L:{0123456789abcdef}:=y", "not a hash")
    r.set(b"redislock:something", "else")
    foreign = {k: v for k, v in snapshot(r).items() if b"0123456789abcdef" in k or b"some" in k}
    assert len(foreign) == 4
    out, _ = run("clear", "--all", "--noinput")
    assert [line.split(" (")[0] for line in out.splitlines()] == [
        "Released lock 'mine'",
        "Released semaphore 'pool'",
    ]
    assert {k: r.dump(k) for k in foreign} == foreign
    assert run("list")[0] == "No locks held.\n"
    with pytest.raises(LockLost):
        sem.release()


def test_kind_option(r: redis.Redis) -> None:
    hold(r, "x")
    sem = Semaphore(r, "x", 2, ttl=300, wait=0, keyspace=KS)
    assert sem.acquire()
    out, _ = run("clear", "x", "--kind", "semaphore", "--noinput")
    assert out.startswith("Released semaphore 'x' (1/2 permits")
    assert [i["kind"] for i in json.loads(run("list", "--format", "json")[0])["locks"]] == ["lock"]


def test_clear_wakes_waiter_and_holder_learns(r: redis.Redis) -> None:
    holder = hold(r, "job", ttl=600)
    waiter = Lock(r, "job", ttl=5, wait=60, keyspace=KS)
    t, got = start_waiter(
        waiter, lambda: json.loads(run("list", "--format", "json")[0])["locks"][0]["waiters"] == 1
    )
    run("clear", "job", "--noinput")
    # Ten minutes were left on the lease: only the wake-up gets the waiter in.
    assert got.wait(30)
    t.join(10)
    with pytest.raises(LockLost):
        holder.release()


def test_cache_alias(r: redis.Redis, redis_factory: Any) -> None:
    other = redis_factory().start()
    caches = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"unix://{r.connection_pool.connection_kwargs['path']}?db=0",
        },
        "other": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": other.url},
    }
    with override_settings(CACHES=caches):
        client = other.client()
        hold(client, "elsewhere")
        assert run("list")[0] == "No locks held.\n"
        data = json.loads(run("list", "--format", "json", "--cache", "other")[0])["locks"]
        assert [item["name"] for item in data] == ["elsewhere"]
        client.close()


def test_redis_down_is_a_clear_error(redis_factory: Any) -> None:
    server = redis_factory().start()
    caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": server.url}}
    with override_settings(CACHES=caches):
        server.kill()
        message = fails("list")[2]
    assert message.startswith("Redis is unavailable: ")


def test_empty_name_is_a_clear_error() -> None:
    assert fails("clear", "")[2] == "lock name must not be empty"


def test_options_as_keywords_and_empty_pattern(r: redis.Redis) -> None:
    hold(r, "a")
    assert json.loads(run("list", format="json", pattern="a")[0])["locks"][0]["name"] == "a"
    assert run("clear", "--pattern", "zz*", "--noinput") == ("Nothing to release.\n", "")
    assert run("clear", pattern="a", literal=True, interactive=False)[0].startswith(
        "Released lock 'a' ("
    )
