"""What a request with a key is answered, and what of a response is stored.

Errors are ``{"error": ..., "detail": ...}`` JSON when the client asks for
JSON, plain text otherwise, always with ``Cache-Control: no-store``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any, TypeVar

from django.http import HttpResponse, HttpResponseBase, JsonResponse

from ..http import retry_after_header, unavailable_response, wants_json
from ..signals import count_key
from .records import Record
from .settings import Policy

__all__ = [
    "OMITTED_HEADER",
    "REPLAYED_HEADER",
    "answer",
    "counted",
    "in_progress",
    "outcome_unknown",
    "problem",
    "snapshot",
    "unavailable",
]

logger = logging.getLogger("django_redislock.idempotency")

REPLAYED_HEADER = "Idempotent-Replayed"
OMITTED_HEADER = "Idempotent-Body-Omitted"


_Answer = TypeVar("_Answer", HttpResponseBase, "HttpResponseBase | None")


def counted(label: str, answered: _Answer) -> _Answer:
    """``answered`` (a duplicate's answer, or None), counted for the metrics."""
    if answered is not None:
        replayed = answered.has_header(REPLAYED_HEADER)
        count_key("idempotency", label, "replayed" if replayed else "refused")
    return answered


def problem(request: Any, status: int, code: str, detail: str) -> HttpResponse:
    response: HttpResponse
    if wants_json(request):
        response = JsonResponse({"error": code, "detail": detail}, status=status)
    else:
        response = HttpResponse(
            detail + "\n", status=status, content_type="text/plain; charset=utf-8"
        )
    response["Cache-Control"] = "no-store"
    return response


def _mismatch(request: Any, policy: Policy) -> HttpResponse:
    logger.info("%s reused for another request: 422", policy.header)
    return problem(
        request,
        422,
        "idempotency_key_reused",
        f"This {policy.header} was already used for a different request (another method, "
        "path or body); use a new key for a new request.",
    )


# The hint when the first request has not recorded its start yet: it has only
# just claimed the key (or has just let it go), so its answer, or a free key,
# is a moment away. Never the lease, which may be many times the request.
SOON = 1.0


def retry_hint(record: Record, pttl: int, now_ms: float | None = None) -> float:
    """Seconds until the first request's answer is likely there.

    As long as it has run so far (a request that has run for ``x`` seconds is,
    by the usual rule of thumb, about half done), at least 1 second, and never
    more than its lease has left: by then the answer is stored or the key is free.
    """
    try:
        started = int(record[b"t"])
    except (KeyError, ValueError):
        return SOON
    now = time.time() * 1000 if now_ms is None else now_ms
    hint = max(SOON, (now - started) / 1000)
    return hint if pttl <= 0 else min(hint, max(SOON, pttl / 1000))


def in_progress(request: Any, policy: Policy, record: Record, pttl: int) -> HttpResponse:
    logger.info("%s duplicate while the first request runs: 409", policy.header)
    response = problem(
        request,
        409,
        "idempotency_key_in_use",
        f"A request with this {policy.header} is still being processed; retry after "
        "Retry-After seconds to get its response.",
    )
    response["Retry-After"] = retry_after_header(retry_hint(record, pttl))
    return response


def _replay(policy: Policy, record: Record) -> HttpResponse:
    status = int(record[b"status"])
    response = HttpResponse(record.get(b"body", b""), status=status)
    for name, value in json.loads(record.get(b"headers", b"[]")):
        response[name] = value
    response[REPLAYED_HEADER] = "true"
    if record.get(b"omitted") == b"1":
        response[OMITTED_HEADER] = "true"
    logger.info("%s duplicate after completion: replayed %s", policy.header, status)
    return response


def outcome_unknown(request: Any, policy: Policy) -> HttpResponse:
    logger.warning(
        "%s of a request whose outcome is unknown (its holder is gone, nothing stored): 409",
        policy.header,
    )
    return problem(
        request,
        409,
        "idempotency_outcome_unknown",
        f"A request with this {policy.header} started earlier, and its outcome was not "
        "recorded: it may have done its work, so it is not run again with this key. Check "
        "whether the work was done; to do it again, send a new key.",
    )


def answer(
    request: Any, policy: Policy, fingerprint: str, record: Record, pttl: int | None
) -> HttpResponse | None:
    """What a request gets from the record and the lease alone (None: it may run,
    or the request that holds the key answers it).

    ``pttl`` None: the caller holds the lease (so whoever wrote a marker there
    is gone); negative: no request holds the key.
    """
    if not record:
        return None  # never used, or freed by a failed attempt
    if record.get(b"fp", b"").decode() != fingerprint:
        return _mismatch(request, policy)
    if record.get(b"state") == b"done":
        return _replay(policy, record)
    if pttl is None or pttl < 0:
        # Marked running, and its request no longer holds the key: it died, or
        # outlived its lease, or could not record how it ended. Its view may
        # have done its work: running it again is what the key is for preventing.
        return outcome_unknown(request, policy)
    return None


def unavailable(request: Any, policy: Policy, name: str, exc: Exception) -> HttpResponseBase:
    logger.warning("Redis unavailable for %s, not running the view: %s", policy.header, exc)
    return unavailable_response(request, name)


def _rendered(response: HttpResponseBase, request: Any) -> HttpResponseBase:
    """``response`` with its content, for a response that renders later.

    A ``TemplateResponse`` renders now. A DRF ``Response`` returned by a
    handler method has no renderer yet (``APIView.finalize_response`` sets it
    after the handler): it is finalized by its own view, as DRF would, then
    rendered. Rendering now, inside the transaction, means a failing render
    rolls the work back instead of leaving it done with nothing stored.
    Django and DRF do not render a response twice.
    """
    render = getattr(response, "render", None)
    if not callable(render) or getattr(response, "is_rendered", True):
        return response
    if hasattr(response, "data") and getattr(response, "accepted_renderer", None) is None:
        context = getattr(request, "parser_context", None) or {}
        view = context.get("view")
        if view is None or not hasattr(view, "finalize_response"):
            raise TypeError(
                "@idempotent got a DRF Response it cannot render: decorate the APIView's "
                "handler method (post) or the view itself, or use IdempotencyMiddleware"
            )
        view.finalize_response(
            request, response, *context.get("args", ()), **context.get("kwargs", {})
        )
    render()
    return response


def snapshot(response: Any, request: Any, policy: Policy, fingerprint: str) -> Record | None:
    """The record of a completed response, or None if it must not be stored."""
    if not isinstance(response, HttpResponseBase) or not policy.storable(response.status_code):
        return None
    response = _rendered(response, request)
    names = ("Content-Type", *policy.replay_headers)
    headers = [[name, response[name]] for name in dict.fromkeys(names) if response.has_header(name)]
    record = {
        b"fp": fingerprint.encode(),
        b"state": b"done",
        b"status": str(response.status_code).encode(),
        b"headers": json.dumps(headers).encode(),
    }
    content = None if response.streaming else response.content
    if content is None or len(content) > policy.max_body:
        # The view ran: a duplicate must not run it again, even though its
        # body cannot be given back. It gets the status and headers.
        record[b"omitted"] = b"1"
        record[b"body"] = b""
    else:
        record[b"body"] = content
    return record


def running(fingerprint: str, attempt: bytes) -> Record:
    """The marker of an attempt under way."""
    return {
        b"fp": fingerprint.encode(),
        b"state": b"running",
        b"a": attempt,
        b"t": str(math.floor(time.time() * 1000)).encode(),
    }
