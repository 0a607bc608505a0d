"""One shape for every refusal outside DRF: RFC 9457 problem+json unless asked otherwise.

A busy lock, an idempotency refusal and a throttled request answer a client
that accepts anything (curl's and requests' ``*/*``, or no ``Accept``) with
``application/problem+json`` and the same members; ``application/json`` when
the client names only that; HTML where the client prefers it (a browser);
plain text only when asked for. Sync and async views alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client, RequestFactory
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from django_redislock import concurrency_limited, redis_locked
from django_redislock.core.drivers.semaphore import Semaphore
from django_redislock.http import PROBLEM_JSON, preferred_type
from django_redislock.idempotency import idempotent
from django_redislock.refusals import TYPE_BASE
from tests.test_decorators import held  # noqa: F401 (fixture)

pytestmark = pytest.mark.urls("tests.test_refusal_shape")


@csrf_exempt
@concurrency_limited("shape", 1)
@idempotent
@redis_locked("shape", wait=0)
def view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("done", status=201)


@concurrency_limited("shape", 1)
@idempotent
@redis_locked("shape", wait=0)
async def async_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("done", status=201)


urlpatterns = [path("sync/", view), path("async/", csrf_exempt(async_view))]

BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, PROBLEM_JSON),
        ("*/*", PROBLEM_JSON),  # curl, requests, httpx
        ("application/json, text/plain, */*", "application/json"),  # axios
        ("application/json", "application/json"),
        ("application/problem+json", PROBLEM_JSON),
        ("application/problem+json, application/json", PROBLEM_JSON),
        (BROWSER, "text/html"),
        ("text/html;q=0.5, application/json", "application/json"),
        ("text/plain", "text/plain"),
        ("text/plain, */*;q=0.1", "text/plain"),
        ("image/png", PROBLEM_JSON),  # none of ours: JSON rather than a 406
        ("text/plain;q=0, */*", PROBLEM_JSON),
        ("application/json;q=oops", PROBLEM_JSON),
    ],
)
def test_the_shape_follows_accept(accept: str | None, expected: str) -> None:
    headers = {} if accept is None else {"Accept": accept}
    assert preferred_type(RequestFactory().get("/", headers=headers)) == expected


@pytest.fixture(params=["sync", "async"])
def post(request: pytest.FixtureRequest) -> Callable[..., Any]:
    url = f"/{request.param}/"

    def send(body: str = "{}", **headers: str) -> Any:
        if request.param == "sync":
            return Client().post(url, body, content_type="application/json", headers=headers)

        async def go() -> Any:
            return await AsyncClient().post(
                url, body, content_type="application/json", headers=headers
            )

        return async_to_sync(go)()

    return send


def _problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status
    assert response["Content-Type"] == PROBLEM_JSON
    assert response["Cache-Control"] == "no-store"
    body: dict[str, Any] = response.json()
    assert body["type"] == TYPE_BASE + code.replace("_", "-")
    assert body["status"] == status and body["code"] == code
    assert body["title"] and body["detail"]
    return body


def test_a_busy_lock(post: Any, held: Any) -> None:  # noqa: F811
    held("shape", timeout=20)
    body = _problem(post(), 409, "lock_busy")
    assert body["error"] == "busy"  # as before problem+json
    assert 1 <= body["retry_after"] <= 20


def test_an_idempotency_refusal(post: Any) -> None:
    assert post('{"a": 1}', **{"Idempotency-Key": "k"}).status_code == 201
    response = post('{"a": 2}', **{"Idempotency-Key": "k"})
    body = _problem(response, 422, "idempotency_key_reused")
    assert body["error"] == "idempotency_key_reused"
    assert "retry_after" not in body and not response.has_header("Retry-After")


def test_a_throttled_request(post: Any, r: redis.Redis) -> None:
    occupier = Semaphore(r, "throttle:shape", 1, ttl=20, wait=0)
    assert occupier.acquire()
    try:
        response = post()
    finally:
        occupier.release()
    body = _problem(response, 503, "throttled")
    assert body["retry_after"] == int(response["Retry-After"]) == 1


def test_html_for_a_browser_and_text_when_asked(post: Any, held: Any) -> None:  # noqa: F811
    held("shape", timeout=20)
    page = post(Accept=BROWSER)
    assert page.status_code == 409
    assert page["Content-Type"] == "text/html; charset=utf-8"
    assert b"<h1>Resource busy</h1>" in page.content
    assert page.has_header("Retry-After")
    text = post(Accept="text/plain")
    assert text.status_code == 409
    assert text["Content-Type"] == "text/plain; charset=utf-8"
    assert text.content == b"This resource is busy; try again shortly.\n"


def test_every_code_has_its_anchor_in_the_docs() -> None:
    """docs/views.rst, Refusals: each problem ``type`` is an address that exists."""
    from pathlib import Path

    from django_redislock.http import _KINDS
    from django_redislock.idempotency.responses import _TITLES

    page = (Path(__file__).resolve().parents[1] / "docs" / "views.rst").read_text()
    codes = [code for code, _, _ in _KINDS.values()] + list(_TITLES)
    for code in codes:
        assert f"_`{code}`" in page, code
    assert TYPE_BASE.endswith("/views.html#")
