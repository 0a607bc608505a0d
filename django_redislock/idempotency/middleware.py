"""``IdempotencyMiddleware``: ``@idempotent`` for every view under ``IDEMPOTENCY["PATHS"]``.

It serves a request from ``process_view``, by running the resolved view
itself through the same guarded path as the decorator (``guard.serve``), and
returning its response. That is the one place a middleware can open the view's
``ATOMIC_REQUESTS`` transaction inside the key's lock, and so check the lease
before the commit and store the response only after it, as the decorator
does. Django then runs no ``process_view`` of a middleware after this one for
that request, so it must come after every middleware that has one
(``django_redislock.E068``; here it refuses to start otherwise).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync, iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.http import HttpRequest

from ..checks import middleware_entries, middleware_index
from ..conf import conf
from ..http import rendered_by_drf_view
from ..stepping import Steps, run_steps, run_steps_async
from .guard import SERVED, Call, prepare, prepare_async, serve, serve_async
from .settings import MIDDLEWARE_PATH, Policy, middleware_hooks_after, policy

__all__ = ["IdempotencyMiddleware"]

LABEL = "IdempotencyMiddleware"

View = Callable[..., Any]


def _refuse_hooks_after() -> None:
    entries = middleware_entries()
    ours = middleware_index(entries, MIDDLEWARE_PATH)
    skipped = [] if ours is None else middleware_hooks_after(entries, ours)
    if skipped:
        raise ImproperlyConfigured(
            f"IdempotencyMiddleware must come after {', '.join(skipped)} in MIDDLEWARE: it runs "
            "the views it serves itself, so their process_view() would be skipped "
            "(django_redislock.E068). Put IdempotencyMiddleware last."
        )


class IdempotencyMiddleware:
    """``@idempotent`` for every request whose path matches ``IDEMPOTENCY["PATHS"]``.

    For views you cannot decorate (another app's, a whole API). The same
    answers, options (``WAIT``, ``TIMEOUT``, ``RENEW`` among the settings)
    and guarantees as the decorator, through the same code. Place it last in
    ``MIDDLEWARE``, after ``AuthenticationMiddleware``.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        _refuse_hooks_after()
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        # Django adapts process_view to the chain's mode; one of each, so
        # that neither mode pays a thread hop it does not need.
        self.process_view: Callable[..., Any]
        if self.is_async:
            markcoroutinefunction(self)
            self.process_view = self._process_view_async
        else:
            self.process_view = self._process_view

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        return self.get_response(request)

    async def __acall__(self, request: HttpRequest) -> Any:
        return await self.get_response(request)

    @staticmethod
    def _served(
        request: HttpRequest, view: View, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Steps[Any] | None:
        """The guarded path for this request, as steps; None: not ours to serve."""
        if not conf.ENABLED:
            return None
        found = policy({})
        if (request.method or "").upper() not in found.methods:
            return None
        if not any(pattern.search(request.path_info) for pattern in found.paths):
            return None
        asynchronous = iscoroutinefunction(view)
        if asynchronous:
            _refuse_atomic_requests(view)
        return _serving(request, found, view, args, kwargs, asynchronous)

    def _process_view(
        self, request: HttpRequest, view: View, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        served = self._served(request, view, args, kwargs)
        if served is None:
            return None
        run = async_to_sync(run_steps_async) if iscoroutinefunction(view) else run_steps
        # A DRF view's refusals go through its exception handling.
        return rendered_by_drf_view(view, request, args, kwargs, lambda: run(served))

    async def _process_view_async(
        self, request: HttpRequest, view: View, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        served = self._served(request, view, args, kwargs)
        if served is None:
            return None
        if iscoroutinefunction(view):
            return await run_steps_async(served)
        # A sync view, its transaction and its lock, in the thread Django
        # would have run it in; a DRF view's refusals through its exception handling.
        return await sync_to_async(rendered_by_drf_view, thread_sensitive=True)(
            view, request, args, kwargs, lambda: run_steps(served)
        )


def _refuse_atomic_requests(view: View) -> None:
    """As Django refuses it before it runs the view (``make_view_atomic``), which
    a view served here never reaches: an async view cannot run in a transaction."""
    opted_out: set[str] = getattr(view, "_non_atomic_requests", set())
    for alias, settings_dict in connections.settings.items():
        if settings_dict["ATOMIC_REQUESTS"] and alias not in opted_out:
            raise RuntimeError("You cannot use ATOMIC_REQUESTS with async views.")


def _serving(
    request: HttpRequest,
    found: Policy,
    view: View,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    asynchronous: bool,
) -> Steps[Any]:
    """The view through the guarded path, for either kind of view."""
    prepare_call, serve_call = (prepare_async, serve_async) if asynchronous else (prepare, serve)
    prepared = yield functools.partial(
        prepare_call, request, found, view=view, args=args, kwargs=kwargs, label=LABEL
    )
    if not isinstance(prepared, Call):
        return prepared  # None: Django runs the view, as without this middleware
    setattr(request, SERVED, True)
    return (yield functools.partial(serve_call, prepared, lambda: view(request, *args, **kwargs)))
