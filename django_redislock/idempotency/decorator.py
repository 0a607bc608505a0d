"""``@idempotent``: the guarded path around one view."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction
from django.db import connections, transaction
from django.http import HttpRequest

from ..conf import conf
from ..http import rendered_by_drf_view, request_in
from ..locking.transactions import EVERY_ALIAS, opted_out
from .guard import SERVED, Call, prepare, prepare_async, serve, serve_async
from .settings import check_arguments, policy

__all__ = ["SERVED", "idempotent"]

F = TypeVar("F", bound=Callable[..., Any])


def _served_already(request: Any) -> bool:
    """Served already: by the middleware, or by an ``@idempotent`` around this one."""
    return getattr(request, SERVED, False) is True


@contextlib.contextmanager
def _atomic_requests(view: Callable[..., Any], served: bool) -> Iterator[None]:
    """``ATOMIC_REQUESTS`` for a view run as if undecorated.

    The wrapper tells Django it opens those blocks itself (inside the lock),
    so where it does not lock it opens them here, as Django would have. Not
    when the middleware serves the request (it opened them), nor inside a
    transaction already open (a handler method under the view's own block).
    """
    with contextlib.ExitStack() as blocks:
        skip = opted_out(view)
        for alias in connections:
            if (
                not served
                and connections.settings[alias].get("ATOMIC_REQUESTS")
                and alias not in skip
                and not connections[alias].in_atomic_block
            ):
                blocks.enter_context(transaction.atomic(using=alias))
        yield


def _need_request(view: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    request = request_in(args)
    if request is None:
        raise TypeError(
            f"idempotent() decorates views: {getattr(view, '__qualname__', view)!r} was called "
            "without a request as its first argument (or second, after self). Use redis_locked "
            "for functions and tasks."
        )
    return request


def _wrap(view: Callable[..., Any], overrides: dict[str, Any]) -> Any:
    label = f"idempotent:{getattr(view, '__module__', '')}.{getattr(view, '__qualname__', view)}"

    if iscoroutinefunction(view):

        @functools.wraps(view)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            request = _need_request(view, args)
            if not conf.ENABLED or _served_already(request):
                return await view(*args, **kwargs)
            prepared = await prepare_async(
                request, policy(overrides), view=view, args=args[1:], kwargs=kwargs, label=label
            )
            if not isinstance(prepared, Call):
                return await view(*args, **kwargs) if prepared is None else prepared
            return await serve_async(prepared, lambda: view(*args, **kwargs))

        # Django refuses ATOMIC_REQUESTS for async views: nothing to open.
        return async_wrapper

    @functools.wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        request = _need_request(view, args)
        # Around a DRF view's as_view(): its refusals through its exception handling.
        return rendered_by_drf_view(view, request, args[1:], kwargs, lambda: run(*args, **kwargs))

    def run(*args: Any, **kwargs: Any) -> Any:
        request = _need_request(view, args)
        served = _served_already(request)
        prepared = None
        if conf.ENABLED and not served:
            prepared = prepare(
                request, policy(overrides), view=view, args=args[1:], kwargs=kwargs, label=label
            )
        if isinstance(prepared, Call):
            return serve(prepared, lambda: view(*args, **kwargs))
        if prepared is not None:
            return prepared
        with _atomic_requests(view, served):
            return view(*args, **kwargs)

    # As redis_locked does: ATOMIC_REQUESTS is opened inside the lock (by the
    # guarded path), so the lease is checked before the commit and the
    # response stored after it.
    wrapper._non_atomic_requests = EVERY_ALIAS  # type: ignore[attr-defined]
    return wrapper


def idempotent(
    view: F | None = None,
    *,
    methods: list[str] | tuple[str, ...] | None = None,
    scope: str | Callable[[HttpRequest], str] | None = None,
    ttl: float | None = None,
    required: bool | None = None,
    max_body: int | None = None,
    replay_headers: list[str] | tuple[str, ...] | None = None,
    store_client_errors: bool | None = None,
    header: str | None = None,
    wait: float | None = None,
    timeout: float | None = None,
    renew: bool | None = None,
    alias: str | None = None,
) -> Any:
    """Honour the ``Idempotency-Key`` header on the decorated view.

    Every argument defaults to ``REDISLOCK["IDEMPOTENCY"]`` (``docs/idempotency.rst``):
    ``methods``, ``scope`` (``"user"``, ``"ip"`` or a callable of the request
    returning a str), ``ttl`` (seconds a completed response is replayed),
    ``required`` (400 without the header), ``max_body`` (bytes of body kept),
    ``replay_headers``, ``store_client_errors``, ``header``, and the key's
    lock: ``wait`` (default 0: a duplicate gets 409 at once), ``timeout`` and
    ``renew``, as for ``redis_locked``. ``alias`` names the ``CACHES`` entry.
    Works on sync and async function views, on view methods (``dispatch``,
    ``post``, a DRF ``APIView`` handler), as ``@idempotent`` or ``@idempotent(...)``.
    """
    given = {
        "METHODS": methods,
        "SCOPE": scope,
        "TTL": ttl,
        "REQUIRED": required,
        "MAX_BODY": max_body,
        "REPLAY_HEADERS": replay_headers,
        "STORE_CLIENT_ERRORS": store_client_errors,
        "HEADER": header,
        "WAIT": wait,
        "TIMEOUT": timeout,
        "RENEW": renew,
        "alias": alias,
    }
    overrides = {key: value for key, value in given.items() if value is not None}
    check_arguments(overrides)

    def decorate(func: F) -> F:
        if isinstance(func, type):
            raise TypeError(
                f"idempotent() cannot decorate the class {func.__qualname__}: decorate its "
                "dispatch() (or a handler such as post()) instead"
            )
        if not callable(func):
            raise TypeError(f"idempotent() can only decorate a view, not {func!r}")
        return _wrap(func, overrides)

    if view is not None:
        return decorate(view)
    return decorate
