"""The "Held locks" admin page: access, listing, CSRF, confirmation, release."""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

import pytest
import redis
from django.test import Client, override_settings
from django.urls import reverse

from django_redislock.core.drivers.lock import Lock
from django_redislock.core.drivers.semaphore import Semaphore
from django_redislock.core.engine.keys import KeySpace
from django_redislock.core.exceptions import LockLost
from django_redislock.core.ops.inspection import holder_id, list_locks
from django_redislock.ops.admin import has_permission, parse_selection, selection
from tests.helpers import start_waiter

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_clients")]

KS = KeySpace("redislock")


def allow_all_staff(user: Any) -> bool:
    return bool(user.is_staff)


def hold(client: redis.Redis, name: str, *, ttl: float = 600, label: str = "") -> Lock:
    lock = Lock(client, name, ttl=ttl, wait=0, keyspace=KS, label=label)
    assert lock.acquire()
    return lock


@pytest.fixture
def url() -> str:
    return reverse("admin:django_redislock_locks")


def user(django_user_model: Any, name: str, **flags: bool) -> Any:
    return django_user_model.objects.create_user(name, **flags)


@pytest.fixture
def superuser(django_user_model: Any) -> Any:
    return user(django_user_model, "root", is_staff=True, is_superuser=True)


def logged_in(account: Any, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(account)
    return client


def csrf_token(client: Client, url: str) -> str:
    assert client.get(url).status_code == 200
    return str(client.cookies["csrftoken"].value)


def test_url_needs_no_extra_wiring(url: str) -> None:
    assert url == "/admin/django_redislock/locks/"


def test_anonymous_is_sent_to_login(url: str, r: redis.Redis) -> None:
    hold(r, "secret")
    response = Client().get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/?next=")
    response = Client().post(url, {"selected": "x", "confirm": "yes"})
    assert response.status_code == 302
    assert [row.name for row in list_locks(r, KS)] == ["secret"]


def test_non_staff_is_sent_to_login(url: str, django_user_model: Any) -> None:
    client = logged_in(user(django_user_model, "joe"))
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_staff_without_permission_is_forbidden(
    url: str, django_user_model: Any, r: redis.Redis
) -> None:
    staff = user(django_user_model, "staff", is_staff=True)
    hold(r, "x")
    client = logged_in(staff)
    assert client.get(url).status_code == 403
    assert client.post(url, {"selected": "x"}).status_code == 403
    # No link on the index either.
    index = client.get(reverse("admin:index"))
    assert url not in index.content.decode()
    assert [row.name for row in list_locks(r, KS)] == ["x"]


@pytest.mark.parametrize(
    "setting", [allow_all_staff, "tests.test_admin.allow_all_staff"], ids=["callable", "path"]
)
def test_admin_permission_setting(url: str, django_user_model: Any, setting: Any) -> None:
    staff = user(django_user_model, "staff", is_staff=True)
    with override_settings(REDISLOCK={"ADMIN_PERMISSION": setting}):
        assert has_permission(staff)
        assert logged_in(staff).get(url).status_code == 200
    with override_settings(REDISLOCK={"ADMIN_PERMISSION": lambda u: False}):
        root = user(django_user_model, "root", is_staff=True, is_superuser=True)
        assert logged_in(root).get(url).status_code == 403


def test_superuser_sees_rows_escaped(url: str, superuser: Any, r: redis.Redis) -> None:
    lock = hold(r, "<script>alert(1)</script>\nx", label="POST /products/7/buy")
    hold(r, "other")
    client = logged_in(superuser)
    response = client.get(url)
    assert response.status_code == 200
    page = response.content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\nx" in page
    assert "<script>alert(1)" not in page
    assert str(lock.fence) in page
    assert "POST /products/7/buy" in page
    assert "other" in page
    index = client.get(reverse("admin:index")).content.decode()
    assert f'href="{url}"' in index and "Held locks" in index


def test_filter_by_pattern(url: str, superuser: Any, r: redis.Redis) -> None:
    hold(r, "report:1")
    hold(r, "report*")
    hold(r, "import")
    client = logged_in(superuser)
    page = client.get(url, {"pattern": "report*"}).content.decode()
    assert "report:1" in page and "report*" in page and "import" not in page
    page = client.get(url, {"pattern": "report*", "literal": "1"}).content.decode()
    assert "report:1" not in page and "report*" in page
    page = client.get(url, {"pattern": "nothing"}).content.decode()
    assert "No locks held matching" in page


def test_release_needs_confirmation_and_csrf(url: str, superuser: Any, r: redis.Redis) -> None:
    lock = hold(r, "job")
    (row,) = list_locks(r, KS)
    client = logged_in(superuser, csrf=True)
    value = selection(row)
    # No CSRF token: refused, nothing released.
    response = client.post(url, {"selected": value, "confirm": "yes"})
    assert response.status_code == 403
    assert lock.owned()
    token = csrf_token(client, url)
    # With the token but not confirmed: the confirmation page, nothing released.
    response = client.post(url, {"selected": value, "csrfmiddlewaretoken": token})
    assert response.status_code == 200
    page = response.content.decode()
    assert "These will be force-released" in page and 'name="confirm" value="yes"' in page
    assert f'value="{value}"' in page
    assert lock.owned()
    # Confirmed: released, back to the list with a message.
    response = client.post(
        url, {"selected": value, "confirm": "yes", "csrfmiddlewaretoken": token}, follow=True
    )
    assert response.redirect_chain == [(url, 302)]
    assert "Released lock &#x27;job&#x27;." in response.content.decode()
    assert list_locks(r, KS) == []
    with pytest.raises(LockLost):
        lock.release()


def test_release_leaves_a_new_holder_alone(url: str, superuser: Any, r: redis.Redis) -> None:
    first = hold(r, "job")
    (row,) = list_locks(r, KS)
    first.release()
    second = hold(r, "job")
    client = logged_in(superuser)
    response = client.post(url, {"selected": selection(row), "confirm": "yes"}, follow=True)
    assert "Not released: lock &#x27;job&#x27;" in response.content.decode()
    assert second.owned()


def test_hostile_names_round_trip(url: str, superuser: Any, r: redis.Redis) -> None:
    names = ["a\r\nb", "{x}*?", "锁" * 50, "\udcff-lone"]
    for name in names:
        hold(r, name)
    rows = list_locks(r, KS)
    assert sorted(parse_selection(selection(row)).name for row in rows) == sorted(names)
    client = logged_in(superuser)
    response = client.post(
        url, {"selected": [selection(row) for row in rows], "confirm": "yes"}, follow=True
    )
    assert response.status_code == 200
    assert list_locks(r, KS) == []


def test_malformed_or_empty_selection(url: str, superuser: Any, r: redis.Redis) -> None:
    hold(r, "x")
    client = logged_in(superuser)
    assert client.post(url, {"selected": "nonsense", "confirm": "yes"}).status_code == 400
    assert client.post(url, {"selected": "lock::%%%", "confirm": "yes"}).status_code == 400
    response = client.post(url, {"confirm": "yes"}, follow=True)
    assert "Select at least one lock to release." in response.content.decode()
    assert len(list_locks(r, KS)) == 1


def test_release_wakes_the_waiter(url: str, superuser: Any, r: redis.Redis) -> None:
    holder = hold(r, "job", ttl=600)
    waiter = Lock(r, "job", ttl=5, wait=60, keyspace=KS)
    t, got = start_waiter(waiter, lambda: list_locks(r, KS)[0].waiters == 1)
    (row,) = list_locks(r, KS)
    response = logged_in(superuser).post(url, {"selected": selection(row), "confirm": "yes"})
    assert response.status_code == 302
    # The holder's lease had ten minutes left: only the wake-up lets the waiter in.
    assert got.wait(30)
    t.join(10)
    with pytest.raises(LockLost):
        holder.extend()


def test_redis_down_shows_an_error(url: str, superuser: Any, redis_factory: Any) -> None:
    server = redis_factory().start()
    caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": server.url}}
    with override_settings(CACHES=caches):
        server.kill()
        response = logged_in(superuser).get(url)
    assert response.status_code == 503
    assert "Redis is unavailable" in response.content.decode()


def test_one_permit_is_released_from_its_own_checkbox(
    url: str, superuser: Any, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    sems = [Semaphore(r, "throttle", 3, ttl=600, wait=0, keyspace=KS) for _ in range(3)]
    for sem in sems:
        assert sem.acquire()
    victim = sems[1]
    ident = holder_id(victim.token or "")
    client = logged_in(superuser)
    page = client.get(url).content.decode()
    # Each permit has a box of its own, naming that permit alone.
    values = re.findall(r'name="selected" value="([^"]+)"', page)
    (box,) = [v for v in values if v.startswith(f"semaphore:{ident}:")]
    confirm = client.post(url, {"selected": box}).content.decode()
    assert f'<code class="ident">{ident}</code>' in confirm
    assert confirm.count('<code class="ident">') == 1
    with caplog.at_level(logging.WARNING, logger="django_redislock"):
        response = client.post(url, {"selected": box, "confirm": "yes"}, follow=True)
    assert "Released semaphore &#x27;throttle&#x27;" in response.content.decode()
    (row,) = list_locks(r, KS)
    assert {h.ident for h in row.holders} == {holder_id(s.token or "") for s in sems} - {ident}
    with pytest.raises(LockLost):
        victim.extend()
    assert victim.loss is not None and victim.loss.cause == "force_released"
    assert victim.loss.forced_by == f"admin user 'root' (id {superuser.pk})"
    audit = [x for x in caplog.records if x.name == "django_redislock.inspect"]
    assert [x.forced_by for x in audit] == [victim.loss.forced_by]  # type: ignore[attr-defined]
    for sem in (sems[0], sems[2]):
        sem.extend()
        sem.release()


def test_a_row_and_its_permit_ticked_together_release_once(
    url: str, superuser: Any, r: redis.Redis
) -> None:
    sems = [Semaphore(r, "pool", 2, ttl=600, wait=0, keyspace=KS) for _ in range(2)]
    for sem in sems:
        assert sem.acquire()
    (row,) = list_locks(r, KS)
    one = selection(row, [row.holders[0].ident])
    response = logged_in(superuser).post(
        url, {"selected": [selection(row), one], "confirm": "yes"}, follow=True
    )
    page = response.content.decode()
    assert "Not released" not in page and list_locks(r, KS) == []


def test_the_page_shows_renewal_and_waiters(url: str, superuser: Any, r: redis.Redis) -> None:
    holder = Lock(r, "job", ttl=600, wait=0, keyspace=KS, renew=True)
    assert holder.acquire()
    waiter = Lock(r, "job", ttl=5, wait=60, keyspace=KS, label="second in line")

    def wait() -> None:
        if waiter.acquire():
            waiter.release()

    t = threading.Thread(target=wait, name="in-line")
    t.start()
    try:
        deadline = time.monotonic() + 10
        while list_locks(r, KS)[0].waiters != 1:
            assert time.monotonic() < deadline, "the waiter never queued"
            time.sleep(0.01)
        page = logged_in(superuser).get(url).content.decode()
        assert '<td class="renewed">not yet</td>' in page
        (waiting,) = re.findall(r'<tr class="waiter">(.*?)</tr>', page, re.S)
        assert "/in-line" in waiting and "second in line" in waiting
        assert re.search(r'<td class="held-for" title="waited">\d+s</td>', waiting)
    finally:
        holder.release()
        t.join(30)
