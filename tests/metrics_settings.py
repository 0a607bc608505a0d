"""Settings of the gunicorn site of tests/test_metrics_series.py: Prometheus on,
prometheus_client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR, set by the
test), a private Redis in REDISLOCK_SERVER_REDIS_URL."""

from __future__ import annotations

import os

from tests.settings import *  # noqa: F403

ROOT_URLCONF = "tests.urls_metrics"

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ["REDISLOCK_SERVER_REDIS_URL"],
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
    }
}

REDISLOCK = {
    "METRICS": ["prometheus"],
    "THROTTLE": [{"name": "exports", "path": r"^/exports/", "limit": 2, "wait": 0}],
}
