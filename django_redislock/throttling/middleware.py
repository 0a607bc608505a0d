"""Concurrency limits for requests: ``ConcurrencyLimitMiddleware`` and ``concurrency_limited``.

A request matched by a rule runs only while it holds a permit of that rule's
semaphore (one per rule, or one per user, IP or custom key). The permit is
taken before the rest of the middleware stack and the view run, and given back
when the response is finished: at once for an ordinary response, when the
server closes the response for a streaming or file response, and also when
the view raises. A request that gets no permit within the rule's ``wait`` is
answered 503 (global rule) or 429 (per-client rule) with ``Retry-After``.

URL names are resolved by the middleware itself (``request.urlconf`` is
honoured), because the permit must be held before any later middleware runs.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase
from redis.exceptions import RedisError

from ..caller import CallerUnknown, NotAuthenticated
from ..conf import conf
from ..core import RedisUnavailable
from ..http import error_response, is_drf_view, rendered_by_drf_view, request_in
from ..signals import declare
from ..stepping import Steps, run_steps, run_steps_async
from .keys import ANONYMOUS, Asker, Target, key_of, key_of_async, semaphore_name
from .permits import (
    announce_throttled,
    fields,
    label_of,
    release_on_close,
    releasing,
    retry_after_of,
    rule_permit,
    unavailable,
)
from .rules import Rule, current_rules, make_rule, matching_rules

__all__ = ["ConcurrencyLimitMiddleware", "concurrency_limited", "semaphore_name"]

logger = logging.getLogger("django_redislock.throttle")

# Rules of concurrency_limited views, by name (the metrics read their semaphores).
decorated_rules: dict[str, Rule] = {}


# -- outcomes ---------------------------------------------------------------------------
def _throttled(request: HttpRequest, rule: Rule) -> HttpResponseBase:
    status = 429 if rule.per_client else 503
    retry_after = retry_after_of(rule)
    announce_throttled(ConcurrencyLimitMiddleware, request, rule, status)
    return error_response(
        request,
        status=status,
        retry_after=retry_after,
        reason="throttled",
        name=rule.name,
        handler=conf.THROTTLE_RESPONSE,
    )


def _caller_unknown(request: HttpRequest, rule: Rule, exc: CallerUnknown) -> HttpResponseBase:
    """A request the rule cannot count per client: refused, never counted per address."""
    logger.error(
        "refused %s: rule %r counts per %s. %s",
        label_of(request),
        rule.name,
        rule.per,
        exc,
        extra=fields(rule, status=500),
    )
    # No Retry-After: not a matter of time.
    return error_response(
        request, status=500, retry_after=None, reason="caller_unknown", name=rule.name
    )


# -- the request path -----------------------------------------------------------------------
def _limited(
    request: HttpRequest,
    rules: list[Rule],
    call: Callable[[HttpRequest], Any],
    asynchronous: bool,
    target: Target | None = None,
) -> Steps[HttpResponseBase]:
    """A permit of each rule, then the response: one body for both kinds of request.

    ``target``: the view the request goes to, as a decorator knows it; None
    for the middleware, which resolves the URL when a rule asks who the caller is.
    """
    keying = key_of_async if asynchronous else key_of
    permits: list[Any] = []
    asker = Asker(request, target)
    for rule in rules:
        try:
            try:
                key = yield functools.partial(keying, rule, request, asker)
            except NotAuthenticated:
                continue  # the view's own authentication answers (401, 403), running nothing
            except CallerUnknown as exc:
                yield from releasing(permits)
                return _caller_unknown(request, rule, exc)
            if key is ANONYMOUS:
                continue  # the key callable exempted this request
            sem = rule_permit(rule, key, request, asynchronous=asynchronous)
            acquired = yield sem.acquire
        except (RedisUnavailable, RedisError) as exc:
            try:
                refusal = unavailable(ConcurrencyLimitMiddleware, request, rule, exc)
            except BaseException:
                # Raised for DRF's exception handler: the permits taken go back first.
                yield from releasing(permits)
                raise
            if refusal is not None:
                yield from releasing(permits)
                return refusal
            continue
        except BaseException:
            yield from releasing(permits)
            raise
        if not acquired:
            yield from releasing(permits)
            return _throttled(request, rule)
        permits.append(sem)
    if not permits:
        return (yield functools.partial(call, request))
    try:
        response = yield functools.partial(call, request)
    except BaseException:
        yield from releasing(permits)
        raise
    if response.streaming:
        release_on_close(response, permits)
    else:
        yield from releasing(permits)
    return response


class ConcurrencyLimitMiddleware:
    """Apply ``REDISLOCK["THROTTLE"]`` rules to every request (sync or async).

    Place it last in ``MIDDLEWARE``: a 503 or 429 it makes passes back only
    through the middleware above it, so there it gets their headers
    (``X-Frame-Options`` and the like). ``per: "user"`` rules count the caller
    the view will see (``django_redislock.caller``): a session's user (it
    must come after ``AuthenticationMiddleware``), or the user a DRF view's
    own authentication classes accept, run here before the permit is taken.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        rules = self._rules(request)
        if not rules:
            return self.get_response(request)
        return run_steps(_limited(request, rules, self.get_response, False))

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        rules = self._rules(request)
        if not rules:
            return await self.get_response(request)
        return await run_steps_async(_limited(request, rules, self.get_response, True))

    @staticmethod
    def _rules(request: HttpRequest) -> list[Rule]:
        if not conf.ENABLED:
            return []
        rules = current_rules()
        return matching_rules(request, rules) if rules else []


def _after(request: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The URL's positional arguments: what follows the request (and ``self``)."""
    for index, arg in enumerate(args[:2]):
        if arg is request:
            return args[index + 1 :]
    return args


def concurrency_limited(
    name: str,
    limit: int,
    *,
    per: str | Callable[[HttpRequest], Any] = "global",
    wait: float = 0,
    timeout: float | None = None,
    retry_after: float | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Let at most ``limit`` requests run the decorated view at once.

    The same semantics as a ``THROTTLE`` rule named ``name`` (and sharing its
    semaphore if a rule has that name). Bad arguments raise ``ValueError`` here,
    at decoration time. Works on sync and async function views, on a whole
    view (``concurrency_limited(...)(MyView.as_view())``), and on the handler
    methods of class-based views: Django's ``View``, DRF's ``APIView`` and
    viewset actions (DRF has authenticated the caller by then).
    """
    spec: dict[str, Any] = {"name": name, "limit": limit, "per": per, "wait": wait}
    if timeout is not None:
        spec["timeout"] = timeout
    if retry_after is not None:
        spec["retry_after"] = retry_after
    rule = make_rule(spec, where=f"concurrency_limited({name!r})")
    assert rule is not None
    # Known to every process that imported the view, for the metrics' gauges.
    decorated_rules.setdefault(rule.name, rule)
    declare(rule.name, "semaphore")

    def decorate(view: Callable[..., Any]) -> Callable[..., Any]:
        # A view whose request comes first (a function view, a whole view
        # class's as_view()), or a handler method whose request comes after
        # self (Django's View, DRF's APIView, a viewset action).
        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                request = request_in(args)
                if not conf.ENABLED or request is None:
                    return await view(*args, **kwargs)
                target = (view, _after(request, args), kwargs)
                served = _limited(request, [rule], lambda r: view(*args, **kwargs), True, target)
                return await run_steps_async(served)

            return async_wrapper

        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            request = request_in(args)
            if not conf.ENABLED or request is None:
                return view(*args, **kwargs)
            after = _after(request, args)
            served = _limited(
                request, [rule], lambda r: view(*args, **kwargs), False, (view, after, kwargs)
            )
            if by_drf:  # around a DRF view's as_view(): refused through its handling
                return rendered_by_drf_view(view, request, after, kwargs, lambda: run_steps(served))
            return run_steps(served)

        by_drf = is_drf_view(view)

        return wrapper

    return decorate
