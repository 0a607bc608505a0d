"""Requests and responses as every feature sees them.

Which request a call serves (``request_in``) and who sent it (``client_ip``);
the busy, throttled and unavailable responses, each with ``Retry-After``.

A response is JSON when the client asks for JSON (``Accept: application/json`` or an
``application/json`` request body), plain text otherwise. Each can be replaced
through a setting holding a callable or dotted path; the replacement receives
``(request, *, status, retry_after, reason, name)`` and returns a response.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.module_loading import import_string

from .conf import conf

__all__ = [
    "UNAVAILABLE_RETRY_AFTER",
    "client_ip",
    "error_response",
    "request_in",
    "retry_after_header",
    "unavailable_response",
    "wants_json",
]

# Redis down says nothing about when it will be back: ask clients to pause a
# little rather than retry at once and pile onto a recovering server.
UNAVAILABLE_RETRY_AFTER = 5.0

_MESSAGES = {
    "busy": "This resource is busy; try again shortly.",
    "unavailable": "The lock service is unavailable; try again shortly.",
    "throttled": "Too many concurrent requests; try again shortly.",
    "caller_unknown": "The server cannot tell who sent this request, so it is not served.",
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


def retry_after_header(seconds: float | None) -> str:
    """Whole seconds, at least 1 (RFC 9110 allows no fractions)."""
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        return "1"
    return str(max(1, math.ceil(seconds)))


def wants_json(request: HttpRequest) -> bool:
    accept = request.headers.get("Accept", "")
    if "application/json" in accept:
        return True
    return request.content_type == "application/json" and "text/html" not in accept


def _resolve(handler: str | Callable[..., Any] | None) -> Callable[..., Any] | None:
    if handler is None:
        return None
    return import_string(handler) if isinstance(handler, str) else handler


def error_response(
    request: HttpRequest,
    *,
    status: int,
    retry_after: float | None,
    reason: str,
    name: str = "",
    handler: str | Callable[..., Any] | None = None,
) -> HttpResponse:
    """The response for a request that could not get its lock or permit.

    ``reason`` is ``"busy"``, ``"unavailable"`` or ``"throttled"``.
    """
    custom = _resolve(handler)
    if custom is not None:
        response: HttpResponse = custom(
            request, status=status, retry_after=retry_after, reason=reason, name=name
        )
    elif wants_json(request):
        response = JsonResponse(
            {
                "error": reason,
                "detail": _MESSAGES[reason],
                "retry_after": int(retry_after_header(retry_after)),
            },
            status=status,
        )
    else:
        response = HttpResponse(
            _MESSAGES[reason] + "\n", status=status, content_type="text/plain; charset=utf-8"
        )
    if not response.has_header("Retry-After"):
        response["Retry-After"] = retry_after_header(retry_after)
    # A busy or throttled answer is about this moment: never cache it.
    response["Cache-Control"] = "no-store"
    return response


def unavailable_response(
    request: HttpRequest, name: str, *, retry_after: float = UNAVAILABLE_RETRY_AFTER
) -> HttpResponse:
    """The 503 for a request that Redis could not serve (``UNAVAILABLE_RESPONSE``)."""
    return error_response(
        request,
        status=503,
        retry_after=retry_after,
        reason="unavailable",
        name=name,
        handler=conf.UNAVAILABLE_RESPONSE,
    )
