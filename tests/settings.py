"""Settings for the test suite: one private Redis; SQLite, PostgreSQL, MariaDB/MySQL."""

from __future__ import annotations

import os
import tempfile
from typing import Any

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["*"]

# conftest.py starts a private redis-server on this socket for the session.
# Under pytest-xdist every worker has its own: the controller sets nothing a
# worker inherits, so each worker (and the servers it starts, which inherit its
# environment) agrees on one socket of its own.
_SOCKET_VAR = "REDISLOCK_TEST_SOCKET"
if os.environ.get("PYTEST_XDIST_WORKER") and not os.environ.get("REDISLOCK_TEST_SOCKET_WORKER"):
    os.environ["REDISLOCK_TEST_SOCKET_WORKER"] = os.environ["PYTEST_XDIST_WORKER"]
    os.environ.pop(_SOCKET_VAR, None)
REDIS_SOCKET = os.environ.setdefault(
    _SOCKET_VAR, os.path.join(tempfile.mkdtemp(prefix="redislock-"), "redis.sock")
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

# Every DRF view is throttled by concurrency per throttle_scope (test_drf_throttle.py);
# a view without a scope, or whose scope REDISLOCK["THROTTLE_SCOPES"] does not
# name, is not limited.
REST_FRAMEWORK = {
    "DEFAULT_THROTTLE_CLASSES": ["django_redislock.throttling.drf.ConcurrencyThrottle"],
}

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
# "postgres" runs at READ COMMITTED, Django's default; each other alias is the same test
# database at a stricter isolation level (TEST MIRROR), through connections of its own, as the
# MySQL ones below are.
POSTGRES_ISOLATION_LEVELS = {
    "postgres_repeatable_read": "REPEATABLE_READ",
    "postgres_serializable": "SERIALIZABLE",
}
if _postgres_reachable():
    from psycopg import IsolationLevel

    DATABASES["postgres"] = PG
    for _alias, _level in POSTGRES_ISOLATION_LEVELS.items():
        DATABASES[_alias] = {
            **PG,
            "OPTIONS": {"isolation_level": IsolationLevel[_level]},
            "TEST": {"MIRROR": "postgres"},
        }
    # The same database through Django's connection pool (Django 5.1+,
    # psycopg_pool): a connection closed by Django goes back to the pool, open.
    try:
        import psycopg_pool  # noqa: F401
    except ImportError:
        pass
    else:
        DATABASES["postgres_pool"] = {
            **PG,
            "OPTIONS": {"pool": {"min_size": 0, "max_size": 16, "timeout": 10}},
            "TEST": {"MIRROR": "postgres"},
        }


def _mysql_reachable() -> bool:
    try:
        import MySQLdb
    except ImportError:
        return False
    try:
        MySQLdb.connect(
            host=MYSQL["HOST"],
            port=int(MYSQL["PORT"]),
            user=MYSQL["USER"],
            password=MYSQL["PASSWORD"],
            database=MYSQL["NAME"],
            connect_timeout=2,
        ).close()
    except Exception:
        return False
    return True


# MariaDB or MySQL (InnoDB, mysqlclient), when a server answers
# (127.0.0.1:3306, user root, database "test", by default; the
# REDISLOCK_MYSQL_* variables below say otherwise). The suite creates and drops
# its own test database there, named after the process as PostgreSQL's is.
# "mysql" runs at READ COMMITTED, Django's default for MySQL; each other alias
# is the same test database at another isolation level (TEST MIRROR: one
# database, created and flushed once), through connections of its own.
# REDISLOCK_REQUIRE_MYSQL=1 (CI) turns its absence into a failure.
MYSQL: dict[str, Any] = {
    "ENGINE": "django.db.backends.mysql",
    "HOST": os.environ.get("REDISLOCK_MYSQL_HOST", "127.0.0.1"),
    "PORT": os.environ.get("REDISLOCK_MYSQL_PORT", "3306"),
    "USER": os.environ.get("REDISLOCK_MYSQL_USER", "root"),
    "PASSWORD": os.environ.get("REDISLOCK_MYSQL_PASSWORD", ""),
    "NAME": os.environ.get("REDISLOCK_MYSQL_DATABASE", "test"),
    "OPTIONS": {"isolation_level": "read committed"},
    "TEST": {"NAME": f"test_django_redislock_{os.getpid()}"},
}
MYSQL_ISOLATION_LEVELS = {
    "mysql": "read committed",
    "mysql_repeatable_read": "repeatable read",
    "mysql_serializable": "serializable",
    "mysql_read_uncommitted": "read uncommitted",
}
if _mysql_reachable():
    for _alias, _level in MYSQL_ISOLATION_LEVELS.items():
        DATABASES[_alias] = {
            **MYSQL,
            "OPTIONS": {"isolation_level": _level},
            "TEST": MYSQL["TEST"] if _alias == "mysql" else {"MIRROR": "mysql"},
        }

REDISLOCK: dict[str, object] = {}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "/static/"
