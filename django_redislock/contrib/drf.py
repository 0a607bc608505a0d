"""Django REST framework: lock errors as DRF responses, rendered by DRF.

Decorate a handler method with ``on_busy="raise"`` so the lock's errors reach
DRF's exception handling, then either mix ``LockErrorsMixin`` into the view or
set ``REST_FRAMEWORK["EXCEPTION_HANDLER"] =
"django_redislock.contrib.drf.exception_handler"``::

    class PurchaseView(LockErrorsMixin, APIView):
        @redis_locked("purchase:{pk}", on_busy="raise")
        def post(self, request, pk): ...

A busy lock becomes ``REDISLOCK['BUSY_STATUS']`` (409), Redis unreachable or
a lease lost before commit becomes 503; both carry ``Retry-After`` and a
``detail`` rendered by the view's renderers, like any DRF error.
"""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from ..conf import conf
from ..core.exceptions import LockLost, LockNotAcquired, RedisUnavailable
from ..http import UNAVAILABLE_RETRY_AFTER, retry_after_header

__all__ = ["LockBusy", "LockErrorsMixin", "LockUnavailable", "api_exception", "exception_handler"]


class _Retryable(exceptions.APIException):
    def __init__(self, detail: Any = None, code: Any = None, *, wait: int = 1) -> None:
        super().__init__(detail, code)
        # DRF's exception handler turns ``wait`` into Retry-After.
        self.wait = wait


class LockBusy(_Retryable):
    """The lock stayed busy past its wait (status ``REDISLOCK['BUSY_STATUS']``)."""

    status_code = 409
    default_detail = "This resource is busy; try again shortly."
    default_code = "lock_busy"

    def __init__(self, detail: Any = None, code: Any = None, *, wait: int = 1) -> None:
        super().__init__(detail, code, wait=wait)
        self.status_code = conf.BUSY_STATUS


class LockUnavailable(_Retryable):
    """Redis could not be reached, or the lease ran out before the work committed."""

    status_code = 503
    default_detail = "The lock service is unavailable; try again shortly."
    default_code = "lock_unavailable"


def api_exception(exc: BaseException) -> exceptions.APIException | None:
    """The DRF exception for a lock error, or None for anything else."""
    if isinstance(exc, LockNotAcquired):
        return LockBusy(wait=int(retry_after_header(exc.retry_after)))
    if isinstance(exc, RedisUnavailable):
        return LockUnavailable(wait=int(retry_after_header(UNAVAILABLE_RETRY_AFTER)))
    if isinstance(exc, LockLost):
        return LockUnavailable(wait=1)
    return None


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's default handler, which also knows the lock's errors."""
    converted = api_exception(exc)
    return drf_exception_handler(converted if converted is not None else exc, context)


class LockErrorsMixin:
    """For an APIView: lock errors become DRF responses, whatever the handler setting."""

    def handle_exception(self, exc: Exception) -> Response:
        converted = api_exception(exc)
        return super().handle_exception(  # type: ignore[misc]
            converted if converted is not None else exc
        )
