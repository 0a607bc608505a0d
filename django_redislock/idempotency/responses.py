"""What a request with a key is answered, and what of a response is stored.

A refusal is a ``Refusal`` until it is given (``given``): in the library's
one shape (``http.refuse``), or raised inside a DRF view. The guard decides
first and gives once: what is counted and rendered is never interleaved with
the decision.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any

from django.http import HttpResponse, HttpResponseBase

from ..core import Record, RedisUnavailable
from ..http import Refusal, refuse, retry_after_header, unavailable_response
from ..signals import count_key
from .settings import Policy

__all__ = [
    "OMITTED_HEADER",
    "REPLAYED_HEADER",
    "answer",
    "given",
    "in_progress",
    "outcome_unknown",
    "problem",
    "refusal",
    "snapshot",
]

logger = logging.getLogger("django_redislock.idempotency")

REPLAYED_HEADER = "Idempotent-Replayed"
OMITTED_HEADER = "Idempotent-Body-Omitted"


def given(
    label: str,
    request: Any,
    policy: Policy,
    name: str,
    early: HttpResponseBase | Refusal | RedisUnavailable | None,
) -> Any:
    """What a request is given when its view does not run: ``early`` (a
    duplicate's answer from ``answer`` or ``in_progress``, or the failure of
    the record's read), counted for the metrics, then given. None as it is.

    A replay is given as it is; a refusal in the library's shape (raised inside
    a DRF view, so it is counted first); Redis unavailable is the 503 of
    ``UNAVAILABLE_RESPONSE``, and no key event.
    """
    if early is None:
        return None
    if isinstance(early, RedisUnavailable):
        logger.warning("Redis unavailable for %s, not running the view: %s", policy.header, early)
        return unavailable_response(request, name)
    replayed = isinstance(early, HttpResponseBase) and early.has_header(REPLAYED_HEADER)
    count_key("idempotency", label, "replayed" if replayed else "refused")
    return refuse(request, early) if isinstance(early, Refusal) else early


_TITLES = {
    "idempotency_key_missing": "Idempotency key missing",
    "idempotency_key_invalid": "Idempotency key invalid",
    "idempotency_key_reused": "Idempotency key reused",
    "idempotency_key_in_use": "Request with this key in progress",
    "idempotency_outcome_unknown": "Outcome of this key unknown",
    "idempotency_scope_unknown": "Idempotency scope unknown",
}


def refusal(status: int, code: str, detail: str, retry_after: float | None = None) -> Refusal:
    return Refusal(
        status=status,
        code=code,
        title=_TITLES[code],
        detail=detail,
        retry_after=None if retry_after is None else int(retry_after_header(retry_after)),
    )


def problem(request: Any, status: int, code: str, detail: str) -> HttpResponseBase:
    return refuse(request, refusal(status, code, detail))


def _mismatch(policy: Policy) -> Refusal:
    logger.info("%s reused for another request: 422", policy.header)
    return refusal(
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


def in_progress(policy: Policy, record: Record, pttl: int) -> Refusal:
    logger.info("%s duplicate while the first request runs: 409", policy.header)
    return refusal(
        409,
        "idempotency_key_in_use",
        f"A request with this {policy.header} is still being processed; retry after "
        "Retry-After seconds to get its response.",
        retry_hint(record, pttl),
    )


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


def outcome_unknown(policy: Policy) -> Refusal:
    logger.warning(
        "%s of a request whose outcome is unknown (its holder is gone, nothing stored): 409",
        policy.header,
    )
    return refusal(
        409,
        "idempotency_outcome_unknown",
        f"A request with this {policy.header} started earlier, and its outcome was not "
        "recorded: it may have done its work, so it is not run again with this key. Check "
        "whether the work was done; to do it again, send a new key.",
    )


def answer(
    policy: Policy, fingerprint: str, record: Record, pttl: int | None
) -> HttpResponse | Refusal | None:
    """What a request gets from the record and the lease alone (None: it may run,
    or the request that holds the key answers it).

    ``pttl`` None: the caller holds the lease (so whoever wrote a marker there
    is gone); negative: no request holds the key.
    """
    if not record:
        return None  # never used, or freed by a failed attempt
    if record.get(b"fp", b"").decode() != fingerprint:
        return _mismatch(policy)
    if record.get(b"state") == b"done":
        return _replay(policy, record)
    if pttl is None or pttl < 0:
        # Marked running, and its request no longer holds the key: it died, or
        # outlived its lease, or could not record how it ended. Its view may
        # have done its work: running it again is what the key is for preventing.
        return outcome_unknown(policy)
    return None


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
