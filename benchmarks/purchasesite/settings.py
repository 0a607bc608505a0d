"""Settings of the purchase benchmark's shop, from the environment ``benchmarks.purchase`` sets."""

from __future__ import annotations

import os

SECRET_KEY = "benchmark-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "benchmarks.purchasesite.urls"
WSGI_APPLICATION = "benchmarks.purchasesite.wsgi.application"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = ["django_redislock", "benchmarks.purchasesite"]
MIDDLEWARE: list[str] = []

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": os.environ.get("BENCH_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("BENCH_PG_PORT", "5432"),
        "USER": os.environ.get("BENCH_PG_USER", "postgres"),
        "NAME": os.environ.get("BENCH_PG_NAME", "redislock_bench"),
        # 0 is Django's default: a connection per request, opened at its
        # first query and closed when the response is done.
        "CONN_MAX_AGE": float(os.environ.get("BENCH_CONN_MAX_AGE", "0")),
    }
}
# Django's psycopg connection pool (Django 5.1+, psycopg-pool), per gunicorn
# process: a fixed number of connections its threads share; a thread that
# finds them all taken waits for one, up to the pool's timeout.
POOL_SIZE = int(os.environ.get("BENCH_POOL", "0"))
if POOL_SIZE:
    DATABASES["default"]["OPTIONS"] = {
        "pool": {"min_size": POOL_SIZE, "max_size": POOL_SIZE, "timeout": 10.0}
    }

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6399/0")
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
    }
}

REDISLOCK: dict[str, object] = {"TIMEOUT": 10.0, "WAIT": 10.0}
if os.environ.get("BENCH_CONNECT_EARLY") in ("0", "1"):
    REDISLOCK["CONNECT_EARLY"] = os.environ["BENCH_CONNECT_EARLY"] == "1"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
