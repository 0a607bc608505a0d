"""Concurrency limits for requests: ``REDISLOCK["THROTTLE"]`` rules and ``concurrency_limited``.

* ``rules.py``: a rule's parsing, validation (system checks) and matching.
* ``keys.py``: whom a request counts as (its rule's semaphore), the caller
  as the view will see it (``django_redislock/caller.py``).
* ``permits.py``: a refusal's records and signals, and giving permits back.
* ``middleware.py``: ``ConcurrencyLimitMiddleware`` and ``concurrency_limited``,
  a permit of a rule's semaphore held while the request runs.
* ``scopes.py`` and ``drf.py``: ``REDISLOCK["THROTTLE_SCOPES"]`` and DRF's
  ``ConcurrencyThrottle``, a permit per ``throttle_scope``.

``MIDDLEWARE`` names the middleware by its public path,
``django_redislock.middleware.ConcurrencyLimitMiddleware``.
"""
