"""Requests and responses as every feature sees them.

Which request a call serves (``request_in``) and who sent it (``client_ip``);
and the one shape of every refusal the library makes (``refuse``): a busy
lock, Redis unavailable, an idempotency key refused, a request throttled.

Inside a Django REST framework view (the request is DRF's ``Request``), a
refusal is raised as a DRF ``APIException`` (``contrib/drf.py``), so the
project's ``EXCEPTION_HANDLER`` renders it like any other DRF error. Outside
DRF it is a response in the shape the client prefers: RFC 9457
``application/problem+json`` unless the client asks for something else,
``text/html`` for clients that prefer HTML (browsers), ``text/plain`` when
asked for. Every refusal has ``Cache-Control: no-store``, and ``Retry-After``
when a retry can succeed later.

A lock, unavailable or throttle refusal can be replaced through a setting
holding a callable or dotted path; the replacement receives ``(request, *,
status, retry_after, reason, name)`` and returns a response.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.utils.html import format_html
from django.utils.module_loading import import_string

from .conf import conf
from .refusals import UNAVAILABLE_RETRY_AFTER, Refusal, retry_after_header

__all__ = [
    "PROBLEM_JSON",
    "UNAVAILABLE_RETRY_AFTER",
    "Refusal",
    "client_ip",
    "error_response",
    "in_drf_view",
    "is_drf_view",
    "preferred_type",
    "problem_body",
    "refuse",
    "rendered_by_drf_view",
    "request_in",
    "retry_after_header",
    "unavailable_response",
]

PROBLEM_JSON = "application/problem+json"

# reason: (code, title, detail) of the lock, unavailable and throttle refusals.
_KINDS = {
    "busy": ("lock_busy", "Resource busy", "This resource is busy; try again shortly."),
    "unavailable": (
        "lock_unavailable",
        "Lock service unavailable",
        "The lock service is unavailable; try again shortly.",
    ),
    "throttled": (
        "throttled",
        "Too many concurrent requests",
        "Too many concurrent requests; try again shortly.",
    ),
    "caller_unknown": (
        "caller_unknown",
        "Caller unknown",
        "The server cannot tell who sent this request, so it is not served.",
    ),
}


def request_in(args: tuple[Any, ...]) -> Any:
    """The request of a view call: first argument, or second after ``self``."""
    for arg in args[:2]:
        if isinstance(arg, HttpRequest):
            return arg
        # A DRF Request wraps an HttpRequest (duck-typed: DRF stays optional).
        if isinstance(getattr(arg, "_request", None), HttpRequest):
            return arg
    return None


def client_ip(request: HttpRequest) -> str:
    """The client's address as the library sees it (``REMOTE_ADDR``)."""
    # REMOTE_ADDR only: forwarded headers are trivially forged. Behind a proxy,
    # use a 'per' callable that trusts exactly your proxy's header.
    return str(request.META.get("REMOTE_ADDR") or "unknown")


def in_drf_view(request: Any) -> bool:
    """Whether ``request`` is DRF's: the call runs inside a DRF view's dispatch,
    whose exception handling renders what it raises.

    A DRF ``Request`` exists only once DRF is imported, so DRF itself is never
    imported here (it stays optional).
    """
    module = sys.modules.get("rest_framework.request")
    return module is not None and isinstance(request, module.Request)


# Set on Django's request while a DRF view's refusals made before its
# dispatch (by a middleware, or a decorator around as_view()) are raised to
# be rendered by that view (``rendered_by_drf_view``).
_BY_DRF_VIEW = "_redislock_by_drf_view"


def is_drf_view(view: Any) -> bool:
    """Whether ``view`` is a DRF view function (``as_view()``, ``@api_view``)."""
    module = sys.modules.get("rest_framework.views")
    cls = getattr(view, "cls", None)
    return module is not None and isinstance(cls, type) and issubclass(cls, module.APIView)


def rendered_by_drf_view(
    view: Any,
    request: HttpRequest,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    call: Callable[[], Any],
) -> Any:
    """``call()``, whose refusals, if ``view`` is DRF's, its exception handling renders.

    For code that runs before the view's dispatch (the idempotency middleware,
    ``@idempotent`` around ``as_view()``): there is no DRF ``Request`` yet, so a
    refusal is raised up to here and handed to the view as DRF would
    (``contrib.drf.response_for``).
    """
    if not is_drf_view(view):
        return call()
    from .contrib.drf import Refused, response_for

    outer = getattr(request, _BY_DRF_VIEW, False)  # the middleware's, around a decorator's
    setattr(request, _BY_DRF_VIEW, True)
    try:
        return call()
    except Refused as exc:
        return response_for(view, request, exc, args, kwargs)
    finally:
        setattr(request, _BY_DRF_VIEW, outer)


# What a refusal can be sent as, best first when the client likes several equally.
_OFFERS = (PROBLEM_JSON, "application/json", "text/html", "text/plain")


def _accept_ranges(header: str) -> list[tuple[str, float]]:
    ranges = []
    for item in header.split(","):
        media, _, params = item.partition(";")
        media = media.strip().lower()
        if not media:
            continue
        quality = 1.0
        for param in params.split(";"):
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    quality = float(value.strip())
                except ValueError:
                    quality = 0.0
        ranges.append((media, quality if math.isfinite(quality) else 0.0))
    return ranges


def _quality(offer: str, ranges: list[tuple[str, float]]) -> tuple[float, int]:
    """The q of the most specific range that matches ``offer`` (RFC 9110 12.5.1),
    and how specific that range is (2 the type itself, 1 ``text/*``, 0 ``*/*``)."""
    main = offer.split("/")[0]
    found: tuple[int, float] | None = None
    for media, quality in ranges:
        if media == offer:
            specificity = 2
        elif media == f"{main}/*":
            specificity = 1
        elif media == "*/*":
            specificity = 0
        else:
            continue
        if found is None or specificity > found[0]:
            found = (specificity, quality)
    return (0.0, -1) if found is None else (found[1], found[0])


def preferred_type(request: HttpRequest) -> str:
    """The media type of a refusal for ``request``'s ``Accept`` header.

    problem+json for a client that accepts anything (no header, ``*/*``: curl,
    requests, httpx, fetch) or none of the offers; ``application/json`` for one
    that names it and not problem+json; HTML only where the client prefers it
    (a browser's ``text/html,...,*/*;q=0.8``); plain text only when asked for.
    """
    ranges = _accept_ranges(request.headers.get("Accept", ""))
    chosen, best = PROBLEM_JSON, (0.0, -1)
    for offer in _OFFERS:
        # Ties go to the range named more precisely, then to the earlier offer.
        rank = _quality(offer, ranges)
        if rank[0] > 0 and rank > best:
            chosen, best = offer, rank
    return chosen


def problem_body(refusal: Refusal) -> dict[str, Any]:
    """The RFC 9457 members of a refusal, with the library's own (``code``,
    ``retry_after``, and ``error`` as before problem+json)."""
    body: dict[str, Any] = {
        "type": refusal.type,
        "title": refusal.title,
        "status": refusal.status,
        "detail": refusal.detail,
        "code": refusal.code,
        "error": refusal.error or refusal.code,
    }
    if refusal.retry_after is not None:
        body["retry_after"] = refusal.retry_after
    return body


def _rendered(request: HttpRequest, refusal: Refusal) -> HttpResponseBase:
    media = preferred_type(request)
    if media == "text/plain":
        return HttpResponse(
            refusal.detail + "\n",
            status=refusal.status,
            content_type="text/plain; charset=utf-8",
        )
    if media == "text/html":
        page = format_html(
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{}</title>'
            "</head><body><h1>{}</h1><p>{}</p></body></html>\n",
            refusal.title,
            refusal.title,
            refusal.detail,
        )
        return HttpResponse(page, status=refusal.status, content_type="text/html; charset=utf-8")
    return JsonResponse(problem_body(refusal), status=refusal.status, content_type=media)


def _resolve(handler: str | Callable[..., Any] | None) -> Callable[..., Any] | None:
    if handler is None:
        return None
    return import_string(handler) if isinstance(handler, str) else handler


def refuse(
    request: Any,
    refusal: Refusal,
    *,
    handler: str | Callable[..., Any] | None = None,
    reason: str = "",
    name: str = "",
) -> HttpResponseBase:
    """The answer to a request the library does not serve.

    Inside a DRF view this raises the refusal as a DRF ``APIException`` (with
    ``wait``, from which DRF sets ``Retry-After``): DRF's exception handling,
    and the project's ``EXCEPTION_HANDLER``, make the response. Elsewhere it is
    ``handler``'s response, if a setting names one, else a response in the
    shape the client prefers.
    """
    if in_drf_view(request) or getattr(request, _BY_DRF_VIEW, False):
        from .contrib.drf import refused

        raise refused(refusal)
    custom = _resolve(handler)
    response: HttpResponseBase
    if custom is not None:
        response = custom(
            request,
            status=refusal.status,
            retry_after=refusal.retry_after,
            reason=reason,
            name=name,
        )
    else:
        response = _rendered(request, refusal)
    if refusal.retry_after is not None and not response.has_header("Retry-After"):
        response["Retry-After"] = str(refusal.retry_after)
    # A refusal is about this moment: never cache it.
    response["Cache-Control"] = "no-store"
    return response


def error_response(
    request: HttpRequest,
    *,
    status: int,
    retry_after: float | None,
    reason: str,
    name: str = "",
    handler: str | Callable[..., Any] | None = None,
) -> HttpResponseBase:
    """The refusal of a request that could not get its lock or permit.

    ``reason`` is ``"busy"``, ``"unavailable"``, ``"throttled"`` or ``"caller_unknown"``.
    """
    code, title, detail = _KINDS[reason]
    refusal = Refusal(
        status=status,
        code=code,
        title=title,
        detail=detail,
        retry_after=None if retry_after is None else int(retry_after_header(retry_after)),
        error=reason,
    )
    return refuse(request, refusal, handler=handler, reason=reason, name=name)


def unavailable_response(
    request: HttpRequest, name: str, *, retry_after: float = UNAVAILABLE_RETRY_AFTER
) -> HttpResponseBase:
    """The 503 for a request that Redis could not serve (``UNAVAILABLE_RESPONSE``)."""
    return error_response(
        request,
        status=503,
        retry_after=retry_after,
        reason="unavailable",
        name=name,
        handler=conf.UNAVAILABLE_RESPONSE,
    )
