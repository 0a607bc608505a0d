# ruff: noqa: F821  (appended to mysite/settings.py, which defines INSTALLED_APPS)
# Add to the end of mysite/settings.py:
import os

INSTALLED_APPS += ["django_redislock", "shop"]

# The locks live in Redis, reached through a django-redis cache. REDIS_URL,
# when it is set, points to another server than the local one.
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
    }
}
