"""Django REST framework: the library's refusals as DRF exceptions, rendered by DRF.

Inside a DRF view (``APIView`` and its generic views, viewset actions,
``@api_view``) every refusal the library makes is raised as one of the
exceptions below, subclasses of ``Refused`` (a DRF ``APIException``): a busy
lock (``LockBusy``), Redis unavailable or a lease lost before commit
(``LockUnavailable``), an idempotency key refused (``IdempotencyRefused``),
a request throttled (``ConcurrencyThrottled``, also a DRF ``Throttled``). DRF's
exception handling, and the project's ``EXCEPTION_HANDLER``, render it like
any other DRF error: ``detail``, the code in ``get_codes()``, and
``Retry-After`` from ``wait``. Nothing to opt into.

A handler method decorated with ``on_busy="raise"`` raises the lock's own
exceptions instead; ``LockErrorsMixin``, or ``REST_FRAMEWORK["EXCEPTION_HANDLER"]
= "django_redislock.contrib.drf.exception_handler"``, turns those into the
same DRF exceptions::

    class PurchaseView(LockErrorsMixin, APIView):
        @redis_locked("purchase:{pk}", on_busy="raise")
        def post(self, request, pk): ...
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponseBase
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from ..conf import conf
from ..core import LockLost, LockNotAcquired, RedisUnavailable
from ..refusals import UNAVAILABLE_RETRY_AFTER, Refusal, retry_after_header

__all__ = [
    "ConcurrencyThrottled",
    "IdempotencyRefused",
    "LockBusy",
    "LockErrorsMixin",
    "LockUnavailable",
    "Refused",
    "api_exception",
    "exception_handler",
    "refused",
    "response_for",
]


class Refused(exceptions.APIException):
    """A refusal of the library, raised inside a DRF view.

    ``refusal`` is the library's description (status, code, title, detail,
    ``retry_after``, and its problem ``type``), for a handler that wants more
    than DRF's ``detail``; None when raised from a lock exception.
    """

    refusal: Refusal | None = None

    def __init__(
        self,
        detail: Any = None,
        code: Any = None,
        *,
        wait: int | None = None,
        status: int | None = None,
    ) -> None:
        # APIException's own: a subclass of DRF's Throttled takes other arguments.
        exceptions.APIException.__init__(self, detail, code)
        # DRF's exception handler turns ``wait`` into Retry-After.
        self.wait = wait
        if status is not None:
            self.status_code = status


class LockBusy(Refused):
    """The lock stayed busy past its wait (status ``REDISLOCK['BUSY_STATUS']``)."""

    status_code = 409
    default_detail = "This resource is busy; try again shortly."
    default_code = "lock_busy"

    def __init__(
        self,
        detail: Any = None,
        code: Any = None,
        *,
        wait: int | None = 1,
        status: int | None = None,
    ) -> None:
        super().__init__(detail, code, wait=wait, status=status or conf.BUSY_STATUS)


class LockUnavailable(Refused):
    """Redis could not be reached, or the lease ran out before the work committed."""

    status_code = 503
    default_detail = "The lock service is unavailable; try again shortly."
    default_code = "lock_unavailable"


class IdempotencyRefused(Refused):
    """A request with an idempotency key that is not run: 400 (no key, a bad
    key), 409 (in flight, outcome unknown), 422 (key reused), 500 (no scope)."""

    status_code = 409
    default_detail = "This idempotency key cannot be used for this request."
    default_code = "idempotency_refused"


class ConcurrencyThrottled(Refused, exceptions.Throttled):
    """A concurrency limit's refusal: 429 per client, 503 for a global rule.

    A DRF ``Throttled`` too, for handlers that treat throttling apart.
    """

    status_code = 429
    default_detail = "Too many concurrent requests; try again shortly."
    default_code = "throttled"


def refused(refusal: Refusal) -> Refused:
    """The DRF exception for one of the library's refusals."""
    if refusal.code == "lock_busy":
        kind: type[Refused] = LockBusy
    elif refusal.code == "lock_unavailable":
        kind = LockUnavailable
    elif refusal.code == "throttled":
        kind = ConcurrencyThrottled
    elif refusal.code.startswith("idempotency_"):
        kind = IdempotencyRefused
    else:
        kind = Refused
    exc = kind(refusal.detail, refusal.code, wait=refusal.retry_after, status=refusal.status)
    exc.refusal = refusal
    return exc


def response_for(
    view: Any,
    request: HttpRequest,
    exc: exceptions.APIException,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> HttpResponseBase:
    """``exc`` answered by the DRF view ``view`` (an ``as_view()`` function) as
    its dispatch would answer it: the view's exception handling and the
    project's ``EXCEPTION_HANDLER``, its renderers and content negotiation.

    For a refusal made before the view ran (its authentication, permissions
    and throttles have not: they answer nothing here). The response renders
    as the view's would, when Django's handler renders it.
    """
    instance = view.cls(**view.initkwargs)
    actions = getattr(view, "actions", None)
    if actions:  # a viewset: its action, as ViewSetMixin.as_view() binds it
        instance.action_map = actions
    instance.args, instance.kwargs = args, kwargs
    drf_request = instance.initialize_request(request, *args, **kwargs)
    instance.request = drf_request
    instance.headers = instance.default_response_headers
    instance.format_kwarg = instance.get_format_suffix(**kwargs)
    response = instance.handle_exception(exc)
    return instance.finalize_response(drf_request, response, *args, **kwargs)


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
