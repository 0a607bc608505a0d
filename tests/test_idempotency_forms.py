"""Every idempotency scenario through both forms, ``@idempotent`` and ``IdempotencyMiddleware``.

Both run one guarded path, so both must give the same answers: each test runs
with ``form`` (the decorator on ``/dec/...``, the middleware on ``/mw/...``),
``kind`` (a sync view, or its async twin on ``.../async-<name>/``) and ``send``
(``Client``, the sync chain, or ``AsyncClient``, the async one). Real Redis,
real databases; threads synchronised by events.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync, sync_to_async
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.signals import got_request_exception
from django.db import connections, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.template import engines
from django.template.response import TemplateResponse
from django.test import AsyncClient, Client, override_settings
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from django_redislock.idempotency import MIDDLEWARE_PATH, REPLAYED_HEADER, idempotent
from django_redislock.locking.context import current_lock
from django_redislock.locking.factories import keyspace
from tests.helpers_oracles import signal_sent, wait_until
from tests.test_decorators import dead_redis  # noqa: F401 - a fixture
from tests.test_idempotency import WAIT, Gate, duplicate_behind_the_first, in_thread, records
from tests.testapp.models import Order, Product

pytestmark = pytest.mark.urls("tests.test_idempotency_forms")

gate = Gate()
runs: list[str] = []
HAS_PG = "postgres" in settings.DATABASES


def _order(db: str) -> Order:
    product, _ = Product.objects.using(db).get_or_create(name="tea", defaults={"stock": 5})
    return Order.objects.using(db).create(product=product)


# -- views (plain; the decorator and the middleware are applied below) ---------------------
def pay(request: HttpRequest) -> HttpResponse:
    runs.append("pay")
    first = runs.count("pay") == 1
    order = _order(request.GET.get("db", "default"))
    if first:
        gate.pass_()
    response = JsonResponse({"order": order.pk, "body": request.body.decode()}, status=201)
    response["Location"] = f"/orders/{order.pk}"
    return response


def fail(request: HttpRequest) -> HttpResponse:
    runs.append("fail")
    if runs.count("fail") == 1:
        raise RuntimeError("provider down")
    return JsonResponse({"ok": True})


def rolled_back(request: HttpRequest) -> HttpResponse:
    runs.append("rolled_back")
    order = _order("default")
    transaction.set_rollback(True)  # nothing of this request commits
    return JsonResponse({"order": order.pk}, status=201)


def templated(request: HttpRequest) -> HttpResponse:
    runs.append("templated")
    template = engines["django"].from_string("run {{ run }}")
    return TemplateResponse(request, template, {"run": len(runs)}, status=201)


def bad_template(request: HttpRequest) -> HttpResponse:
    runs.append("bad_template")
    _order("default")
    template = engines["django"].from_string("{% url 'nowhere' %}")  # fails as it renders
    return TemplateResponse(request, template, status=201)


def streamed(request: HttpRequest) -> HttpResponse:
    runs.append("streamed")
    return StreamingHttpResponse(iter([b"a", b"b"]), content_type="text/plain")


def plain(request: HttpRequest) -> HttpResponse:
    runs.append("plain")
    return JsonResponse({"run": len(runs)})


def status(request: HttpRequest) -> HttpResponse:
    code = int(request.GET["status"])
    runs.append(f"status {code}")
    return JsonResponse({"status": code, "run": len(runs), "é": "ü"}, status=code)


def upload(request: HttpRequest) -> HttpResponse:
    runs.append("upload")
    return JsonResponse(
        {"note": request.POST["note"], "file": request.FILES["file"].read().decode()}
    )


def upload_digest(request: HttpRequest) -> HttpResponse:
    """Parses the upload itself (a csrf_exempt view, as every DRF APIView is)."""
    runs.append("upload_digest")
    upload = request.FILES["file"]
    digest = hashlib.sha256()
    for chunk in upload.chunks():
        digest.update(chunk)
    return JsonResponse(
        {"note": request.POST["note"], "size": upload.size, "sha256": digest.hexdigest()}
    )


def async_twin(view: Callable[..., HttpResponse]) -> Callable[..., Any]:
    """The view as an async view: the same work, its sync part (ORM, gate) in a thread."""

    async def twin(request: HttpRequest) -> HttpResponse:
        return await sync_to_async(view)(request)

    return twin


SYNC_VIEWS: dict[str, Callable[..., Any]] = {
    "pay": pay,
    "fail": fail,
    "rolled-back": rolled_back,  # sync only: Django refuses ATOMIC_REQUESTS for async views
    "templated": templated,
    "bad-template": bad_template,  # sync only, as rolled-back
    "streamed": streamed,
    "plain": plain,
    "status": status,
    "upload": upload,
    "upload-digest": upload_digest,
}
VIEWS = {
    **SYNC_VIEWS,
    **{
        f"async-{name}": async_twin(view)
        for name, view in SYNC_VIEWS.items()
        if name not in ("rolled-back", "bad-template")
    },
}
urlpatterns = [path(f"mw/{name}/", csrf_exempt(view)) for name, view in VIEWS.items()] + [
    path(f"dec/{name}/", csrf_exempt(idempotent(view))) for name, view in VIEWS.items()
]


# -- fixtures ------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    runs.clear()
    gate.open.set()
    yield
    gate.open.set()


@pytest.fixture(params=["decorator", "middleware"])
def form(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``form(**IDEMPOTENCY)``: the settings of one form, as a context manager."""

    def configure(**idempotency: Any) -> Any:
        if request.param == "decorator":
            return override_settings(
                REDISLOCK={**settings.REDISLOCK, "IDEMPOTENCY": idempotency},
            )
        return override_settings(
            MIDDLEWARE=[*settings.MIDDLEWARE, MIDDLEWARE_PATH],
            REDISLOCK={**settings.REDISLOCK, "IDEMPOTENCY": {"PATHS": ["^/mw/"], **idempotency}},
        )

    configure.prefix = "/dec" if request.param == "decorator" else "/mw"  # type: ignore[attr-defined]
    return configure


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    """The view's kind; a test for sync views only parametrizes ``kind`` itself."""
    return str(request.param)


@pytest.fixture(params=["client", "async_client"])
def send(request: pytest.FixtureRequest, form: Any, kind: str) -> Callable[..., Any]:
    """POST ``/<form>/<name>/<query>`` with a key (None: without the header), to
    the view of ``kind``, through the sync chain or the async one."""
    prefix = f"{form.prefix}/" if kind == "sync" else f"{form.prefix}/async-"

    def post(client: Any, name: str, key: Any, body: str, query: str, cookies: Any) -> Any:
        client.cookies.update(cookies or {})
        return client.post(
            f"{prefix}{name}/{query}",
            body,
            content_type="application/json",
            headers={} if key is None else {"Idempotency-Key": key},
        )

    def sync_send(
        name: str, key: Any = "k-1", body: str = "{}", query: str = "", cookies: Any = None
    ) -> Any:
        return post(Client(raise_request_exception=False), name, key, body, query, cookies)

    async def _async_send(*args: Any) -> Any:
        return await post(AsyncClient(raise_request_exception=False), *args)

    def async_send(
        name: str, key: Any = "k-1", body: str = "{}", query: str = "", cookies: Any = None
    ) -> Any:
        return async_to_sync(_async_send)(name, key, body, query, cookies)

    return sync_send if request.param == "client" else async_send


def lease_of(r: redis.Redis) -> bytes:
    (record,) = records(r)
    return keyspace().lock(record.split(b":=", 1)[1].decode()).lease


# -- the scenarios -----------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_a_duplicate_while_it_runs_gets_409_and_a_short_retry_after_then_the_replay(
    form: Any, send: Any
) -> None:
    """Retry-After is about how long the first has run (here well under a second),
    not the lease's 30 s (fails before this change: it was 30)."""
    with form():
        gate.hold()
        first, out = in_thread(lambda: send("pay"))
        assert gate.entered.wait(WAIT)
        busy = send("pay")
        assert busy.status_code == 409
        assert busy.json()["error"] == "idempotency_key_in_use"
        assert 1 <= int(busy["Retry-After"]) < 30
        assert send("pay", body='{"other": 1}').status_code == 422
        gate.open.set()
        first.join(WAIT)
        assert out[0].status_code == 201
        replay = send("pay")
    assert replay.status_code == 201
    assert replay.content == out[0].content
    assert replay["Location"] == out[0]["Location"]
    assert replay[REPLAYED_HEADER] == "true"
    assert runs == ["pay"]
    assert Order.objects.count() == 1


@pytest.fixture
def claimed(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    """A gate at the first step after the claim: the read under the key's lock,
    before the request has recorded that it started (sync and asyncio reads)."""
    from django_redislock.idempotency import claim as idempotency_claim

    held = Gate()
    real, real_async = idempotency_claim.read_record, idempotency_claim.read_record_async

    def read(client: Any, keys: Any) -> Any:
        if current_lock() is not None:
            held.pass_()
        return real(client, keys)

    async def read_async(client: Any, keys: Any) -> Any:
        if current_lock() is not None:
            await asyncio.to_thread(held.pass_)
        return await real_async(client, keys)

    monkeypatch.setattr(idempotency_claim, "read_record", read)
    monkeypatch.setattr(idempotency_claim, "read_record_async", read_async)
    yield held
    held.open.set()


def test_a_duplicate_sent_as_the_first_claims_the_key_is_told_to_retry_in_a_second(
    form: Any, send: Any, claimed: Gate, r: redis.Redis
) -> None:
    """The first holds the key's lease but has not yet recorded when it started:
    the hint is a short retry, never the lease (fails before this change: the
    fallback was the lease's 30 s)."""
    with form():
        for attempt in range(10):
            key = f"early-{attempt}"
            claimed.hold()
            first, out = in_thread(lambda key=key: send("plain", key=key))
            assert claimed.entered.wait(WAIT)
            assert records(r) == []  # the first has not marked the key yet
            busy = send("plain", key=key)
            claimed.open.set()
            first.join(WAIT)
            assert busy.status_code == 409, busy.content
            assert busy.json()["error"] == "idempotency_key_in_use"
            assert busy["Retry-After"] == "1"
            assert out[0].status_code == 200
            r.delete(*records(r))
    assert runs == ["plain"] * 10


@pytest.mark.django_db(transaction=True)
def test_concurrent_copies_of_one_key_run_the_view_exactly_once(form: Any, send: Any) -> None:
    copies = 4
    start = threading.Barrier(copies, timeout=WAIT)
    answered = threading.Semaphore(0)

    def copy() -> Any:
        start.wait()
        try:
            return send("pay")
        finally:
            answered.release()

    with form():
        gate.hold()
        sent = [in_thread(copy) for _ in range(copies)]
        # Every copy but the one running has its answer before the first is done.
        assert gate.entered.wait(WAIT)
        for _ in range(copies - 1):
            assert answered.acquire(timeout=WAIT)
        gate.open.set()
        for thread, _ in sent:
            thread.join(WAIT)
        later = send("pay")
    statuses = sorted(out[0].status_code for _, out in sent)
    assert statuses == [201] + [409] * (copies - 1)
    assert later[REPLAYED_HEADER] == "true"
    assert runs == ["pay"]
    assert Order.objects.count() == 1


@pytest.mark.parametrize(
    ("key", "needle"),
    [
        ("", "is empty"),
        ('""', "is empty"),
        ("x" * 256, "256 characters long"),
        ("clé", "characters not allowed"),
        ("a b", "characters not allowed"),
        ('a"b', "characters not allowed"),
    ],
)
def test_a_malformed_key_gets_400_naming_the_shape(
    form: Any, send: Any, key: str, needle: str
) -> None:
    with form():
        response = send("plain", key=key)
        assert send("plain", key=None).status_code == 200  # no key: the view runs
    assert response.status_code == 400
    assert response.json()["error"] == "idempotency_key_invalid"
    assert needle in response.json()["detail"]
    assert "1 to 255 visible ASCII characters" in response.json()["detail"]
    assert runs == ["plain"]


def test_a_crashed_first_attempt_leaves_its_key_as_an_outcome_unknown(
    form: Any, send: Any, r: redis.Redis
) -> None:
    """A process killed after marking the key leaves its marker and no lease: its
    view may have done its work, so a retry is answered 409, outcome unknown, and
    never runs it (it did before this change), until the record expires."""
    with form():
        assert send("plain").status_code == 200
        (record,) = records(r)
        # As a worker killed after marking the key and before storing leaves it.
        r.hset(record, mapping={"state": "running"})
        r.hdel(record, "status", "headers", "body")
        again = send("plain")
        other = send("plain", body='{"other": 1}')
        r.delete(record)  # as its expiry would
        later = send("plain")
    assert again.status_code == 409
    assert again.json()["error"] == "idempotency_outcome_unknown"
    assert "Retry-After" not in again  # waiting does not help
    assert other.status_code == 422
    assert later.status_code == 200 and REPLAYED_HEADER not in later
    assert runs == ["plain"] * 2


@pytest.mark.django_db(transaction=True)
def test_with_wait_a_duplicate_waits_for_the_first_and_gets_its_response(
    form: Any, send: Any, r: redis.Redis
) -> None:
    """WAIT is the key's lock's, for both forms: the duplicate queues (seen in
    Redis) instead of getting 409, and is answered with the stored response."""
    with form(WAIT=WAIT):
        out, later = duplicate_behind_the_first(r, lambda: send("pay"), gate)
    assert out.status_code == later.status_code == 201
    assert later[REPLAYED_HEADER] == "true"
    assert later.content == out.content
    assert runs == ["pay"]


def test_a_failure_is_not_stored_and_the_retry_runs(form: Any, send: Any, r: redis.Redis) -> None:
    """The exception reaches Django's own handling (a 500 and its signal) for both forms."""
    with form(), signal_sent(got_request_exception) as failed:
        assert send("fail").status_code == 500
        assert len(failed) == 1
        assert records(r) == []
        assert send("fail").status_code == 200
        assert send("fail")[REPLAYED_HEADER] == "true"
    assert runs == ["fail", "fail"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["sync"])  # an async view has no ATOMIC_REQUESTS
def test_a_rolled_back_response_is_never_stored(
    form: Any, kind: str, send: Any, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ATOMIC_REQUESTS and transaction.set_rollback(True): nothing committed, so the
    retry must run (fails before this change with the middleware: the 201 was replayed)."""
    monkeypatch.setitem(connections.settings["default"], "ATOMIC_REQUESTS", True)
    with form():
        assert send("rolled-back").status_code == 201
        assert records(r) == []  # the key is free again
        again = send("rolled-back")
    assert again.status_code == 201
    assert REPLAYED_HEADER not in again
    assert runs == ["rolled_back"] * 2
    assert Order.objects.count() == 0


@pytest.mark.skipif(not HAS_PG, reason="PostgreSQL not reachable")
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
def test_a_request_that_outlives_its_lease_rolls_back_instead_of_committing_twice(
    form: Any, kind: str, send: Any, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease runs out while the first request works, and its marker is lost
    (a Redis restart without persistence): a retry runs and commits. The first
    must not commit too: its lease is checked before its commit, and its
    transaction rolls back (503). Fails before this change with the middleware:
    both committed (two orders, 201 and 201). An async view has no transaction
    (Django refuses ATOMIC_REQUESTS for one): its writes stand, and only its
    response is dropped, the retry's being the one kept. (With the marker kept,
    the retry does not run: the next test.)"""
    if kind == "sync":
        monkeypatch.setitem(connections.settings["postgres"], "ATOMIC_REQUESTS", True)
    with form(TIMEOUT=1, RENEW=False):
        gate.hold()
        first, out = in_thread(lambda: send("pay", query="?db=postgres"))
        assert gate.entered.wait(WAIT)
        lease = lease_of(r)
        wait_until(lambda: not r.exists(lease), WAIT)
        r.delete(*records(r))  # the marker lost
        retry = send("pay", query="?db=postgres")
        gate.open.set()
        first.join(WAIT)
        later = send("pay", query="?db=postgres")
    assert retry.status_code == 201
    assert later[REPLAYED_HEADER] == "true"
    assert later.content == retry.content
    assert runs == ["pay", "pay"]
    rolled_back = kind == "sync"
    assert out[0].status_code == (503 if rolled_back else 201)
    assert Order.objects.using("postgres").count() == (1 if rolled_back else 2)


@pytest.mark.django_db(transaction=True)
def test_without_a_transaction_a_request_that_outlived_its_lease_keeps_the_retrys_record(
    form: Any, send: Any, r: redis.Redis
) -> None:
    """No transaction to roll back: the first request's work stands, but its marker
    was lost and the retry ran meanwhile: the retry's response is the one stored,
    never overwritten by the first's late store. Fails before this change for
    sync views, whose late store overwrote the retry's record (async views kept it)."""
    with form(TIMEOUT=1, RENEW=False):
        gate.hold()
        first, out = in_thread(lambda: send("pay"))
        assert gate.entered.wait(WAIT)
        lease = lease_of(r)
        wait_until(lambda: not r.exists(lease), WAIT)
        r.delete(*records(r))  # the marker lost
        retry = send("pay")
        gate.open.set()
        first.join(WAIT)
        later = send("pay")
    assert retry.status_code == out[0].status_code == 201
    assert later[REPLAYED_HEADER] == "true"
    assert later.content == retry.content != out[0].content
    assert runs == ["pay", "pay"]


@pytest.mark.django_db(transaction=True)
def test_a_retry_while_the_first_outlives_its_lease_is_an_outcome_unknown(
    form: Any, send: Any, r: redis.Redis
) -> None:
    """The lease runs out while the first request works, its marker intact: the
    retry cannot tell a slow first from a dead one, and is answered 409, outcome
    unknown, instead of running beside it (before this change it ran: two runs).
    The first then stores its response over its own marker, and later retries
    get it."""
    with form(TIMEOUT=1, RENEW=False):
        gate.hold()
        first, out = in_thread(lambda: send("pay"))
        assert gate.entered.wait(WAIT)
        lease = lease_of(r)
        wait_until(lambda: not r.exists(lease), WAIT)
        retry = send("pay")
        gate.open.set()
        first.join(WAIT)
        later = send("pay")
    assert retry.status_code == 409
    assert retry.json()["error"] == "idempotency_outcome_unknown"
    assert out[0].status_code == later.status_code == 201
    assert later[REPLAYED_HEADER] == "true"
    assert later.content == out[0].content
    assert runs == ["pay"]


@pytest.mark.django_db(transaction=True)
def test_renewal_keeps_the_key_past_its_timeout(form: Any, send: Any, r: redis.Redis) -> None:
    """RENEW applies to both forms (fails before this change with the middleware,
    which had no lock options: the lease ran out and the duplicate ran)."""
    with form(TIMEOUT=1, RENEW=True):
        gate.hold()
        first, out = in_thread(lambda: send("pay"))
        assert gate.entered.wait(WAIT)
        lease = lease_of(r)
        seen: list[int] = [r.pttl(lease)]

        def renewed_three_times() -> bool:
            now = r.pttl(lease)
            if now > seen[-1]:
                seen.append(now)
            else:
                seen[-1] = now
            return len(seen) > 3

        # Three renewals: longer than the 1 s timeout has passed since the run began.
        wait_until(renewed_three_times, WAIT)
        busy = send("pay")
        gate.open.set()
        first.join(WAIT)
    assert busy.status_code == 409
    assert out[0].status_code == 201
    assert runs == ["pay"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["sync"])  # an async view has no ATOMIC_REQUESTS
def test_a_template_that_fails_to_render_rolls_the_work_back(
    form: Any, kind: str, send: Any, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rendered under the lock, inside the transaction: the work is not left done
    and unrecorded."""
    monkeypatch.setitem(connections.settings["default"], "ATOMIC_REQUESTS", True)
    with form():
        assert send("bad-template").status_code == 500
        assert records(r) == []
        assert send("bad-template").status_code == 500
    assert runs == ["bad_template"] * 2
    assert Order.objects.count() == 0


def test_a_template_response_is_stored_with_its_body(form: Any, send: Any) -> None:
    with form():
        original = send("templated")
        replay = send("templated")
    assert original.status_code == replay.status_code == 201
    assert original.content == replay.content == b"run 1"
    assert replay[REPLAYED_HEADER] == "true"
    assert runs == ["templated"]


def test_a_streaming_response_is_stored_without_its_body(form: Any, send: Any) -> None:
    with form():
        assert send("streamed").status_code == 200
        again = send("streamed")
    assert again[REPLAYED_HEADER] == "true"
    assert again["Idempotent-Body-Omitted"] == "true"
    assert again.content == b""
    assert runs == ["streamed"]


@pytest.mark.django_db(transaction=True)
def test_keys_are_per_user(form: Any, send: Any, django_user_model: Any) -> None:
    alice = django_user_model.objects.create(username="alice")
    bob = django_user_model.objects.create(username="bob")

    def as_user(user: Any) -> Any:
        client = Client()
        client.force_login(user)
        return {"cookies": client.cookies}

    with form():
        assert REPLAYED_HEADER not in send("plain", **as_user(alice))
        assert REPLAYED_HEADER not in send("plain", **as_user(bob))
        assert send("plain", **as_user(alice))[REPLAYED_HEADER] == "true"
    assert runs == ["plain", "plain"]


@pytest.mark.usefixtures("dead_redis")
def test_redis_down_is_503_and_the_view_does_not_run(form: Any, send: Any) -> None:
    with form():  # over dead_redis's settings: its short timeouts are kept
        response = send("plain")
    assert response.status_code == 503
    assert runs == []


def test_the_answer_and_the_lock_are_the_same_for_both_forms(form: Any, r: redis.Redis) -> None:
    """One key, one scope: the record a form writes is where the other looks."""
    with form():
        Client().post(
            f"{form.prefix}/plain/",
            "{}",
            content_type="application/json",
            headers={"Idempotency-Key": "same"},
        )
    (record,) = records(r)
    assert r.hget(record, "state") == b"done"
    name = record.split(b":=", 1)[1].decode()
    assert name == keyspace().idempotency("ip:127.0.0.1", "same").name


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["async"])
def test_an_async_view_under_atomic_requests_is_refused_as_django_refuses_it(
    form: Any, kind: str, send: Any, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Django refuses ATOMIC_REQUESTS for an async view (RuntimeError, a 500) before
    it runs; both forms must too (fails before this change with the middleware,
    which ran the view with no transaction at all)."""
    monkeypatch.setitem(connections.settings["default"], "ATOMIC_REQUESTS", True)
    with form():
        assert send("plain").status_code == 500
    assert runs == []
    assert records(r) == []


# -- what is stored, how long, for whom: through both forms -----------------------------------
@pytest.mark.parametrize("code", [500, 503, 408, 409, 425, 429])
def test_a_failed_or_retryable_status_is_not_stored(
    form: Any, send: Any, code: int, r: redis.Redis
) -> None:
    with form():
        assert send("status", query=f"?status={code}").status_code == code
        assert records(r) == []
        assert send("status", query=f"?status={code}").status_code == code
    assert runs == [f"status {code}"] * 2


@pytest.mark.parametrize("store", [True, False])
def test_client_errors_are_stored_unless_told_not_to(form: Any, send: Any, store: bool) -> None:
    with form(STORE_CLIENT_ERRORS=store):
        assert send("status", query="?status=402").status_code == 402
        again = send("status", query="?status=402")
    assert again.status_code == 402
    assert (REPLAYED_HEADER in again) is store
    assert len(runs) == (1 if store else 2)


def test_a_replay_is_byte_identical_and_another_request_with_the_key_gets_422(
    form: Any, send: Any
) -> None:
    with form():
        first = send("status", query="?status=201", body='{"amount": 5}')
        again = send("status", query="?status=201", body='{"amount": 5}')
        assert send("status", query="?status=201", body='{"amount": 500}').status_code == 422
        assert send("status", query="?status=200", body='{"amount": 5}').status_code == 422
        other = send("plain", body='{"amount": 5}')
    assert first.status_code == again.status_code == 201
    assert again[REPLAYED_HEADER] == "true"
    assert again.content == first.content
    assert again["Content-Type"] == first["Content-Type"]
    assert other.status_code == 422
    assert "different request" in other.json()["detail"]
    assert runs == ["status 201"]


def test_a_stored_response_lives_for_the_ttl_then_the_key_is_new(
    form: Any, send: Any, r: redis.Redis
) -> None:
    with form(TTL=600):
        assert send("plain").status_code == 200
        (record,) = records(r)
        assert 590_000 < r.pttl(record) <= 600_000
        assert send("plain")[REPLAYED_HEADER] == "true"
        r.delete(record)  # as its expiry would
        assert REPLAYED_HEADER not in send("plain")
    assert runs == ["plain", "plain"]


def test_a_response_too_large_to_keep_is_answered_without_its_body(form: Any, send: Any) -> None:
    with form(MAX_BODY=8):
        first = send("plain")
        again = send("plain")
    assert again.status_code == first.status_code == 200
    assert again[REPLAYED_HEADER] == "true"
    assert again["Idempotent-Body-Omitted"] == "true"
    assert again.content == b""
    assert runs == ["plain"]


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("send", ["client"], indirect=True)
def test_anonymous_keys_are_per_address(form: Any, kind: str, send: Any) -> None:
    path = f"{form.prefix}/plain/" if kind == "sync" else f"{form.prefix}/async-plain/"

    def post(addr: str) -> Any:
        return Client(REMOTE_ADDR=addr).post(
            path, "{}", content_type="application/json", headers={"Idempotency-Key": "k"}
        )

    with form():
        assert REPLAYED_HEADER not in post("10.0.0.1")
        assert REPLAYED_HEADER not in post("10.0.0.2")
        assert post("10.0.0.1")[REPLAYED_HEADER] == "true"
    assert runs == ["plain"] * 2


def test_a_response_that_cannot_be_stored_is_logged_and_never_run_again(
    form: Any, send: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis fails after the view's work: the outcome is unknown to the record, so
    the key is kept and a retry is answered 409 (it ran the view again before this
    change)."""
    from django_redislock import RedisUnavailable
    from django_redislock.idempotency import claim as idempotency_claim

    real, real_async = idempotency_claim.write_record, idempotency_claim.write_record_async

    def failing(client: Any, keys: Any, record: dict[bytes, bytes], *args: Any) -> bool:
        if record.get(b"state") == b"done":  # Redis fails after the view's work
            raise RedisUnavailable("connection lost")
        return real(client, keys, record, *args)

    async def failing_async(client: Any, keys: Any, record: dict[bytes, bytes], *args: Any) -> bool:
        if record.get(b"state") == b"done":
            raise RedisUnavailable("connection lost")
        return await real_async(client, keys, record, *args)

    with form(), caplog.at_level("WARNING", logger="django_redislock.idempotency"):
        monkeypatch.setattr(idempotency_claim, "write_record", failing)
        monkeypatch.setattr(idempotency_claim, "write_record_async", failing_async)
        assert send("plain").status_code == 200
        assert "answered 409, outcome unknown" in caplog.text
        monkeypatch.setattr(idempotency_claim, "write_record", real)
        monkeypatch.setattr(idempotency_claim, "write_record_async", real_async)
        retry = send("plain")
    assert retry.status_code == 409
    assert retry.json()["error"] == "idempotency_outcome_unknown"
    assert runs == ["plain"]


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("send", ["client"], indirect=True)
def test_a_multipart_body_is_fingerprinted_by_its_parts(form: Any, kind: str, send: Any) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile

    path = f"{form.prefix}/upload/" if kind == "sync" else f"{form.prefix}/async-upload/"

    def post(content: bytes, note: str = "a") -> Any:
        return Client().post(
            path,
            {"note": note, "file": SimpleUploadedFile("r.txt", content)},
            headers={"Idempotency-Key": "up"},
        )

    with form():
        assert post(b"receipt").json() == {"note": "a", "file": "receipt"}
        assert post(b"receipt")[REPLAYED_HEADER] == "true"
        assert post(b"another receipt").status_code == 422
        assert post(b"receipt", note="b").status_code == 422
    assert runs == ["upload"]


# A multipart upload above DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB), which Django accepts
# for a view that parses it (request.FILES streams it to disk) but refuses to hold
# as request.body.
BIG = bytes(range(256)) * (3 * 1024 * 1024 // 256)
BOUNDARY = "big-upload-boundary"


def asgi_post(path: str, body: bytes, headers: dict[str, str]) -> Any:
    """POST through Django's own ASGIHandler, as an ASGI server drives it: the body
    in chunks of 64 KiB, which Django spools into a SpooledTemporaryFile (the
    request's stream, unlike the test clients' LimitedStream)."""
    from django.core.handlers.asgi import ASGIHandler

    async def run() -> tuple[int, bytes, dict[bytes, bytes]]:
        chunks = [body[i : i + 65536] for i in range(0, len(body), 65536)] or [b""]
        messages = [
            {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
            for i, chunk in enumerate(chunks)
        ]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            await asyncio.Future()  # the client stays: Django cancels this wait
            raise AssertionError("unreachable")

        async def send_message(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [
                (b"host", b"testserver"),
                (b"content-length", str(len(body)).encode()),
                *((name.lower().encode(), value.encode()) for name, value in headers.items()),
            ],
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
        }
        await ASGIHandler()(scope, receive, send_message)
        start = next(m for m in sent if m["type"] == "http.response.start")
        content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return start["status"], content, {k.lower(): v for k, v in start["headers"]}

    return async_to_sync(run)()


@pytest.mark.parametrize("client", ["client", "async_client", "asgi"])
def test_an_upload_above_djangos_memory_limit_is_served_as_without_a_key(
    form: Any, kind: str, client: str
) -> None:
    """A 3 MB upload to a view that parses it: 200 with a key as without one, the
    same answer, a replay, and 422 for another upload under the key. Fails before
    this change with a 400 whenever the key is sent: the fingerprint read
    request.body, which Django refuses above DATA_UPLOAD_MAX_MEMORY_SIZE."""
    from django.test.client import encode_multipart

    path = (
        f"{form.prefix}/upload-digest/" if kind == "sync" else f"{form.prefix}/async-upload-digest/"
    )

    def post(content: bytes, key: str | None) -> tuple[int, bytes, bool]:
        """(status, body, replayed)."""
        headers = {} if key is None else {"Idempotency-Key": key}
        upload = SimpleUploadedFile("big.bin", content)
        if client == "asgi":
            body = encode_multipart(BOUNDARY, {"note": "n", "file": upload})
            headers["Content-Type"] = f"multipart/form-data; boundary={BOUNDARY}"
            status, content, sent = asgi_post(path, body, headers)
            return status, content, sent.get(REPLAYED_HEADER.lower().encode()) == b"true"
        data = {"note": "n", "file": upload}
        if client == "client":
            response = Client().post(path, data, headers=headers)
        else:
            response = async_to_sync(AsyncClient().post)(path, data, headers=headers)
        return response.status_code, response.content, response.get(REPLAYED_HEADER) == "true"

    other = BIG[:-1] + b"!"
    with form():
        assert len(BIG) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        without = post(BIG, None)
        first = post(BIG, "big")
        again = post(BIG, "big")
        reused = post(other, "big")
    assert without[0] == first[0] == again[0] == 200, (without, first)
    assert json.loads(without[1]) == {
        "note": "n",
        "size": len(BIG),
        "sha256": hashlib.sha256(BIG).hexdigest(),
    }
    assert first[1] == without[1] and not first[2]
    assert again[1] == first[1] and again[2]
    assert reused[0] == 422
    assert runs == ["upload_digest"] * 2
