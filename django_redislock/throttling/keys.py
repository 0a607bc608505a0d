"""Who a throttled request counts as: the key of its rule's semaphore.

A global rule has one semaphore, ``throttle:<name>``; a per-client rule one
per client, ``throttle:<name>:<per>:<key>``, the key being the caller as the
view will see it (``django_redislock.caller``: ``u:<pk>``, ``ip:<address>``,
``c:<name>``), the address, or what the rule's own callable returns.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.http import HttpRequest

from ..caller import CallerUnknown, NotAuthenticated, ask_as_view, caller_of, view_of
from ..http import client_ip
from ..stepping import sync_from_loop
from .rules import Rule

__all__ = ["ANONYMOUS", "Asker", "Target", "key_of", "key_of_async", "semaphore_name"]

# What a rule's key callable answers to exempt a request (it returned None).
ANONYMOUS = object()

# Where a request goes: the view, its args and kwargs (a decorator knows them;
# the middleware resolves the URL, only for a rule that asks who the caller is).
Target = tuple[Any, tuple[Any, ...], dict[str, Any]]


def semaphore_name(rule: Rule, key: str | None) -> str:
    if key is None:
        return f"throttle:{rule.name}"
    return f"throttle:{rule.name}:{rule.per}:{key}"


class Asker:
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


def key_of(rule: Rule, request: HttpRequest, asker: Asker) -> str | None | object:
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
    return ANONYMOUS if key is None else str(key)


async def key_of_async(rule: Rule, request: HttpRequest, asker: Asker) -> str | None | object:
    if rule.per == "global":
        return None
    if rule.per == "ip":
        return client_ip(request)
    if rule.per == "user":
        # Authentication may need the database: on the loop until it does.
        return await sync_from_loop(key_of)(rule, request, asker)
    if not iscoroutinefunction(rule.key_func):
        return await sync_to_async(key_of)(rule, request, asker)
    # A coroutine of the project's own: it is given the request as it is.
    assert rule.key_func is not None
    key = await rule.key_func(request)
    return ANONYMOUS if key is None else str(key)
