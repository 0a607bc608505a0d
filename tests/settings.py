"""Settings for the test suite: one private Redis, SQLite or PostgreSQL."""

from __future__ import annotations

import os
import tempfile
from typing import Any

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["*"]

# conftest.py starts a private redis-server on this socket for the session.
REDIS_SOCKET = os.environ.setdefault(
    "REDISLOCK_TEST_SOCKET", os.path.join(tempfile.mkdtemp(prefix="redislock-"), "redis.sock")
)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_redislock",
    "tests.testapp",
    # Idempotency keys scoped by DRF's token authentication (test_idempotency_drf.py).
    "rest_framework",
    "rest_framework.authtoken",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "tests.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"unix://{REDIS_SOCKET}?db=0",
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
    }
}

# SQLite in a file (threads need a shared database, not :memory:).
DATABASES: dict[str, dict[str, Any]] = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(os.path.dirname(REDIS_SOCKET), "db.sqlite3"),
        "TEST": {"NAME": os.path.join(os.path.dirname(REDIS_SOCKET), "test.sqlite3")},
    }
}


def _postgres_reachable() -> bool:
    try:
        import psycopg
    except ImportError:
        return False
    try:
        psycopg.connect(
            host=PG["HOST"], port=PG["PORT"], user=PG["USER"], dbname=PG["NAME"], connect_timeout=2
        ).close()
    except Exception:
        return False
    return True


# A second database, "postgres", for the consistency tests, when a server
# answers (127.0.0.1:5432, database "test", by default). The suite creates and
# drops its own test database there. REDISLOCK_REQUIRE_POSTGRES=1 (CI) turns
# its absence into a failure instead of skipped tests.
PG: dict[str, Any] = {
    "ENGINE": "django.db.backends.postgresql",
    "HOST": os.environ.get("PGHOST", "127.0.0.1"),
    "PORT": os.environ.get("PGPORT", "5432"),
    "USER": os.environ.get("PGUSER", "postgres"),
    "NAME": os.environ.get("PGDATABASE", "test"),
    "TEST": {"NAME": f"test_django_redislock_{os.getpid()}"},
}
if _postgres_reachable():
    DATABASES["postgres"] = PG

REDISLOCK: dict[str, object] = {}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "/static/"
