"""``@idempotent``: the Idempotency-Key header, against a real Redis and real databases.

The scenarios that both forms share (the decorator and the middleware, sync
and async views) are in ``tests/test_idempotency_forms.py``; here, the rest.

Views live in this module (it is its own URLconf). Concurrency is real
threads synchronised by events: a view under test blocks on a gate that the
test opens once the duplicates have had their answers.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.test import Client, RequestFactory, override_settings
from django.urls import path
from django.views import View
from django.views.decorators.csrf import csrf_exempt
from redis.crc import key_slot

from django_redislock import current_fence
from django_redislock.checks import check_settings
from django_redislock.idempotency import REPLAYED_HEADER, idempotent
from django_redislock.locking.factories import keyspace
from tests.helpers_oracles import wait_until
from tests.test_decorators import dead_redis  # noqa: F401 - a fixture
from tests.testapp.models import Order, Product

pytestmark = pytest.mark.urls("tests.test_idempotency")

ALIASES = [
    "default",
    pytest.param(
        "postgres",
        marks=pytest.mark.skipif(
            "postgres" not in settings.DATABASES, reason="PostgreSQL not reachable"
        ),
    ),
]
ALL_DBS = ["default", "postgres"] if "postgres" in settings.DATABASES else ["default"]
db_all = pytest.mark.django_db(transaction=True, databases=ALL_DBS)

WAIT = 30  # bound on every wait on an event or a thread


# -- views --------------------------------------------------------------------------------
class Gate:
    """Lets a test hold a view mid-run: ``entered`` is set when it starts."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.open = threading.Event()
        self.open.set()

    def hold(self) -> None:
        self.entered.clear()
        self.open.clear()

    def pass_(self) -> None:
        self.entered.set()
        assert self.open.wait(WAIT), "the test never opened the gate"


gate = Gate()
runs: list[str] = []


@csrf_exempt
@idempotent
def charge(request: HttpRequest, db: str) -> HttpResponse:
    runs.append("charge")
    product = Product.objects.using(db).get(name="coffee")
    order = Order.objects.using(db).create(product=product)
    gate.pass_()
    response = JsonResponse({"order": order.pk, "body": request.body.decode()}, status=201)
    response["Location"] = f"/orders/{order.pk}"
    response["X-Not-Replayed"] = "1"
    response.set_cookie("session", "secret")
    return response


@csrf_exempt
@idempotent
def status_view(request: HttpRequest, status: int) -> HttpResponse:
    runs.append(f"status {status}")
    return JsonResponse({"run": len(runs)}, status=status)


@csrf_exempt
@idempotent(max_body=10)
def big(request: HttpRequest) -> HttpResponse:
    runs.append("big")
    return JsonResponse({"text": "x" * 100}, status=201)


@csrf_exempt
@idempotent(max_body=10)
def streamed(request: HttpRequest) -> HttpResponse:
    runs.append("streamed")
    return StreamingHttpResponse(iter([b"a", b"b"]), content_type="text/plain")


@csrf_exempt
@idempotent(scope="ip")
def per_ip(request: HttpRequest) -> HttpResponse:
    runs.append("per_ip")
    return JsonResponse({"run": len(runs)})


@csrf_exempt
@idempotent(required=True, ttl=0.3)
def strict(request: HttpRequest) -> HttpResponse:
    runs.append("strict")
    return JsonResponse({"run": len(runs), "fence": current_fence()})


@csrf_exempt
@idempotent
def plain(request: HttpRequest) -> HttpResponse:
    runs.append("plain")
    return JsonResponse({"run": len(runs)})


# An async view held mid-run by asyncio events (tests/test_idempotency_cluster.py).
agate: dict[str, asyncio.Event | None] = {"entered": None, "open": None}


@csrf_exempt
@idempotent
async def acharge(request: HttpRequest) -> HttpResponse:
    runs.append("acharge")
    entered, opened = agate["entered"], agate["open"]
    if entered is not None and opened is not None:
        entered.set()
        await asyncio.wait_for(opened.wait(), WAIT)
    return JsonResponse({"run": len(runs), "body": request.body.decode()}, status=201)


class Checkout(View):
    @idempotent
    def post(self, request: HttpRequest) -> HttpResponse:
        runs.append("checkout")
        return JsonResponse({"run": len(runs)}, status=201)


urlpatterns = [
    path("charge/<str:db>/", charge),
    path("status/<int:status>/", status_view),
    path("big/", big),
    path("streamed/", streamed),
    path("per-ip/", per_ip),
    path("strict/", strict),
    path("plain/", plain),
    path("acharge/", acharge),
    path("checkout/", csrf_exempt(Checkout.as_view())),
]


# -- fixtures -----------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    runs.clear()
    gate.open.set()
    yield
    gate.open.set()


@pytest.fixture
def coffee() -> Callable[[str], Product]:
    def make(db: str) -> Product:
        return Product.objects.using(db).create(name="coffee", stock=10)

    return make


def post(
    client: Any, url: str, key: str | None = "k-1", body: str = '{"amount": 5}', **extra: Any
) -> Any:
    headers = {} if key is None else {"Idempotency-Key": key}
    return client.post(url, body, content_type="application/json", headers=headers, **extra)


def records(r: redis.Redis) -> list[bytes]:
    return sorted(r.scan_iter(match=f"{keyspace().prefix}:I:*"))


def in_thread(target: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(target())
        except Exception as exc:  # shown by the assertion that reads it
            out.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


# -- the four answers ------------------------------------------------------------------------
@db_all
@pytest.mark.parametrize("db", ALIASES)
def test_duplicate_during_the_run_gets_409_then_the_stored_response(
    db: str, coffee: Any, r: redis.Redis
) -> None:
    coffee(db)
    gate.hold()
    first, out = in_thread(lambda: post(Client(), f"/charge/{db}/"))
    assert gate.entered.wait(WAIT)
    busy = post(Client(), f"/charge/{db}/")
    assert busy.status_code == 409
    assert int(busy["Retry-After"]) >= 1
    assert busy.json()["error"] == "idempotency_key_in_use"
    assert busy["Cache-Control"] == "no-store"
    # Another body under the same key while the first runs: 422, not 409.
    other = post(Client(), f"/charge/{db}/", body='{"amount": 6}')
    assert other.status_code == 422
    gate.open.set()
    first.join(WAIT)
    original = out[0]
    assert original.status_code == 201
    assert REPLAYED_HEADER not in original

    replay = post(Client(), f"/charge/{db}/")
    assert replay.status_code == 201
    assert replay.content == original.content
    assert replay[REPLAYED_HEADER] == "true"
    assert replay["Content-Type"] == original["Content-Type"] == "application/json"
    assert replay["Location"] == original["Location"]
    assert "X-Not-Replayed" not in replay
    assert "session" not in replay.cookies
    assert runs == ["charge"]
    assert Order.objects.using(db).count() == 1


@pytest.mark.django_db(transaction=True)
def test_same_key_different_request_gets_422(coffee: Any) -> None:
    coffee("default")
    assert post(Client(), "/charge/default/").status_code == 201
    for response in (
        post(Client(), "/charge/default/", body='{"amount": 500}'),  # another body
        post(Client(), "/charge/default/?coupon=1"),  # another path
        Client().patch(
            "/charge/default/",
            '{"amount": 5}',
            content_type="application/json",
            headers={"Idempotency-Key": "k-1"},
        ),  # another method
        post(Client(), "/plain/"),  # another endpoint
    ):
        assert response.status_code == 422, response
        assert "different request" in response.json()["detail"]
    assert runs == ["charge"]


def test_key_in_quotes_is_the_same_key() -> None:
    # The draft sends a structured-field string; many clients send it bare.
    assert post(Client(), "/plain/", key='"abc"').status_code == 200
    replay = post(Client(), "/plain/", key="abc")
    assert replay[REPLAYED_HEADER] == "true"
    assert runs == ["plain"]


# -- failures are not stored ----------------------------------------------------------------
# -- commit ordering -----------------------------------------------------------------------------
@db_all
@pytest.mark.parametrize("db", ALIASES)
def test_response_is_stored_only_when_the_transaction_commits(
    db: str, coffee: Any, r: redis.Redis
) -> None:
    coffee(db)
    request = RequestFactory().post(
        f"/charge/{db}/", '{"a": 1}', content_type="application/json", HTTP_IDEMPOTENCY_KEY="t"
    )
    with transaction.atomic(using=db):
        assert charge(request, db).status_code == 201
        # Written, not committed: nothing to replay yet, and a duplicate waits.
        (key,) = records(r)
        assert r.hget(key, "state") == b"running"
    assert r.hget(key, "state") == b"done"

    # Rolled back: never stored, and the retry runs.
    request = RequestFactory().post(
        f"/charge/{db}/", '{"a": 1}', content_type="application/json", HTTP_IDEMPOTENCY_KEY="u"
    )
    with pytest.raises(RuntimeError), transaction.atomic(using=db):
        charge(request, db)
        raise RuntimeError("something after the view failed")
    assert Order.objects.using(db).count() == 1
    retry = post(Client(), f"/charge/{db}/", key="u", body='{"a": 1}')
    assert retry.status_code == 201
    assert REPLAYED_HEADER not in retry
    assert Order.objects.using(db).count() == 2


@db_all
@pytest.mark.parametrize("db", ALIASES)
def test_atomic_requests_commit_before_the_store(
    db: str, coffee: Any, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_redislock.idempotency import claim as idempotency_claim

    coffee(db)
    monkeypatch.setitem(connections.settings[db], "ATOMIC_REQUESTS", True)
    at_store: list[Any] = []
    at_commit: list[Any] = []
    real = idempotency_claim.write_record

    def write(client: Any, keys: Any, record: dict[bytes, bytes], *args: Any) -> bool:
        if record.get(b"state") == b"done":  # the store: the transaction is over
            at_store.append((connections[db].in_atomic_block, Order.objects.using(db).count()))
        return real(client, keys, record, *args)

    monkeypatch.setattr(idempotency_claim, "write_record", write)
    original = charge.__wrapped__  # type: ignore[attr-defined]

    def view_with_hook(request: HttpRequest, db: str) -> HttpResponse:
        assert connections[db].in_atomic_block
        # The view's own commit hook runs after the store, the first of them.
        transaction.on_commit(lambda: at_commit.append(len(at_store)), using=db)
        return original(request, db)

    wrapped = idempotent(view_with_hook)
    request = RequestFactory().post(
        f"/charge/{db}/", "{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY="ar"
    )
    response = wrapped(request, db)
    assert response.status_code == 201, response.content
    assert at_store == [(False, 1)]  # committed, and the order stands
    assert at_commit == [1]
    assert [r.hget(k, "state") for k in records(r)] == [b"done"]


@pytest.mark.django_db(transaction=True)
def test_a_commit_hook_that_raises_before_the_store_does_not_free_a_committed_key(
    coffee: Any, r: redis.Redis
) -> None:
    """The view runs inside a transaction the caller opened, after a commit hook
    that raises: Django runs no hook after it. The store, first of the hooks,
    has run, so the committed order is replayed and never charged again."""
    coffee("default")

    def fails() -> None:
        raise RuntimeError("a hook of the caller's")

    request = RequestFactory().post(
        "/charge/default/", "{}", content_type="application/json", HTTP_IDEMPOTENCY_KEY="h"
    )
    with pytest.raises(RuntimeError), transaction.atomic():
        transaction.on_commit(fails)
        assert charge(request, "default").status_code == 201
    assert Order.objects.count() == 1
    retry = post(Client(), "/charge/default/", key="h", body="{}")
    assert retry.status_code == 201
    assert retry[REPLAYED_HEADER] == "true"
    assert runs == ["charge"]


def test_the_guarded_run_of_an_async_view_outlives_its_requests_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The request waits for its run through a first cancellation (Django's, when
    the client leaves), and raises it after; a second one is raised at once, and
    the run still ends. What the run raised after its client left is logged."""
    from django_redislock.idempotency.detached import to_the_end

    async def scenario() -> list[str]:
        done: list[str] = []
        release = asyncio.Event()

        async def work(label: str, fail: bool = False) -> str:
            await release.wait()
            done.append(label)
            if fail:
                raise ValueError(f"{label} failed")
            return label

        once = asyncio.ensure_future(to_the_end("once", work, "once"))
        twice = asyncio.ensure_future(to_the_end("twice", work, "twice", True))
        await asyncio.sleep(0)  # both are waiting on their runs
        once.cancel()
        twice.cancel()
        await asyncio.sleep(0)
        twice.cancel()  # a server that insists
        with pytest.raises(asyncio.CancelledError):
            await twice
        assert not once.done() and done == []  # held until its run is over
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await once
        while len(done) < 2:  # the run of "twice", which nobody awaits
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        return done

    with caplog.at_level("INFO", logger="django_redislock.idempotency"):
        assert sorted(asyncio.run(scenario())) == ["once", "twice"]
    assert "holding once was cancelled" in caplog.text
    assert "failed" in caplog.text and "twice failed" in caplog.text


# -- expiry, scope, keys ------------------------------------------------------------------------
def test_stored_response_expires(r: redis.Redis) -> None:
    assert post(Client(), "/plain/").status_code == 200
    (key,) = records(r)
    assert 86_000_000 < r.pttl(key) <= 86_400_000  # 24 h by default
    r.delete(key)  # as expiry would
    assert REPLAYED_HEADER not in post(Client(), "/plain/")
    assert runs == ["plain", "plain"]


def test_short_ttl_runs_out(r: redis.Redis) -> None:
    assert post(Client(), "/strict/").status_code == 200
    assert post(Client(), "/strict/")[REPLAYED_HEADER] == "true"
    assert wait_until(lambda: records(r) == [], 10)
    assert REPLAYED_HEADER not in post(Client(), "/strict/")
    assert runs == ["strict", "strict"]


@pytest.mark.django_db(transaction=True)
def test_keys_are_per_user(django_user_model: Any) -> None:
    alice = Client()
    alice.force_login(django_user_model.objects.create(username="alice"))
    bob = Client()
    bob.force_login(django_user_model.objects.create(username="bob"))
    assert REPLAYED_HEADER not in post(alice, "/plain/")
    assert REPLAYED_HEADER not in post(bob, "/plain/")
    assert REPLAYED_HEADER not in post(Client(), "/plain/")  # anonymous: per IP
    assert post(alice, "/plain/")[REPLAYED_HEADER] == "true"
    assert runs == ["plain"] * 3


def test_the_scope_argument_ip_keys_by_address() -> None:
    """``scope="ip"`` on the decorator (anonymous requests through both forms:
    ``tests/test_idempotency_forms.py``)."""
    assert REPLAYED_HEADER not in post(Client(REMOTE_ADDR="10.0.0.1"), "/per-ip/")
    assert REPLAYED_HEADER not in post(Client(REMOTE_ADDR="10.0.0.2"), "/per-ip/")
    assert post(Client(REMOTE_ADDR="10.0.0.1"), "/per-ip/")[REPLAYED_HEADER] == "true"
    assert runs == ["per_ip"] * 2


def scope_by_tenant(request: HttpRequest) -> str:
    return request.headers.get("X-Tenant", "")


def test_scope_callable_from_settings() -> None:
    scoped = {"IDEMPOTENCY": {"SCOPE": f"{__name__}.scope_by_tenant"}}
    with override_settings(REDISLOCK=scoped):
        a = Client(headers={"X-Tenant": "a"})
        b = Client(headers={"X-Tenant": "b"})
        assert REPLAYED_HEADER not in post(a, "/plain/")
        assert REPLAYED_HEADER not in post(b, "/plain/")
        assert post(a, "/plain/")[REPLAYED_HEADER] == "true"
        with pytest.raises(TypeError, match="must return a non-empty str"):
            post(Client(), "/plain/")
    assert runs == ["plain"] * 2


def test_hostile_keys_are_hashed_and_share_the_locks_slot(r: redis.Redis) -> None:
    hostile = "{tag}*?[a-z]\\x:L:" + "~" * 200
    hostile = hostile.replace("\\", "/")
    assert post(Client(), "/plain/", key=hostile).status_code == 200
    assert post(Client(), "/plain/", key=hostile)[REPLAYED_HEADER] == "true"
    (key,) = records(r)
    assert b"tag" not in key and b"*" not in key and b"~" not in key
    name = key.split(b":=", 1)[1].decode()
    assert name.startswith("idempotency:")
    assert key_slot(key) == key_slot(keyspace().lock(name).lease)
    # A glob in a key is data, not a pattern: another key is another request.
    assert REPLAYED_HEADER not in post(Client(), "/plain/", key="*")
    assert runs == ["plain", "plain"]


def test_missing_key_runs_the_view_or_is_refused() -> None:
    assert post(Client(), "/plain/", key=None).status_code == 200
    assert post(Client(), "/plain/", key=None).status_code == 200
    refused = post(Client(), "/strict/", key=None)
    assert refused.status_code == 400
    assert refused.json()["error"] == "idempotency_key_missing"
    with override_settings(REDISLOCK={"IDEMPOTENCY": {"REQUIRED": True}}):
        assert post(Client(), "/plain/", key=None).status_code == 400
    assert runs == ["plain", "plain"]


def test_other_methods_and_disabled_run_as_undecorated(r: redis.Redis) -> None:
    headers = {"Idempotency-Key": "k"}
    assert Client().get("/plain/", headers=headers).status_code == 200
    assert Client().put("/plain/", headers=headers).status_code == 200
    with override_settings(REDISLOCK={"ENABLED": False}):
        post(Client(), "/plain/")
        post(Client(), "/plain/")
    assert records(r) == []
    assert len(runs) == 4


def test_text_answers_when_asked_for() -> None:
    response = Client().post(
        "/plain/",
        "x",
        content_type="text/plain",
        headers={"Idempotency-Key": "", "Accept": "text/plain"},
    )
    assert response.status_code == 400
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response.content.startswith(b"The Idempotency-Key header is empty")


# -- large and streamed responses ------------------------------------------------------------
@pytest.mark.parametrize("url", ["/big/", "/streamed/"])
def test_response_too_large_to_keep_is_not_run_again(url: str) -> None:
    first = post(Client(), url)
    assert first.status_code in (200, 201)
    again = post(Client(), url)
    assert again.status_code == first.status_code
    assert again[REPLAYED_HEADER] == "true"
    assert again["Idempotent-Body-Omitted"] == "true"
    assert again.content == b""
    assert again["Content-Type"] == first["Content-Type"]
    assert len(runs) == 1


# -- class-based views ------------------------------------------------------------
def test_class_based_view_method() -> None:
    assert post(Client(), "/checkout/").status_code == 201
    assert post(Client(), "/checkout/")[REPLAYED_HEADER] == "true"
    assert runs == ["checkout"]


# -- settings, checks and arguments ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "check_id", "needle"),
    [
        ([], "django_redislock.E060", "must be a dict"),
        ({"TLL": 5}, "django_redislock.E060", "Unknown REDISLOCK['IDEMPOTENCY'] key(s): 'TLL'"),
        ({"METHODS": "POST"}, "django_redislock.E061", "non-empty list of HTTP methods"),
        ({"METHODS": ["post"]}, "django_redislock.E061", "upper-case method names"),
        ({"TTL": 0}, "django_redislock.E062", "['TTL'] must be a finite number of seconds"),
        ({"MAX_BODY": -1}, "django_redislock.E062", "['MAX_BODY'] must be a whole number"),
        ({"MAX_KEY_LENGTH": 0}, "django_redislock.E062", "['MAX_KEY_LENGTH'] must be a whole"),
        ({"SCOPE": "users"}, "django_redislock.E063", "must be 'user', 'ip', a callable"),
        ({"REQUIRED": "yes"}, "django_redislock.E064", "['REQUIRED'] must be True or False"),
        ({"STORE_CLIENT_ERRORS": 1}, "django_redislock.E064", "must be True or False"),
        ({"HEADER": "Idempotency Key"}, "django_redislock.E065", "must be an HTTP header name"),
        ({"REPLAY_HEADERS": ["Set-Cookie"]}, "django_redislock.E065", "never hands out cookies"),
        ({"REPLAY_HEADERS": "Location"}, "django_redislock.E065", "must be a list of header"),
        ({"WAIT": -1}, "django_redislock.E062", "['WAIT'] must be a finite number of seconds"),
        ({"TIMEOUT": 0}, "django_redislock.E062", "['TIMEOUT'] must be a finite number"),
        ({"RENEW": "yes"}, "django_redislock.E064", "['RENEW'] must be True or False"),
    ],
)
def test_bad_settings_are_reported_by_the_checks(value: Any, check_id: str, needle: str) -> None:
    with override_settings(REDISLOCK={"IDEMPOTENCY": value}):
        messages = [m for m in check_settings() if m.id.startswith("django_redislock.E06")]
        assert [m.id for m in messages] == [check_id]
        assert needle in messages[0].msg
        assert messages[0].hint
        with pytest.raises(SystemCheckError, match=check_id.split(".")[1]):
            call_command("check", "django_redislock")


def test_good_settings_pass_the_checks() -> None:
    good = {
        "METHODS": ["POST", "PUT"],
        "HEADER": "X-Idempotency-Key",
        "REQUIRED": True,
        "SCOPE": scope_by_tenant,
        "TTL": 3600,
        "MAX_KEY_LENGTH": 64,
        "MAX_BODY": 0,
        "REPLAY_HEADERS": ["Location", "ETag"],
        "STORE_CLIENT_ERRORS": False,
        "WAIT": 2.5,
        "TIMEOUT": 60,
        "RENEW": True,
    }
    with override_settings(REDISLOCK={"IDEMPOTENCY": good}):
        assert [m for m in check_settings() if m.id.startswith("django_redislock.E06")] == []


def test_a_bad_setting_at_request_time_falls_back_to_its_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with override_settings(REDISLOCK={"IDEMPOTENCY": {"TTL": "a day"}}):
        assert post(Client(), "/plain/").status_code == 200
    assert "['TTL'] is invalid" in caplog.text


@pytest.mark.parametrize(
    ("kwargs", "error", "needle"),
    [
        ({"ttl": -1}, ValueError, "idempotent(): ttl must be a finite number of seconds"),
        ({"methods": ["get"]}, ValueError, "idempotent(): methods must hold upper-case"),
        ({"scope": "everyone"}, ValueError, "idempotent(): scope must be 'user', 'ip'"),
        ({"required": 1}, TypeError, "idempotent(): required must be True or False"),
        ({"alias": ""}, TypeError, "idempotent(): alias must name a CACHES entry"),
    ],
)
def test_bad_arguments_are_refused_when_decorating(kwargs: Any, error: type, needle: str) -> None:
    with pytest.raises(error) as info:
        idempotent(**kwargs)
    assert needle in str(info.value)


def test_decorating_a_class_or_a_non_view_says_what_to_do() -> None:
    with pytest.raises(TypeError, match=r"decorate its dispatch\(\)"):
        idempotent(Checkout)

    @idempotent
    def not_a_view(x: int) -> int:
        return x

    with pytest.raises(TypeError, match="Use redis_locked for functions and tasks"):
        not_a_view(1)


@csrf_exempt
@idempotent(wait=10)
def patient(request: HttpRequest) -> HttpResponse:
    runs.append("patient")
    gate.pass_()
    return JsonResponse({"run": len(runs)}, status=201)


urlpatterns.append(path("patient/", patient))


def duplicate_behind_the_first(
    r: redis.Redis, send: Callable[[], Any], gate: Gate
) -> tuple[Any, Any]:
    """The first request held at ``gate`` (its view's), a duplicate seen queued in
    Redis behind it, then the first let go: (first's response, duplicate's response)."""
    gate.hold()
    first, out = in_thread(send)
    assert gate.entered.wait(WAIT)
    second, later = in_thread(send)
    name = records(r)[0].split(b":=", 1)[1].decode()
    assert wait_until(lambda: r.llen(keyspace().lock(name).queue) == 1, WAIT)
    gate.open.set()
    first.join(WAIT)
    second.join(WAIT)
    return out[0], later[0]


def test_a_duplicate_with_wait_gets_the_response_once_the_first_is_done(r: redis.Redis) -> None:
    """The ``wait=`` argument (the ``WAIT`` setting, for both forms:
    ``tests/test_idempotency_forms.py``)."""
    out, later = duplicate_behind_the_first(r, lambda: post(Client(), "/patient/"), gate)
    assert out.status_code == later.status_code == 201
    assert later[REPLAYED_HEADER] == "true"
    assert later.content == out.content
    assert runs == ["patient"]


def test_the_documented_settings_table_is_the_real_defaults() -> None:
    """docs/idempotency.rst, Settings: every key, with the default it states."""
    import ast
    from pathlib import Path

    from django_redislock.idempotency import SETTINGS

    text = (Path(__file__).parent.parent / "docs" / "idempotency.rst").read_text()
    rows = re.findall(r"^``([A-Z_]+)``\s{2,}\S.*?\s{2,}``(.+?)``\s{2,}", text, re.MULTILINE)
    assert {key for key, _ in rows} == set(SETTINGS)
    for key, shown in rows:
        assert ast.literal_eval(shown) == SETTINGS[key], key


def test_a_multipart_body_read_before_the_view_is_fingerprinted_by_its_parts() -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile

    def upload(content: bytes, note: str = "a") -> Any:
        request = RequestFactory().post(
            "/plain/",
            {"note": note, "file": SimpleUploadedFile("r.txt", content)},
            HTTP_IDEMPOTENCY_KEY="up",
        )
        request.POST  # noqa: B018 - as CsrfViewMiddleware does: the body is gone
        return plain(request)

    assert REPLAYED_HEADER not in upload(b"receipt")
    assert upload(b"receipt")[REPLAYED_HEADER] == "true"
    assert upload(b"another receipt").status_code == 422
    assert upload(b"receipt", note="b").status_code == 422
    assert runs == ["plain"]


@pytest.mark.parametrize("limit", [None, 2621440])
def test_the_fingerprint_reads_the_body_through_a_bounded_buffer(limit: int | None) -> None:
    """A 3 MB body is hashed chunk by chunk through a spool that keeps at most
    FILE_UPLOAD_MAX_MEMORY_SIZE in memory, and the view reads it whole afterwards.
    Fails before this change: with DATA_UPLOAD_MAX_MEMORY_SIZE off the whole body
    was read into memory (request.body), with it on Django refused it."""
    import hashlib
    import tracemalloc

    from django_redislock.idempotency.fingerprint import fingerprint

    body = bytes(range(256)) * (3 * 1024 * 1024 // 256)
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=limit, FILE_UPLOAD_MAX_MEMORY_SIZE=262144):
        request = RequestFactory().post("/plain/", body, content_type="application/octet-stream")
        tracemalloc.start()
        try:
            digest = fingerprint(request)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 1024 * 1024, peak
        assert request.read() == body  # the view gets every byte, once
    expected = hashlib.sha256(b"POST\0/plain/\0" + body).hexdigest()
    assert digest == expected  # the digest of the bytes, as before


@pytest.mark.usefixtures("dead_redis")
@pytest.mark.parametrize("fail_open", [False, True])
def test_redis_down_is_503_even_when_locks_fail_open(fail_open: bool) -> None:
    # Running unguarded is what the decorator prevents: FAIL_OPEN does not apply.
    with override_settings(
        REDISLOCK={**settings.REDISLOCK, "FAIL_OPEN": fail_open}  # keeps the short timeouts
    ):
        response = post(Client(), "/plain/")
    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert runs == []


@csrf_exempt
@idempotent
def in_transaction(request: HttpRequest) -> HttpResponse:
    runs.append("in_transaction")
    return JsonResponse({"atomic": connections["default"].in_atomic_block})


urlpatterns.append(path("in-transaction/", in_transaction))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("key", ["t-1", None])
def test_atomic_requests_hold_with_and_without_a_key(
    key: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decorator tells Django it opens ATOMIC_REQUESTS itself: it must, also when
    a request has no key and the view runs as if undecorated (fails before this
    change without a key: the view ran outside any transaction)."""
    monkeypatch.setitem(connections.settings["default"], "ATOMIC_REQUESTS", True)
    assert post(Client(), "/in-transaction/", key=key).json() == {"atomic": True}
