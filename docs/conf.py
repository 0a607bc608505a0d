"""Sphinx configuration for the django-redislock documentation."""

from __future__ import annotations

import sys
from pathlib import Path

import django
from django.conf import settings

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

# autodoc imports the Django side of the package, which needs configured
# settings; nothing here connects to Redis or to a database.
if not settings.configured:
    settings.configure(
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "django_redislock",
        ],
        CACHES={
            "default": {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": "redis://127.0.0.1:6379/0",
            }
        },
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        USE_TZ=True,
    )
    django.setup()

import django_redislock  # noqa: E402

project = "django-redislock"
author = "The django-redislock authors"
copyright = "The django-redislock authors"  # noqa: A001
release = django_redislock.__version__
version = ".".join(release.split(".")[:2])

# No intersphinx: the build must not need the network.
# rendered_errors (docs/_ext): fails the build on what a page shows as an error
# without a warning, such as Furo's box over a ".. contents::" table.
extensions = ["sphinx.ext.autodoc", "rendered_errors"]

exclude_patterns = ["_build"]
html_theme = "furo"
html_title = f"django-redislock {release}"

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True}
