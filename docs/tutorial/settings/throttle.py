# ruff: noqa: F821  (appended to mysite/settings.py, which defines MIDDLEWARE)
# Add to the end of mysite/settings.py:
MIDDLEWARE += ["django_redislock.middleware.ConcurrencyLimitMiddleware"]

REDISLOCK = {
    "THROTTLE": [
        # At most two sales reports run at once, across every worker and
        # server; a third request is answered 503 with Retry-After at once.
        {"name": "reports", "path": r"^/reports/", "limit": 2},
    ],
}
