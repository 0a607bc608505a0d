"""The ASGI application that ``tests/test_idempotency_asgi_e2e.py`` runs under uvicorn and daphne.

Settings of its own, with a private Redis (``REDISLOCK_SERVER_REDIS_URL``),
``IdempotencyMiddleware`` serving ``/mw/`` and ``@idempotent`` on ``/dec/``,
keys scoped by address, and no database. Its own URLconf: the same async view behind each
form. The view counts its runs in Redis, and its first run, once its work is
done, makes Redis stall writes (``CLIENT PAUSE ... WRITE``, as a failover
does) for ``PAUSE_MS``, less than the library's socket timeout: the response
is then stored while Redis stalls. The test ends the stall itself, once it
has seen what it waits for; the pause's own end is only a bound.

The library logs ``django_redislock.idempotency`` at INFO to the server's
output, which the test reads.
"""

from __future__ import annotations

import os

import redis.asyncio
from django.conf import settings

URL = os.environ["REDISLOCK_SERVER_REDIS_URL"]
SOCKET_TIMEOUT = 20.0
PAUSE_MS = 15_000  # below the socket timeout: a stall, not an outage

# Only what these views need (no database, no other app): a quick start.
settings.configure(
    SECRET_KEY="tests-only",
    ALLOWED_HOSTS=["*"],
    USE_TZ=True,
    ROOT_URLCONF=__name__,
    INSTALLED_APPS=["django_redislock"],
    MIDDLEWARE=["django_redislock.idempotency.IdempotencyMiddleware"],
    CACHES={
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": URL,
            "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
        }
    },
    REDISLOCK={
        "SOCKET_TIMEOUT": SOCKET_TIMEOUT,
        "IDEMPOTENCY": {"PATHS": [r"^/mw/"], "SCOPE": "ip"},
    },
    LOGGING={
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"console": {"class": "logging.StreamHandler"}},
        "loggers": {"django_redislock.idempotency": {"handlers": ["console"], "level": "INFO"}},
    },
)

from django.core.asgi import get_asgi_application  # noqa: E402

application = get_asgi_application()

from django.http import HttpRequest, HttpResponse, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402

from django_redislock.idempotency import idempotent  # noqa: E402

RUNS = "e2e:runs"


async def pay(request: HttpRequest) -> HttpResponse:
    client = redis.asyncio.Redis.from_url(URL, socket_timeout=SOCKET_TIMEOUT)
    try:
        run = await client.incr(RUNS)
        if run == 1:
            # The work is done; now Redis stalls, while the response is stored.
            await client.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
    finally:
        await client.aclose()
    return JsonResponse({"run": run}, status=201)


def ok(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("ok/", ok),
    path("mw/pay/", csrf_exempt(pay)),
    path("dec/pay/", csrf_exempt(idempotent(pay))),
]
