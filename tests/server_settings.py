"""Settings for the gunicorn and uvicorn processes started by test_throttle_servers.py.

The test passes its private Redis in REDISLOCK_SERVER_REDIS_URL.
"""

from __future__ import annotations

import os

from tests.settings import *  # noqa: F403
from tests.settings import MIDDLEWARE as _BASE_MIDDLEWARE

ROOT_URLCONF = "tests.urls_throttle"

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ["REDISLOCK_SERVER_REDIS_URL"],
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
    }
}

MIDDLEWARE = [
    "django_redislock.middleware.ConcurrencyLimitMiddleware",
    *_BASE_MIDDLEWARE,
]

REDISLOCK = {
    "THROTTLE": [
        {"name": "slow", "path": r"^/reports/slow/", "limit": 3, "wait": 0.1},
        {"name": "aslow", "path": r"^/reports/aslow/", "limit": 2, "wait": 0.1},
        {"name": "named", "url_name": "named-view", "per": "ip", "limit": 2, "wait": 0},
        {"name": "stream", "path": r"^/a?stream/", "limit": 1, "wait": 0},
        {"name": "pid", "path": r"^/pid/", "limit": 1, "wait": 0, "timeout": 2},
    ]
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_redislock": {"handlers": ["console"], "level": "WARNING"}},
}
