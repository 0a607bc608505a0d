"""Who the caller is, as the view will see it: one answer for every feature.

Throttling rules (``"per": "user"``), ``concurrency_limited``, the DRF
throttle class and the idempotency scope all ask ``caller_of``, so that a
request is counted and scoped as the same caller everywhere:

* ``REDISLOCK["CALLER"]``, when set: a function of the request (as the view
  will see it) returning a non-empty str that names the caller (``c:<str>``),
  or None to leave the answer to the rules below;
* a user Django's ``AuthenticationMiddleware`` authenticated (a session,
  ``RemoteUserMiddleware``): ``u:<pk>``;
* a Django REST framework view: the user DRF authenticates with the view's
  own ``authentication_classes`` (token, session, a custom class reading a
  bearer header), whether the question is asked inside the view (DRF has
  authenticated by then) or in front of it (a middleware, a decorator on the
  whole view): the view's authenticators are run here, as ``APIView`` runs
  them, and again by the view: ``u:<pk>``;
* a request that carries no credentials: the client's address, ``ip:<addr>``;
* a request that looks anonymous yet carries credentials (a header of
  ``REDISLOCK["CREDENTIAL_HEADERS"]``: ``Authorization``, ``X-Api-Key``), to a
  plain view, or to a DRF view none of whose authentication classes accepts
  them and whose permissions let an anonymous request in: the view may read
  the header by itself, and the address would put every client behind one
  NAT or proxy together. ``CallerUnknown`` is raised: the request is refused,
  never counted per address. ``REDISLOCK["CALLER"]`` names such callers.

A DRF view whose authentication refuses the request (a bad token, a session
without its CSRF token) answers it by itself (401, 403) before running any
work: ``NotAuthenticated`` says so, and the caller runs the view unguarded.

Metrics never carry the caller: a label per user would grow without bound.
A per-caller semaphore is named by the caller (``throttle:<rule>:user:u:42``)
and shown so by ``manage.py redislocks list``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.urls import Resolver404, resolve
from django.utils.module_loading import import_string

from .conf import conf
from .http import client_ip

__all__ = [
    "CallerUnknown",
    "NotAuthenticated",
    "ask_as_view",
    "caller_of",
    "subject_of",
    "view_of",
]


class CallerUnknown(Exception):
    """The request carries credentials nothing the library can see accepts."""


class NotAuthenticated(Exception):
    """The view's own authentication refuses the request: it will answer, doing nothing."""


def _is_drf_request(request: Any) -> bool:
    try:
        from rest_framework.request import Request
    except ImportError:  # DRF is optional
        return False
    return isinstance(request, Request)


def _drf_view_class(view: Any) -> type | None:
    """The APIView class behind a view callable (``as_view()``, ``@api_view``), or None."""
    cls = getattr(view, "cls", None)
    if not isinstance(cls, type):
        return None
    try:
        from rest_framework.views import APIView
    except ImportError:  # DRF is optional
        return None
    return cls if issubclass(cls, APIView) else None


def _drf_request(request: Any, view: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The request as DRF will see it in ``view``: its authenticators, lazily run.

    Built as ``APIView.dispatch`` builds it, on a view instance of our own, so
    that ``request.user`` runs the same authentication classes in the same order.
    """
    cls = _drf_view_class(view)
    if cls is None:
        return None
    instance = cls(**getattr(view, "initkwargs", None) or {})
    actions = getattr(view, "actions", None)
    if actions is not None:  # a ViewSet: which action a method maps to
        instance.action_map = actions
    instance.args, instance.kwargs, instance.request = args, kwargs, request
    return instance.initialize_request(request, *args, **kwargs)


def _refused_by_drf(exc: Exception) -> bool:
    try:
        from rest_framework.exceptions import APIException
    except ImportError:  # DRF is optional
        return False
    return isinstance(exc, APIException)


def view_of(request: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """``(view, args, kwargs)`` the request's URL resolves to; ``(None, (), {})`` if none.

    For a middleware, which runs before Django resolves the URL (honours
    ``request.urlconf``).
    """
    match = getattr(request, "resolver_match", None)
    if match is None:
        try:
            match = resolve(request.path_info, getattr(request, "urlconf", None))
        except Resolver404:
            return None, (), {}
    return match.func, tuple(match.args), dict(match.kwargs)


def subject_of(
    request: Any,
    view: Any = None,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
) -> Any:
    """The request as ``view`` will see it: a DRF ``Request`` for a DRF view, else itself."""
    if view is None or _is_drf_request(request):
        return request
    return _drf_request(request, view, args, kwargs or {}) or request


def ask_as_view(
    func: Any,
    request: Any,
    view: Any = None,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
) -> Any:
    """``func(request as the view will see it)``: a project's own key or scope callable.

    Raises ``NotAuthenticated`` where the view's authentication refuses the request.
    """
    try:
        return func(subject_of(request, view, args, kwargs))
    except Exception as exc:
        if _refused_by_drf(exc):
            raise NotAuthenticated(str(exc)) from exc
        raise


def caller_of(
    request: Any,
    view: Any = None,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    credential_headers: Iterable[str] | None = None,
) -> str:
    """Who sent ``request`` to ``view`` (the callable its URL resolved to, if known).

    ``u:<pk>``, ``c:<name>`` (``REDISLOCK["CALLER"]``) or ``ip:<address>``.
    Raises ``CallerUnknown`` (refuse the request) or ``NotAuthenticated`` (the
    view will refuse it by itself). ``credential_headers``: the headers that
    carry credentials, ``REDISLOCK["CREDENTIAL_HEADERS"]`` by default.
    """
    try:
        return _caller(request, subject_of(request, view, args, kwargs), credential_headers)
    except Exception as exc:
        if _refused_by_drf(exc):
            # The view runs the same authentication and answers (401, 403)
            # before any work.
            raise NotAuthenticated(str(exc)) from exc
        raise


def _caller(request: Any, subject: Any, credential_headers: Iterable[str] | None) -> str:
    named = _named(subject)
    if named is not None:
        return named
    user = getattr(subject, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return f"u:{user.pk}"
    headers = conf.CREDENTIAL_HEADERS if credential_headers is None else credential_headers
    sent = [name for name in headers if name in request.headers]
    if sent:
        if _is_drf_request(subject):
            # A DRF view none of whose authentication classes took the
            # credentials: if its permissions refuse an anonymous request,
            # it answers (401, 403) and runs nothing; if they let it in,
            # the view may read the credentials by itself.
            drf_view = (subject.parser_context or {}).get("view")
            if drf_view is not None:
                drf_view.check_permissions(subject)
        raise CallerUnknown(
            f"This request sends credentials ({sent[0]} header), but no user is "
            "authenticated where the library asks who the caller is (the view reads "
            "them by itself, or none of its authentication classes accepts them): it "
            "cannot be counted per user, and its address may be shared by many "
            "clients. Set REDISLOCK['CALLER'] to a function naming the client."
        )
    return f"ip:{client_ip(request)}"


def _named(subject: Any) -> str | None:
    """What ``REDISLOCK["CALLER"]`` says, if it is set and has an answer."""
    setting = conf.CALLER
    if setting is None:
        return None
    func = import_string(setting) if isinstance(setting, str) else setting
    value = func(subject)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise TypeError(
            f"REDISLOCK['CALLER'] {setting!r} returned {value!r}: it must return a "
            "non-empty str naming the caller (a user id, an account, a client), or None"
        )
    return f"c:{value}"
