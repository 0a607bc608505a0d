"""Settings for the gunicorn gevent workers started by tests/test_green_threads.py.

The test passes its private Redis in REDISLOCK_GREEN_REDIS_URL, a SQLite file
in REDISLOCK_GREEN_DB and a directory for the views' gates in
REDISLOCK_GREEN_GATES. The cache is Django's own RedisCache, as in a project
that has no django-redis. Leases are renewed, so a purchase that holds its
lock longer than TIMEOUT keeps it only if renewal runs. Renewal runs every
third of TIMEOUT: 3 s leaves a renewal 2 s to come in on a loaded host, and
the socket timeout stays within the third the system check asks for.
"""

from __future__ import annotations

import os

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = ["django_redislock", "tests.testapp"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "tests.urls_green"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["REDISLOCK_GREEN_DB"],
        # Two servers write at once: wait for SQLite's write lock,
        # take it at BEGIN, and let readers proceed while someone writes.
        "OPTIONS": {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL;",
        },
    }
}

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": os.environ["REDISLOCK_GREEN_REDIS_URL"],
    }
}

# WAIT bounds a purchase queued behind others on a loaded host; none waits
# for a lease to run out.
REDISLOCK = {"RENEW": True, "TIMEOUT": 3.0, "WAIT": 60, "SOCKET_TIMEOUT": 1.0}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_redislock": {"handlers": ["console"], "level": "WARNING"}},
}
