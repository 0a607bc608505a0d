"""Whose keys are whose: the scope a key is looked up in.

Two users who send the same key (and body) must never meet: one would get the
other's stored response and his own request would never run. So the scope is
the user *as the view will see it*:

* a request Django's ``AuthenticationMiddleware`` authenticated (a session,
  ``RemoteUserMiddleware``): that user;
* a Django REST framework view: the user DRF authenticates with the view's
  own ``authentication_classes`` (token, JWT, a header, a session), whether
  ``@idempotent`` sits on its handler (DRF has authenticated by then) or the
  middleware or decorator sits in front of the whole view (the view's
  authenticators are run here, and again by the view);
* a request that carries no credentials: the client's address;
* a request that looks anonymous yet carries credentials (a header of
  ``CREDENTIAL_HEADERS``: ``Authorization``, ``X-Api-Key``): to a plain view,
  or to a DRF view none of whose authentication classes accepts them and
  whose permissions let an anonymous request in, the user cannot be known
  here (the view may read the header by itself), and falling back to the
  address would put every API client behind one NAT or proxy in one scope.
  The request is refused (``ScopeUnknown``); set ``SCOPE`` to a callable
  that names the client. A DRF view whose permissions refuse the anonymous
  request answers it by itself (401, 403), as for a bad token.
"""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string

from ..http import client_ip
from .settings import Policy

__all__ = ["NotAuthenticated", "ScopeUnknown", "scope_of"]


class ScopeUnknown(Exception):
    """The request carries credentials the library cannot read: no scope is safe."""


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


def scope_of(
    request: Any,
    policy: Policy,
    view: Any = None,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
) -> str:
    """The scope of ``request``, sent to ``view`` (the callable the URL resolved to).

    Raises ``ScopeUnknown`` (refuse the request) or ``NotAuthenticated`` (the
    view will refuse it by itself).
    """
    try:
        return _scope(request, policy, view, args, kwargs or {})
    except Exception as exc:
        if _refused_by_drf(exc):
            # The view runs the same authentication and answers (401, 403)
            # before any work: serving it unguarded runs nothing.
            raise NotAuthenticated(str(exc)) from exc
        raise


def _scope(
    request: Any, policy: Policy, view: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> str:
    scope = policy.scope
    if scope == "ip":
        return f"ip:{client_ip(request)}"
    subject = request
    if not _is_drf_request(request) and view is not None:
        subject = _drf_request(request, view, args, kwargs) or request
    if scope == "user":
        user = getattr(subject, "user", None)
        if user is not None and getattr(user, "is_authenticated", False):
            return f"u:{user.pk}"
        sent = [name for name in policy.credential_headers if name in request.headers]
        if sent:
            if _is_drf_request(subject):
                # A DRF view none of whose authentication classes took the
                # credentials: if its permissions refuse an anonymous request,
                # it answers (401, 403) and runs nothing; if they let it in,
                # the view may read the credentials by itself.
                drf_view = (subject.parser_context or {}).get("view")
                if drf_view is not None:
                    drf_view.check_permissions(subject)
            raise ScopeUnknown(
                f"This request sends credentials ({sent[0]} header), but no user is "
                "authenticated when the idempotency key is looked up (the view reads "
                "them by itself, or none of its authentication classes accepts "
                "them): keys cannot be scoped per user. Set "
                "REDISLOCK['IDEMPOTENCY']['SCOPE'] to a callable naming the client."
            )
        return f"ip:{client_ip(request)}"
    func = import_string(scope) if isinstance(scope, str) else scope
    value = func(subject)
    if not isinstance(value, str) or not value:
        raise TypeError(
            f"the idempotency scope callable {scope!r} returned {value!r}: it must return a "
            "non-empty str naming whose keys these are (a user id, an account, a client)"
        )
    return f"c:{value}"
