"""The example shop as gunicorn serves it, for ``tests/test_outlived_lease_e2e.py``.

``example.wsgi`` with what that test needs: ``ATOMIC_REQUESTS`` (as a payments
project runs), an idempotency lease of ``LEASE`` seconds without renewal, and
a payment step whose first call, in whichever worker, waits until the test
lets it go. The test runs in another process, so the two meet in Redis: the
first payment sets ``<prefix>:test:paying`` and blocks on the list
``<prefix>:test:go``, for at most ``GO_WAIT`` seconds.
"""

from __future__ import annotations

import os

import redis

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example.settings")

from django.conf import settings  # noqa: E402

LEASE = 2  # short, so that the first outlives it; long enough for the retry to commit in
GO_WAIT = 30

# Read by Django at its first connection and by the library at its first
# call, both after this.
settings.DATABASES["default"]["ATOMIC_REQUESTS"] = True
settings.REDISLOCK = {**settings.REDISLOCK, "IDEMPOTENCY": {"TIMEOUT": LEASE, "RENEW": False}}

from django.core.wsgi import get_wsgi_application  # noqa: E402

application = get_wsgi_application()

from shop import views  # noqa: E402

_redis = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=GO_WAIT + 5)
_prefix = f"{settings.SHOP_REDIS_PREFIX}:test"


def _first_payment_waits_for_the_test() -> None:
    first = _redis.set(f"{_prefix}:paying", os.getpid(), nx=True)
    if first and _redis.blpop([f"{_prefix}:go"], timeout=GO_WAIT) is None:
        raise RuntimeError("the test never let the first payment go")


views._pay = _first_payment_waits_for_the_test
