"""Settings of the benchmark site. Redis comes from ``BENCH_REDIS_URL``.

The decorator and the middleware are only wired in when their modules exist,
so the site still serves the plain path while they are being written.
"""

from __future__ import annotations

import os
from importlib.util import find_spec


def _exists(module: str) -> bool:
    try:
        return find_spec(module) is not None
    except ImportError:
        return False


def _flag(env: str, module: str) -> bool:
    # The load generator probes the imports first and passes the verdict here.
    value = os.environ.get(env)
    return _exists(module) if value is None else value == "1"


HAS_DECORATOR = _flag("BENCH_DECORATOR", "django_redislock.locking.decorators")
HAS_MIDDLEWARE = _flag("BENCH_MIDDLEWARE", "django_redislock.middleware")

# Milliseconds each benchmark view sleeps (0: none), set by ``--work-ms``.
BENCH_WORK_MS = float(os.environ.get("BENCH_WORK_MS", "0"))

SECRET_KEY = "benchmark-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "benchmarks.viewsite.urls"
WSGI_APPLICATION = "benchmarks.viewsite.wsgi.application"
USE_TZ = True

INSTALLED_APPS = ["django_redislock"]
MIDDLEWARE = ["django_redislock.middleware.ConcurrencyLimitMiddleware"] if HAS_MIDDLEWARE else []

# The decorator releases after the view's transaction; an in-memory database
# keeps that path real without any server.
# ``--no-db`` (BENCH_DB=0) leaves the site without any database, to show what
# the transaction handling costs.
DATABASES = (
    {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    if os.environ.get("BENCH_DB", "1") == "1"
    else {}
)

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6399/0")
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
    }
}

REDISLOCK = {
    "TIMEOUT": 10.0,
    "WAIT": 10.0,
    "THROTTLE": [
        # A limit the load never reaches: the cost of the check, not of waiting.
        {"name": "bench", "path": r"^/throttled/", "limit": 1000, "per": "global", "wait": 0.5},
    ],
}

# Metrics backends (``python -m benchmarks.metrics_cost`` sets BENCH_METRICS).
REDISLOCK["METRICS"] = [b for b in os.environ.get("BENCH_METRICS", "").split(",") if b]
if "opentelemetry" in REDISLOCK["METRICS"]:
    from .otel import setup

    setup()

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
