"""URLs of the site gunicorn serves in tests/test_metrics_series.py (tests/metrics_settings.py)."""

from __future__ import annotations

import redis
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.urls import path

from django_redislock import current_lock, redis_locked
from django_redislock.contrib.prometheus import metrics_view


@redis_locked("report:{n}", timeout=30, wait=0)
def report(request: HttpRequest, n: int) -> HttpResponse:
    return HttpResponse("ok")


@redis_locked("export:{n}", timeout=30, wait=0)
def export_losing_its_lease(request: HttpRequest, n: int) -> HttpResponse:
    """Its lease vanishes under it (as after a Redis restart): the release finds it lost."""
    lock = current_lock()
    assert lock is not None
    redis.Redis.from_url(settings.CACHES["default"]["LOCATION"]).delete(lock.keys.lease)
    return HttpResponse("ran")


urlpatterns = [
    path("metrics", metrics_view),
    path("report/<int:n>/", report),
    path("export/<int:n>/", export_losing_its_lease),
]
