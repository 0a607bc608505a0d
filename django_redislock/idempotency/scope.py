"""Whose keys are whose: the scope a key is looked up in.

Two users who send the same key (and body) must never meet: one would get the
other's stored response and his own request would never run. So the scope is
the caller *as the view will see it*, as the library's one resolver of the
caller answers (``django_redislock/caller.py``): the user Django or the DRF
view authenticates, or the address of a request without credentials. A
request that carries credentials no authentication accepts is refused
(``ScopeUnknown``), never scoped by its address; ``SCOPE`` set to a callable
names the client instead (``c:<name>``), as does ``REDISLOCK["CALLER"]``.
"""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string

from ..caller import CallerUnknown, NotAuthenticated, ask_as_view, caller_of
from ..http import client_ip
from .settings import Policy

__all__ = ["NotAuthenticated", "ScopeUnknown", "scope_of"]


class ScopeUnknown(CallerUnknown):
    """The request carries credentials the library cannot read: no scope is safe."""


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
    scope = policy.scope
    if scope == "ip":
        return f"ip:{client_ip(request)}"
    if scope == "user":
        try:
            return caller_of(
                request, view, args, kwargs, credential_headers=policy.credential_headers
            )
        except CallerUnknown as exc:
            raise ScopeUnknown(
                f"{exc} Or set REDISLOCK['IDEMPOTENCY']['SCOPE'] to a callable naming the client."
            ) from exc
    func = import_string(scope) if isinstance(scope, str) else scope
    value = ask_as_view(func, request, view, args, kwargs)
    if not isinstance(value, str) or not value:
        raise TypeError(
            f"the idempotency scope callable {scope!r} returned {value!r}: it must return a "
            "non-empty str naming whose keys these are (a user id, an account, a client)"
        )
    return f"c:{value}"
