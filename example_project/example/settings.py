"""Settings of the example shop.

Everything a deployment changes comes from the environment:

``DATABASE_URL``
    ``postgres://...`` for PostgreSQL, ``mysql://...`` for MariaDB or MySQL
    (example/dburl.py); unset, a SQLite file beside manage.py.
``REDIS_URL``
    The Redis for locks, throttling and the cache (default redis://127.0.0.1:6379/0).
``SHOP_REDIS_PREFIX``
    Prefix of every Redis key the shop writes, so several copies can share one
    Redis without touching each other's keys (default ``shop``).
``DJANGO_DEBUG``, ``DJANGO_SECRET_KEY``
    As usual. Debug is on unless ``DJANGO_DEBUG=0``.
"""

from __future__ import annotations

import os
from pathlib import Path

from example.dburl import parse as parse_database_url

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-never-use-in-production")
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_redislock",
    "shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Early, so that a request turned away costs as little as possible.
    "django_redislock.middleware.ConcurrencyLimitMiddleware",
    "shop.middleware.arrival_time",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "example.urls"
WSGI_APPLICATION = "example.wsgi.application"
ASGI_APPLICATION = "example.asgi.application"

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

DATABASES = {
    "default": parse_database_url(
        os.environ.get("DATABASE_URL", f"sqlite:///{BASE_DIR / 'db.sqlite3'}")
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    DATABASES["default"]["OPTIONS"] = {
        # Several gunicorn workers write at once: wait for SQLite's write lock
        # instead of failing, take it at BEGIN (no deadlocked upgrades), and
        # let readers proceed while someone writes (WAL).
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
SHOP_REDIS_PREFIX = os.environ.get("SHOP_REDIS_PREFIX", "shop")

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": SHOP_REDIS_PREFIX,
    }
}

REDISLOCK = {
    "PREFIX": f"{SHOP_REDIS_PREFIX}:locks",
    # A purchase holds its lock for well under a second; 10 s is the bound if
    # a worker hangs. Waiting 5 s for a busy product, then 409 + Retry-After.
    "TIMEOUT": 10,
    "WAIT": 5,
    "THROTTLE": [
        # Reports are heavy: at most two run at once across all workers; a
        # third waits up to half a second for a permit, then gets 503.
        {"name": "reports", "path": r"^/reports/", "limit": 2, "per": "global", "wait": 0.5},
    ],
}

# How long the slow parts take (seconds): the payment step of a purchase and
# the query behind a report. Real code has no such settings; here they make
# the races easy to see.
SHOP_PURCHASE_DELAY = float(os.environ.get("SHOP_PURCHASE_DELAY", "0.02"))
SHOP_REPORT_DELAY = float(os.environ.get("SHOP_REPORT_DELAY", "0.25"))

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # When, how bad and from where: a bare message says none of it.
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    # Lock loss and Redis trouble are warnings; routine acquire/release is debug.
    "loggers": {"django_redislock": {"handlers": ["console"], "level": "WARNING"}},
}
