"""What happens to a throttled request's permits, and to a refused request.

Shared by the middleware, ``concurrency_limited`` and DRF's
``ConcurrencyThrottle``: the log records and signals of a refusal or of Redis
unreachable, and giving permits back, at once or when a streaming response
is closed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponseBase
from redis.exceptions import RedisError

from ..conf import conf
from ..connection import get_client
from ..core import LockError, RedisUnavailable, SemaphoreBase, fields_of, release_permit
from ..http import unavailable_response
from ..locking.factories import semaphore_for
from ..signals import request_throttled, send_unavailable
from ..stepping import Steps
from .keys import semaphore_name
from .rules import Rule

__all__ = [
    "DEFAULT_RETRY_AFTER",
    "announce_throttled",
    "closer",
    "fields",
    "label_of",
    "permit_timeout",
    "release_on_close",
    "releasing",
    "retry_after_of",
    "rule_permit",
    "unavailable",
]

logger = logging.getLogger("django_redislock.throttle")

DEFAULT_RETRY_AFTER = 1.0


def label_of(request: HttpRequest) -> str:
    return f"{request.method} {request.path}"[:200]


def permit_timeout(rule: Rule) -> float:
    return rule.timeout if rule.timeout is not None else conf.PERMIT_TIMEOUT


def fields(rule: Rule, **more: Any) -> dict[str, Any]:
    """The structured fields of a record about ``rule``'s semaphore."""
    name = semaphore_name(rule, None) if not rule.per_client else None
    return {"lock_name": name, "template": rule.name, "kind": "semaphore", **more}


def retry_after_of(rule: Rule) -> float:
    """The Retry-After a request refused by ``rule`` gets (seconds)."""
    # Permits usually come back long before they expire, so the earliest
    # expiry (often the whole permit TTL) would tell clients to stay away far
    # too long: one second unless the rule says otherwise.
    return rule.retry_after if rule.retry_after is not None else DEFAULT_RETRY_AFTER


def announce_throttled(sender: Any, request: Any, rule: Rule, status: int) -> None:
    """``request_throttled`` and the log record of a refused request."""
    # send_robust: a failing receiver must not turn a 503 into a 500.
    for receiver, result in request_throttled.send_robust(
        sender,
        rule=rule.name,
        request=request,
        status=status,
        retry_after=retry_after_of(rule),
    ):
        if isinstance(result, Exception):
            logger.error("request_throttled receiver %r failed: %r", receiver, result)
    logger.info(
        "throttled %s by rule %r (%d)",
        label_of(request),
        rule.name,
        status,
        extra=fields(rule, status=status),
    )


def unavailable(
    sender: Any, request: HttpRequest, rule: Rule, exc: BaseException
) -> HttpResponseBase | None:
    """None to run the request anyway (fail open), else the 503 to send."""
    fail_open = conf.THROTTLE_FAIL_OPEN
    send_unavailable(sender, rule.name, exc, fail_open)
    if fail_open:
        logger.warning(
            "Redis unavailable, running %s without its %r permit: %s",
            label_of(request),
            rule.name,
            exc,
            extra=fields(rule, reason=getattr(exc, "reason", None), fail_open=True),
        )
        return None
    logger.error(
        "Redis unavailable, refusing %s (rule %r): %s",
        label_of(request),
        rule.name,
        exc,
        extra=fields(rule, reason=getattr(exc, "reason", None), fail_open=False),
    )
    return unavailable_response(request, rule.name, retry_after=1)


def closer(permits: list[SemaphoreBase]) -> Callable[[], None]:
    """Release by token from whatever thread closes the response.

    ``close()`` is synchronous and may run in a server thread or (Django's
    test client) in the event loop itself, so this uses the sync client: one
    short, bounded call per permit.
    """
    held = [(sem.keyspace, sem.name, sem.token, sem.serial) for sem in permits if sem.token]

    def close() -> None:
        for ks, name, token, serial in held:
            try:
                if not release_permit(get_client(), ks, name, token, serial):
                    logger.warning(
                        "permit of %r had expired before the response was closed",
                        name,
                        extra={"lock_name": name, "kind": "semaphore", "cause": "expired"},
                    )
            except (RedisUnavailable, RedisError) as exc:
                logger.warning(
                    "could not release permit of %r (it expires by itself): %s",
                    name,
                    exc,
                    extra={"lock_name": name, "kind": "semaphore"},
                )

    return close


def release_on_close(response: HttpResponseBase, permits: list[Any]) -> None:
    # HttpResponseBase.close() runs these when the server has sent the body
    # (or the client went away), whichever thread or loop that happens in.
    closers: list[Callable[[], None]] = response._resource_closers  # type: ignore[attr-defined]
    closers.append(closer(list(permits)))


def releasing(permits: list[Any]) -> Steps[None]:
    for sem in reversed(permits):
        try:
            yield sem.release
        except LockError as exc:  # lost (expired, cleared) or Redis down
            logger.warning("releasing permit of %r: %s", sem.name, exc, extra=fields_of(sem))


def rule_permit(rule: Rule, key: str | None, request: HttpRequest, *, asynchronous: bool) -> Any:
    """The semaphore of ``rule`` for the caller ``key``, whose permit ``request`` takes."""
    return semaphore_for(
        semaphore_name(rule, key),
        rule.limit,
        asynchronous=asynchronous,
        timeout=permit_timeout(rule),
        wait=rule.wait,
        label=label_of(request),
        metric_name=rule.name,
    )
