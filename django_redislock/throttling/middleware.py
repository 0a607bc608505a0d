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

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpRequest, HttpResponseBase
from redis.exceptions import RedisError

from ..caller import CallerUnknown, NotAuthenticated, ask_as_view, caller_of, view_of
from ..conf import conf
from ..connection import get_client
from ..core.drivers.base import fields_of
from ..core.drivers.semaphore import SemaphoreBase, release_permit
from ..core.exceptions import LockError, RedisUnavailable
from ..http import client_ip, error_response, request_in, unavailable_response
from ..locking.factories import get_async_semaphore, get_semaphore
from ..signals import declare, request_throttled, send_unavailable
from ..stepping import Steps, run_steps, run_steps_async, sync_from_loop
from .rules import Rule, current_rules, make_rule, matching_rules

__all__ = ["ConcurrencyLimitMiddleware", "concurrency_limited"]

logger = logging.getLogger("django_redislock.throttle")

_ANONYMOUS = object()
DEFAULT_RETRY_AFTER = 1.0

# Rules of concurrency_limited views, by name (the metrics read their semaphores).
decorated_rules: dict[str, Rule] = {}


# -- keys ----------------------------------------------------------------------------
# Where a request goes: the view, its args and kwargs (a decorator knows them;
# the middleware resolves the URL, only for a rule that asks who the caller is).
Target = tuple[Any, tuple[Any, ...], dict[str, Any]]


def semaphore_name(rule: Rule, key: str | None) -> str:
    if key is None:
        return f"throttle:{rule.name}"
    return f"throttle:{rule.name}:{rule.per}:{key}"


class _Asker:
    """Who sent one request: the view resolved and the caller asked at most
    once, however many of the request's rules count per user (the view's
    authentication may query the database)."""

    def __init__(self, request: HttpRequest, target: Target | None) -> None:
        self.request = request
        self._target = target
        self._caller: str | Exception | None = None

    @property
    def target(self) -> Target:
        if self._target is None:
            self._target = view_of(self.request)
        return self._target

    def caller(self) -> str:
        if self._caller is None:
            try:
                self._caller = caller_of(self.request, *self.target)
            except (CallerUnknown, NotAuthenticated) as exc:
                self._caller = exc
        if isinstance(self._caller, Exception):
            raise self._caller
        return self._caller


def _key(rule: Rule, request: HttpRequest, asker: _Asker) -> str | None | object:
    if rule.per == "global":
        return None
    if rule.per == "ip":
        return client_ip(request)
    if rule.per == "user":
        return asker.caller()
    assert rule.key_func is not None
    func = rule.key_func
    if iscoroutinefunction(func):
        from asgiref.sync import async_to_sync

        func = async_to_sync(func)
    key = ask_as_view(func, request, *asker.target)
    return _ANONYMOUS if key is None else str(key)


async def _key_async(rule: Rule, request: HttpRequest, asker: _Asker) -> str | None | object:
    if rule.per == "global":
        return None
    if rule.per == "ip":
        return client_ip(request)
    if rule.per == "user":
        # Authentication may need the database: on the loop until it does.
        return await sync_from_loop(_key)(rule, request, asker)
    if not iscoroutinefunction(rule.key_func):
        return await sync_to_async(_key)(rule, request, asker)
    # A coroutine of the project's own: it is given the request as it is.
    assert rule.key_func is not None
    key = await rule.key_func(request)
    return _ANONYMOUS if key is None else str(key)


# -- outcomes ---------------------------------------------------------------------------
def _label(request: HttpRequest) -> str:
    return f"{request.method} {request.path}"[:200]


def _timeout(rule: Rule) -> float:
    return rule.timeout if rule.timeout is not None else conf.PERMIT_TIMEOUT


def _fields(rule: Rule, **more: Any) -> dict[str, Any]:
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
        _label(request),
        rule.name,
        status,
        extra=_fields(rule, status=status),
    )


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
        "refused %s: rule %r counts per %s, but %s",
        _label(request),
        rule.name,
        rule.per,
        exc,
        extra=_fields(rule, status=500),
    )
    response = error_response(
        request, status=500, retry_after=None, reason="caller_unknown", name=rule.name
    )
    del response["Retry-After"]  # not a matter of time
    return response


def _unavailable(request: HttpRequest, rule: Rule, exc: BaseException) -> HttpResponseBase | None:
    """None to run the request anyway (fail open), else the 503 to send."""
    fail_open = conf.THROTTLE_FAIL_OPEN
    send_unavailable(ConcurrencyLimitMiddleware, rule.name, exc, fail_open)
    if fail_open:
        logger.warning(
            "Redis unavailable, running %s without its %r permit: %s",
            _label(request),
            rule.name,
            exc,
            extra=_fields(rule, reason=getattr(exc, "reason", None), fail_open=True),
        )
        return None
    logger.error(
        "Redis unavailable, refusing %s (rule %r): %s",
        _label(request),
        rule.name,
        exc,
        extra=_fields(rule, reason=getattr(exc, "reason", None), fail_open=False),
    )
    return unavailable_response(request, rule.name, retry_after=1)


def _closer(permits: list[SemaphoreBase]) -> Callable[[], None]:
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


def _on_close(response: HttpResponseBase, permits: list[Any]) -> None:
    # HttpResponseBase.close() runs these when the server has sent the body
    # (or the client went away), whichever thread or loop that happens in.
    closers: list[Callable[[], None]] = response._resource_closers  # type: ignore[attr-defined]
    closers.append(_closer(list(permits)))


def _releasing(permits: list[Any]) -> Steps[None]:
    for sem in reversed(permits):
        try:
            yield sem.release
        except LockError as exc:  # lost (expired, cleared) or Redis down
            logger.warning("releasing permit of %r: %s", sem.name, exc, extra=fields_of(sem))


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
    key_of = _key_async if asynchronous else _key
    semaphore = get_async_semaphore if asynchronous else get_semaphore
    permits: list[Any] = []
    asker = _Asker(request, target)
    for rule in rules:
        try:
            try:
                key = yield functools.partial(key_of, rule, request, asker)
            except NotAuthenticated:
                continue  # the view's own authentication answers (401, 403), running nothing
            except CallerUnknown as exc:
                yield from _releasing(permits)
                return _caller_unknown(request, rule, exc)
            if key is _ANONYMOUS:
                continue  # the key callable exempted this request
            sem = semaphore(
                semaphore_name(rule, key),
                rule.limit,
                timeout=_timeout(rule),
                wait=rule.wait,
                label=_label(request),
                metric_name=rule.name,
            )
            acquired = yield sem.acquire
        except (RedisUnavailable, RedisError) as exc:
            refusal = _unavailable(request, rule, exc)
            if refusal is not None:
                yield from _releasing(permits)
                return refusal
            continue
        except BaseException:
            yield from _releasing(permits)
            raise
        if not acquired:
            yield from _releasing(permits)
            return _throttled(request, rule)
        permits.append(sem)
    if not permits:
        return (yield functools.partial(call, request))
    try:
        response = yield functools.partial(call, request)
    except BaseException:
        yield from _releasing(permits)
        raise
    if response.streaming:
        _on_close(response, permits)
    else:
        yield from _releasing(permits)
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
            target = (view, _after(request, args), kwargs)
            served = _limited(request, [rule], lambda r: view(*args, **kwargs), False, target)
            return run_steps(served)

        return wrapper

    return decorate
