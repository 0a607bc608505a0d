"""Views the request-time fault scenarios call (Redis down, stalled)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import path

from django_redislock import redis_locked


@redis_locked("faults:view", wait=0)
def locked(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ran")


@redis_locked("faults:view-open", wait=0, fail_open=True)
def locked_open(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ran")


@redis_locked("faults:view-async", wait=0)
async def locked_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ran")


def plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ran")


urlpatterns = [
    path("locked/", locked),
    path("locked-open/", locked_open),
    path("locked-async/", locked_async),
    path("plain/", plain),
]
