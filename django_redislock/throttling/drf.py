"""Django REST framework: ``ConcurrencyThrottle``, concurrent requests per ``throttle_scope``.

DRF's own throttles count requests per period; this one counts the requests
running at once. It reads the view's ``throttle_scope`` as DRF's
``ScopedRateThrottle`` does, and takes the scope's limit from
``REDISLOCK["THROTTLE_SCOPES"]`` (as ``ScopedRateThrottle`` takes its rate
from ``DEFAULT_THROTTLE_RATES``)::

    REST_FRAMEWORK = {
        "DEFAULT_THROTTLE_CLASSES": ["django_redislock.throttling.drf.ConcurrencyThrottle"],
    }
    REDISLOCK = {"THROTTLE_SCOPES": {"exports": 2}}

    class ExportView(APIView):
        throttle_scope = "exports"

A scope counts per caller by default (``"per": "user"``: the user DRF
authenticated, an anonymous client by its address; see
``django_redislock.caller``), like ``ScopedRateThrottle``. A view without a
``throttle_scope``, or whose scope has no limit, is not limited.

The permit is taken in ``allow_request`` (DRF has authenticated by then) and
given back when the response is finished: when DRF finalizes an ordinary
response, when the server closes a streaming one, and when the view raises
(DRF's exception handling answers, or the exception leaves the view). A
request that gets no permit within the scope's ``wait`` is refused through
DRF's ``Throttled`` (429, ``Retry-After`` from ``wait()``), rendered by the
project's exception handler like any DRF error.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import RedisError
from rest_framework import exceptions
from rest_framework.throttling import BaseThrottle

from ..caller import CallerUnknown, NotAuthenticated
from ..conf import conf
from ..core import RedisUnavailable
from ..stepping import run_steps
from .keys import ANONYMOUS, Asker, key_of
from .permits import (
    announce_throttled,
    label_of,
    release_on_close,
    releasing,
    retry_after_of,
    rule_permit,
    unavailable,
)
from .rules import Rule
from .scopes import scope_rule

__all__ = ["CallerUnknownError", "ConcurrencyThrottle"]

logger = logging.getLogger("django_redislock.throttle")

# Where the permits of one request wait for its response: on the view
# instance, which DRF makes afresh for every request.
_PERMITS = "_redislock_permits"


class CallerUnknownError(exceptions.APIException):
    """The scope counts per caller, and nothing the library can see names this one."""

    status_code = 500
    default_detail = "The server cannot tell who sent this request, so it is not served."
    default_code = "caller_unknown"


class ConcurrencyThrottle(BaseThrottle):
    """Caps the requests of a ``throttle_scope`` that run at once (``THROTTLE_SCOPES``)."""

    scope_attr = "throttle_scope"

    def __init__(self) -> None:
        self.scope: str | None = None
        self._wait: float | None = None

    def allow_request(self, request: Any, view: Any) -> bool:
        self.scope = getattr(view, self.scope_attr, None)
        if not self.scope or not conf.ENABLED:
            return True
        rule = scope_rule(self.scope)
        if rule is None:
            return True  # a scope of DRF's rate throttles only
        try:
            key = key_of(rule, request, Asker(request, (None, (), {})))
        except NotAuthenticated:
            return True  # DRF's own authentication answers
        except CallerUnknown as exc:
            logger.error("refused %s (scope %r): %s", label_of(request), rule.name, exc)
            raise CallerUnknownError(str(exc)) from exc
        if key is ANONYMOUS:
            return True  # the key callable exempted this request
        assert key is None or isinstance(key, str)
        return self._acquire(request, view, rule, key)

    def _acquire(self, request: Any, view: Any, rule: Rule, key: str | None) -> bool:
        sem = rule_permit(rule, key, request, asynchronous=False)
        try:
            acquired = sem.acquire()
        except (RedisUnavailable, RedisError) as exc:
            if unavailable(type(self), request, rule, exc) is None:
                return True  # THROTTLE_FAIL_OPEN (the default): served without a permit
            from ..contrib.drf import LockUnavailable

            raise LockUnavailable(wait=1) from exc
        if not acquired:
            self._wait = retry_after_of(rule)
            announce_throttled(type(self), request, rule, 429)  # DRF's Throttled is a 429
            return False
        _give_back_when_done(view, sem)
        return True

    def wait(self) -> float | None:
        return self._wait


def _give_back_when_done(view: Any, sem: Any) -> None:
    """Give ``sem`` back when ``view`` has answered: finalized, or raised."""
    permits: list[Any] = view.__dict__.setdefault(_PERMITS, [])
    permits.append(sem)
    if len(permits) > 1:
        return  # the view's methods already give the permits back
    finalize = view.finalize_response
    raise_uncaught = view.raise_uncaught_exception

    def finalize_response(request: Any, response: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            response = finalize(request, response, *args, **kwargs)
        except BaseException:
            _give_back(view)
            raise
        held = view.__dict__.pop(_PERMITS, [])
        if getattr(response, "streaming", False):
            release_on_close(response, held)  # when the server has sent the body
        else:
            run_steps(releasing(held))
        return response

    def raise_uncaught_exception(exc: Exception) -> None:
        _give_back(view)
        raise_uncaught(exc)

    view.finalize_response = finalize_response
    view.raise_uncaught_exception = raise_uncaught_exception


def _give_back(view: Any) -> None:
    run_steps(releasing(view.__dict__.pop(_PERMITS, [])))
