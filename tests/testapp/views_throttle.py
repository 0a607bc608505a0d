"""Views for the throttling tests, in-process and behind real servers.

``enter``/``leave`` keep an oracle in Redis, independent of the semaphore:
how many requests are inside a throttled view right now, and the most ever.

A view holds a request open until the test lets it go: ``?gate=<key>`` on a
``threading.Event`` (in-process tests), ``?rgate=<key>`` on the Redis list
``gate:<key>`` (a test in another process than the server pushes one item
per request to let go).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator

from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django_redis import get_redis_connection

from django_redislock.middleware import concurrency_limited

# Tests hold a view open with these (in-process only).
gates: dict[str, threading.Event] = {}
entered: dict[str, threading.Event] = {}

_PEAK = """
local inside = redis.call('INCR', KEYS[1])
if inside > tonumber(redis.call('GET', KEYS[2]) or '0') then
  redis.call('SET', KEYS[2], inside)
end
return inside
"""


def enter(name: str) -> int:
    return int(get_redis_connection().eval(_PEAK, 2, f"oracle:{name}:in", f"oracle:{name}:max"))


def leave(name: str) -> None:
    get_redis_connection().decr(f"oracle:{name}:in")


def _hold(request: HttpRequest, name: str) -> None:
    key = request.GET.get("gate")
    if key:
        entered.setdefault(key, threading.Event()).set()
        assert gates.setdefault(key, threading.Event()).wait(10), "gate never opened"


# Bound on a wait at a Redis gate, so that a failing test never leaves a server stuck.
GATE_WAIT = 60


def _wait_at_gate(key: str) -> None:
    if get_redis_connection().blpop([f"gate:{key}"], timeout=GATE_WAIT) is None:
        raise RuntimeError(f"gate {key!r} never opened")


def ok(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def slow(request: HttpRequest, **kwargs: object) -> HttpResponse:
    # One oracle per URL name: each has its own rule and limit.
    name = request.resolver_match.url_name if request.resolver_match else "slow"
    enter(name)
    try:
        _hold(request, name)
        if "rgate" in request.GET:
            _wait_at_gate(request.GET["rgate"])
        time.sleep(float(request.GET.get("sleep", "0")))
    finally:
        leave(name)
    return HttpResponse("done")


async def aslow(request: HttpRequest) -> HttpResponse:
    if request.GET.get("oracle"):
        from asgiref.sync import sync_to_async

        await sync_to_async(enter)("aslow")
        try:
            if "rgate" in request.GET:
                # A thread of its own per request: gates wait side by side.
                await sync_to_async(_wait_at_gate, thread_sensitive=False)(request.GET["rgate"])
            await asyncio.sleep(float(request.GET.get("sleep", "0")))
        finally:
            await sync_to_async(leave)("aslow")
        return HttpResponse("done")
    key = request.GET.get("gate")
    if key:
        entered.setdefault(key, threading.Event()).set()
        gate = gates.setdefault(key, threading.Event())
        deadline = time.monotonic() + 10
        while not gate.is_set():
            assert time.monotonic() < deadline, "gate never opened"
            await asyncio.sleep(0.005)
    await asyncio.sleep(float(request.GET.get("sleep", "0")))
    return HttpResponse("done")


def boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("view failed")


def stream(request: HttpRequest) -> StreamingHttpResponse:
    chunks = int(request.GET.get("chunks", "3"))
    pause = float(request.GET.get("pause", "0"))

    gate = request.GET.get("rgate")

    def body() -> Iterator[bytes]:
        for i in range(chunks):
            yield f"chunk{i}\n".encode()
            if gate and i == 0:
                _wait_at_gate(gate)
            time.sleep(pause)

    return StreamingHttpResponse(body(), content_type="text/plain")


async def astream(request: HttpRequest) -> StreamingHttpResponse:
    chunks = int(request.GET.get("chunks", "3"))
    pause = float(request.GET.get("pause", "0"))

    gate = request.GET.get("rgate")

    async def body() -> AsyncIterator[bytes]:
        from asgiref.sync import sync_to_async

        for i in range(chunks):
            yield f"chunk{i}\n".encode()
            if gate and i == 0:
                await sync_to_async(_wait_at_gate, thread_sensitive=False)(gate)
            await asyncio.sleep(pause)

    return StreamingHttpResponse(body(), content_type="text/plain")


def download(request: HttpRequest) -> FileResponse:
    return FileResponse(open(__file__, "rb"), content_type="text/plain")  # noqa: SIM115


def pid(request: HttpRequest) -> HttpResponse:
    """Report this worker's PID in the first chunk, then stay inside a long time."""

    def body() -> Iterator[bytes]:
        yield f"{os.getpid()}\n".encode()
        time.sleep(float(request.GET.get("sleep", "30")))
        yield b"end\n"

    return StreamingHttpResponse(body(), content_type="text/plain")


def client_key(request: HttpRequest) -> str | None:
    """A custom 'per' key: the X-Tenant header; no header means not throttled."""
    return request.headers.get("X-Tenant")


@concurrency_limited("deco", 1, wait=0)
def decorated(request: HttpRequest) -> HttpResponse:
    _hold(request, "deco")
    return HttpResponse("decorated")


@concurrency_limited("adeco", 1, per="ip", wait=0)
async def adecorated(request: HttpRequest) -> HttpResponse:
    return await aslow(request)


@concurrency_limited("deco-boom", 1)
def decorated_boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("decorated view failed")


def peak(request: HttpRequest) -> JsonResponse:
    c = get_redis_connection()
    name = request.GET["name"]
    return JsonResponse(
        {"max": int(c.get(f"oracle:{name}:max") or 0), "in": int(c.get(f"oracle:{name}:in") or 0)}
    )
