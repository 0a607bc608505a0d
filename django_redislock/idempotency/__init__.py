"""Idempotent requests: a retried unsafe request runs its view once, and the retry gets the answer.

A client that sends ``Idempotency-Key: <key>`` with a ``POST`` (or another
method of ``METHODS``) may send the same request again, after a timeout or a
dropped connection, without the work being done twice (the IETF httpapi
"Idempotency-Key" draft; payment APIs work this way). docs/idempotency.rst
says what each request gets and what is guaranteed.

``@idempotent`` and ``IdempotencyMiddleware`` are two ways into one guarded
path (``guard.serve`` / ``guard.serve_async``): the same claim, lease check before
the commit, renewal, store after the commit and release. The modules:

``settings``     the ``REDISLOCK["IDEMPOTENCY"]`` keys, their checks, a call's ``Policy``
``fingerprint``  the key a request sends, and what it asks (method, path, body)
``scope``        whose keys are whose: the user as the view sees it
``responses``    problem answers, ``Retry-After`` hints, replays, what is stored
``guard``        the one guarded path
``claim``        a key's claim: the body run under the key's lock (``run_locked``)
``settling``     how an attempt inside transactions ends: stored at the commit, freed at a rollback
``detached``     an async view's guarded run, out of reach of its request's cancellation
``decorator``    ``@idempotent``
``middleware``   ``IdempotencyMiddleware``

The record in Redis is the core's (``read_record``, ``write_record``,
``forget_record``); keys are built in ``core/engine/keys.py``
(``KeySpace.idempotency``).
"""

from __future__ import annotations

from .decorator import idempotent
from .middleware import IdempotencyMiddleware
from .responses import OMITTED_HEADER, REPLAYED_HEADER
from .settings import MIDDLEWARE_PATH, RETRYABLE_STATUSES, SETTINGS

__all__ = [
    "MIDDLEWARE_PATH",
    "OMITTED_HEADER",
    "REPLAYED_HEADER",
    "RETRYABLE_STATUSES",
    "SETTINGS",
    "IdempotencyMiddleware",
    "idempotent",
]
