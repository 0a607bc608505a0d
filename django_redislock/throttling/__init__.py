"""Concurrency limits for requests: ``REDISLOCK["THROTTLE"]`` rules and ``concurrency_limited``.

* ``rules.py``: a rule's parsing, validation (system checks) and matching.
* ``middleware.py``: ``ConcurrencyLimitMiddleware`` and ``concurrency_limited``,
  a permit of a rule's semaphore held while the request runs.

``MIDDLEWARE`` names the middleware by its public path,
``django_redislock.middleware.ConcurrencyLimitMiddleware``.
"""
