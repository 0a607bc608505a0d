"""Views with the same body, so what is measured is what wraps them.

The body returns at once, or after ``BENCH_WORK_MS`` milliseconds of sleep
when set (a stand-in for a database query), to show the overhead against a
view that does some work. Two reference views bracket the decorator: one
makes two bare round trips to Redis (two PINGs, the floor for any lock that
takes one round trip to acquire and one to release), one takes a core
``Lock`` by hand with no Django layer around it.
"""

from __future__ import annotations

import time

import redis
from django.conf import settings
from django.http import HttpRequest, HttpResponse

from django_redislock.core import Lock

_WORK = settings.BENCH_WORK_MS / 1000
# gunicorn imports the site in each worker after forking: one client each.
_client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5.0)


def _body() -> HttpResponse:
    if _WORK:
        time.sleep(_WORK)
    return HttpResponse(b"ok", content_type="text/plain")


def plain(request: HttpRequest, key: str) -> HttpResponse:
    return _body()


# Same body; the path is matched by the concurrency-limit middleware's rule.
throttled = plain


def two_pings(request: HttpRequest, key: str) -> HttpResponse:
    _client.ping()
    response = _body()
    _client.ping()
    return response


def core_lock(request: HttpRequest, key: str) -> HttpResponse:
    lock = Lock(_client, f"bench:core:{key}", ttl=10, wait=10)
    if not lock.acquire():
        return HttpResponse(b"busy", status=409)
    try:
        return _body()
    finally:
        lock.release()


locked = None
if settings.HAS_DECORATOR:
    from django_redislock import redis_locked

    @redis_locked("bench:{key}")
    def locked(request: HttpRequest, key: str) -> HttpResponse:  # type: ignore[no-redef]
        return _body()
