"""A site gunicorn serves for ``tests/test_interrupts_e2e.py``: one locked view.

``tests.settings`` with a Redis of the test's own (``REDISLOCK_E2E_REDIS_URL``)
and ``FAIL_OPEN`` on: an interrupt must stop the view even where Redis
failing would let it run. ``/locked/<phase>/`` runs under
``@redis_locked(NAME)``; its body notes ``body:<phase>`` in Redis, then, for
``hold``, waits on a list the test never fills (and notes ``after:hold`` if
it ever returns), and for ``release`` pauses Redis (the test gave its PID) so
that the release waits for its reply.

The library's client is traced: as it reads the reply of a script, it
appends ``reading <pid>`` to the trace file (``interrupt_gunicorn.trace``),
so the test can tell the worker waits for Redis. Each worker notes its PID in
the list ``e2e:workers`` as it loads the site.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import redis

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

from django.conf import settings  # noqa: E402

URL = os.environ["REDISLOCK_E2E_REDIS_URL"]
NAME = "e2e-interrupt"
LEASE = 10  # the view's lease, seconds
GO_WAIT = 60  # how long a holding body waits for a word that never comes

settings.ROOT_URLCONF = __name__
settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": URL}}
settings.REDISLOCK = {"FAIL_OPEN": True, "CLIENT": f"{__name__}.traced_client"}

from django.core.wsgi import get_wsgi_application  # noqa: E402

application = get_wsgi_application()

from django.http import HttpRequest, HttpResponse  # noqa: E402
from django.urls import path  # noqa: E402

from django_redislock import redis_locked  # noqa: E402
from tests.interrupt_gunicorn import trace  # noqa: E402

_redis = redis.Redis.from_url(URL, socket_timeout=GO_WAIT + 5)


class _Traced(redis.Connection):
    scripted = False

    def send_packed_command(self, command: Any, *args: Any, **kwargs: Any) -> None:
        data = command if isinstance(command, (bytes, bytearray)) else b"".join(command)
        self.scripted = b"EVALSHA" in data
        super().send_packed_command(command, *args, **kwargs)

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        if self.scripted:
            self.scripted = False
            trace("reading")
        return super().read_response(*args, **kwargs)


def traced_client(asyncio: bool = False) -> redis.Redis:
    pool = redis.ConnectionPool.from_url(
        URL, connection_class=_Traced, socket_timeout=2, socket_connect_timeout=2
    )
    return redis.Redis(connection_pool=pool)


@redis_locked(NAME, timeout=LEASE, wait=60)
def work(request: HttpRequest, phase: str) -> HttpResponse:
    _redis.rpush("e2e:events", f"body:{phase}")
    if phase == "hold":
        _redis.blpop(["e2e:go"], timeout=GO_WAIT)
        _redis.rpush("e2e:events", f"after:{phase}")
    elif phase == "release":
        # The release that follows waits for its reply.
        os.kill(int(os.environ["REDISLOCK_E2E_REDIS_PID"]), signal.SIGSTOP)
    return HttpResponse("done")


urlpatterns = [path("locked/<str:phase>/", work)]

_redis.rpush("e2e:workers", os.getpid())
