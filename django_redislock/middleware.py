"""The public path of the throttling middleware, as ``MIDDLEWARE`` names it.

``"django_redislock.middleware.ConcurrencyLimitMiddleware"`` is written in
settings files and in the system checks' hints, so it stays here; the
middleware itself lives in ``throttling/``.
"""

from .throttling.middleware import ConcurrencyLimitMiddleware, concurrency_limited

__all__ = ["ConcurrencyLimitMiddleware", "concurrency_limited"]
