"""An operator releases only what was shown: the admin page and ``redislocks clear``.

For every kind the same story: a holder is shown, then, before the operator
confirms, it lets go and another takes the name (or another joins it beside
the first). Only the holder shown may go; the one that came since stays.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from io import StringIO
from typing import Any

import pytest
import redis
from django.core.management import CommandError, call_command
from django.test import Client, override_settings
from django.urls import reverse

from django_redislock.core import KeySpace, ReadWriteLock
from django_redislock.core.drivers.lock import Lock
from django_redislock.core.drivers.semaphore import Semaphore
from django_redislock.core.ops.force import Shown, release, still_held
from django_redislock.core.ops.inspection import holder_id, list_locks
from django_redislock.ops.admin import parse_selection, selection
from django_redislock.tasks.unique import unique_task

KS = KeySpace("redislock")
NAME = "job"


@dataclass(frozen=True)
class Case:
    kind: str
    first: str  # "lock", "permit", "read" or "write"
    second: str
    # True: the first lets go before the second comes (the name changed
    # hands); False: the second joins while the first still holds.
    replaced: bool
    limit: int = 1


CASES = {
    "lock": Case("lock", "lock", "lock", True),
    "semaphore-replaced": Case("semaphore", "permit", "permit", True),
    "semaphore-joined": Case("semaphore", "permit", "permit", False, limit=2),
    "rwlock-reader-then-writer": Case("rwlock", "read", "write", True),
    "rwlock-writer-then-writer": Case("rwlock", "write", "write", True),
    "rwlock-writer-then-reader": Case("rwlock", "write", "read", True),
    "rwlock-reader-joined": Case("rwlock", "read", "read", False),
}
cases = pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))


def take(r: redis.Redis, case: Case, what: str, label: str) -> Any:
    handle: Any
    if what == "lock":
        handle = Lock(r, NAME, ttl=300, wait=0, keyspace=KS, label=label)
    elif what == "permit":
        handle = Semaphore(r, NAME, case.limit, ttl=300, wait=0, keyspace=KS, label=label)
    else:
        handle = ReadWriteLock(r, NAME, what, ttl=300, wait=0, keyspace=KS, label=label)  # type: ignore[arg-type]
    assert handle.acquire()
    return handle


def change(r: redis.Redis, case: Case, first: Any) -> Any:
    """What happens while the operator looks at the page: the second comes."""
    if case.replaced:
        first.release()
    return take(r, case, case.second, "second")


pytestmark = pytest.mark.usefixtures("fresh_clients")


# -- the admin page ---------------------------------------------------------------------
@pytest.fixture
def admin(superuser_client: Client) -> Client:
    return superuser_client


URL = "/admin/django_redislock/locks/"
SELECTED = re.compile(r'<input type="hidden" name="selected" value="([^"]+)">')


def confirmation(admin: Client, values: list[str]) -> str:
    response = admin.post(URL, {"selected": values})
    assert response.status_code == 200
    return str(response.content.decode())


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def test_url() -> None:
    assert reverse("admin:django_redislock_locks") == URL


@pytest.mark.django_db
@cases
def test_admin_releases_only_the_holder_the_confirmation_showed(
    case: Case, r: redis.Redis, admin: Client
) -> None:
    first = take(r, case, case.first, "first")
    (row,) = list_locks(r, KS)
    page = confirmation(admin, [selection(row)])
    values = SELECTED.findall(page)
    assert values == [selection(row)]
    second = change(r, case, first)
    response = admin.post(URL, {"selected": values, "confirm": "yes"}, follow=True)
    assert response.status_code == 200
    assert second.owned()
    what = f"{case.kind} '{NAME}'" + ("" if case.kind == "lock" else " (1 holder)")
    if case.replaced:
        assert messages_of(response) == [
            f"Not released: {what} was released or changed hands meanwhile."
        ]
    else:
        assert messages_of(response) == [f"Released {case.kind} '{NAME}'."]
        assert not first.owned()
    (left,) = list_locks(r, KS)
    assert [h.label for h in left.holders] == ["second"]


@pytest.mark.django_db
@cases
def test_admin_confirmation_shows_only_the_holders_the_list_showed(
    case: Case, r: redis.Redis, admin: Client
) -> None:
    first = take(r, case, case.first, "first")
    (row,) = list_locks(r, KS)
    listed = selection(row)  # the list page's checkbox
    second = change(r, case, first)
    page = confirmation(admin, [listed])
    values = SELECTED.findall(page)
    if case.replaced:
        assert values == []
        assert "Nothing left to release." in page
        assert "No longer held as shown" in page
    else:
        # The first only: the holder that joined since is not offered.
        (value,) = values
        assert parse_selection(value).holders == {holder_id(first.token)}
        assert "second" not in page
    assert second.owned()


# A unique task's key is a lock (tasks.rst): the task shown is released, not one
# queued after it finished.
try:  # Django 6.0+
    from django.tasks import task
except ImportError:
    try:
        from django_tasks import task  # type: ignore[no-redef]
    except ImportError:
        task = None

if task is not None:
    DUMMY = f"{task.__module__.rsplit('.', 1)[0]}.backends.dummy.DummyBackend"

    @unique_task("report:{report_id}")
    @task
    def build_report(report_id: int) -> int:
        return report_id


@pytest.mark.skipif(task is None, reason="no django.tasks / django_tasks")
@pytest.mark.django_db
def test_admin_leaves_a_unique_task_queued_since_alone(r: redis.Redis, admin: Client) -> None:
    with override_settings(TASKS={"default": {"BACKEND": DUMMY}}):
        shown = build_report.enqueue(1)
        (row,) = list_locks(r, KS)
        assert row.name == "unique:report:1"
        values = SELECTED.findall(confirmation(admin, [selection(row)]))
        # The task shown runs and finishes (a worker would); another is queued.
        assert build_report.func(*shown.args, **shown.kwargs) == 1
        queued = build_report.enqueue(1)
        assert queued.id != shown.id
        response = admin.post(URL, {"selected": values, "confirm": "yes"}, follow=True)
    assert messages_of(response) == [
        "Not released: lock 'unique:report:1' was released or changed hands meanwhile."
    ]
    (left,) = list_locks(r, KS)
    assert r.hget(left.key, "j") == str(queued.id).encode()


# -- the command --------------------------------------------------------------------------
DESCRIBED = {
    "lock": r"lock 'job' \(fence \d+, held by \S+ for \d+s, label 'first'\)",
    "semaphore": r"semaphore 'job' \(1/\d permits, longest held by \S+ for \d+s, label 'first'\)",
    "rwlock-read": r"rwlock 'job' \(1 reader, longest held by \S+ for \d+s, label 'first'\)",
    "rwlock-write": (r"rwlock 'job' \(writer, fence \d+, held by \S+ for \d+s, label 'first'\)"),
}


def described(case: Case) -> str:
    return DESCRIBED[case.kind if case.kind != "rwlock" else f"rwlock-{case.first}"]


@cases
def test_command_releases_only_the_holder_its_prompt_showed(
    case: Case, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = take(r, case, case.first, "first")
    came: list[Any] = []

    def answer(prompt: str) -> str:
        came.append(change(r, case, first))
        return "yes"

    monkeypatch.setattr("builtins.input", answer)
    monkeypatch.setattr(
        "django_redislock.management.commands.redislocks.has_terminal", lambda: True
    )
    out, err = StringIO(), StringIO()
    if case.replaced:
        with pytest.raises(CommandError) as info:
            call_command("redislocks", "clear", NAME, stdout=out, stderr=err)
        assert str(info.value) == "Not everything asked for was released: 1 changed hands."
    else:
        call_command("redislocks", "clear", NAME, stdout=out, stderr=err)
    lines = out.getvalue().splitlines()
    assert lines[0] == "These will be force-released:"
    assert re.fullmatch("  " + described(case), lines[1]), lines[1]
    assert lines[2] == (
        "Waiters are woken at once; each former holder finds out at its next extend or release."
    )
    (second,) = came
    assert second.owned()
    if case.replaced:
        assert lines[3:] == []
        assert err.getvalue().splitlines() == [
            f"Not released: {case.kind} '{NAME}' changed hands or was released after it was "
            "read; run the command again to see its new holder."
        ]
    else:
        assert len(lines) == 4 and re.fullmatch("Released " + described(case) + "[.]", lines[3])
        assert err.getvalue() == ""
        assert not first.owned()


# -- the shared mechanism -------------------------------------------------------------------
@cases
def test_still_held_and_release_keep_to_the_holders_shown(case: Case, r: redis.Redis) -> None:
    first = take(r, case, case.first, "first")
    (row,) = list_locks(r, KS)
    shown = Shown.of(row)
    assert shown.holders == {holder_id(first.token)}
    second = change(r, case, first)
    rows, gone = still_held(r, KS, [shown])
    if case.replaced:
        assert (rows, gone) == ([], [shown])
    else:
        (narrowed,) = rows
        assert [h.label for h in narrowed.holders] == ["first"] and gone == []
    result = release(r, KS, rows)
    assert [len(x.holders) for x in result.released] == ([] if case.replaced else [1])
    assert result.changed == []
    assert second.owned()
