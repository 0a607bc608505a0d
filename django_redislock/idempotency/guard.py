"""The one guarded path, ``serve`` (``serve_async``), which ``@idempotent`` and the middleware call.

For a request with a key (a ``Call``), in this order:

1. **Look.** The record and the lease, in one round trip: a stored response
   is replayed, a key reused for another request is refused (422), a key
   marked running that no request holds is an outcome unknown (409).
2. **Claim** (``claim.py``). The key's lock, taken by ``run_locked`` (the run
   under a lock that ``redis_locked`` makes of every call) with the policy's ``wait``,
   ``timeout`` and ``renew``: so the lease, its renewal, fencing, signals and
   metrics are those of every locked view, and so is the transaction
   handling. A busy key is a duplicate: it is answered from the record (409
   with a ``Retry-After`` hint, or the replay if the first has just finished).
3. **Run**, under the lock, inside the view's ``ATOMIC_REQUESTS`` blocks,
   which ``run_locked`` opens inside the lock: the record is read again
   (the first may have finished between look and claim), marked running,
   and the view runs.
4. **Check the lease before the commit** (``run_locked``): a lease lost
   while the view ran rolls its transaction back (503).
5. **Store after the commit**: the commit hook of every transaction open
   around the view (``settling.py``). A rollback drops the hook, so a
   response whose writes were undone is never stored, and the key is freed
   for the retry. The store replaces only the attempt's own marker.
6. **Release**, after the store (``run_locked`` releases after the
   transaction has ended; for a transaction someone else opened, when it does).

What step 1 or a duplicate is answered is decided first and given once
(``responses.given``: counted for the metrics, then rendered).

An async view's steps 2 to 6 run in a task that the request's cancellation
does not reach (``detached.py``): a client that leaves never leaves a key
marked running with nobody to finish it.

A view that fails frees the key: its marker is removed, if it is still that
attempt's (a request whose lease ran out must not free the key of another).
A marker left behind (its process died, or Redis failed before the store)
keeps the key as an outcome unknown until it expires: the view may have done
its work, and is never run again for that key.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from django.http import HttpResponseBase

from ..connection import get_async_client, get_client
from ..core import IdempotencyKeys, Record, RedisUnavailable
from ..http import Refusal
from ..locking.factories import keyspace
from ..locking.transactions import opted_out
from ..stepping import sync_from_loop
from .claim import Attempt, KeyRecord, claim, claim_async
from .detached import to_the_end
from .fingerprint import BadKey, fingerprint, fingerprint_async, key_of
from .responses import answer, given, problem
from .scope import NotAuthenticated, ScopeUnknown, scope_of
from .settings import Policy

__all__ = ["SERVED", "Call", "prepare", "prepare_async", "serve", "serve_async"]

logger = logging.getLogger("django_redislock.idempotency")

# Set on a request the guarded path serves: an ``@idempotent`` under it (a
# decorated view under the middleware, or a handler method under a decorated
# view) runs its view as it is. Its own look would find the key marked running
# by this very request, with the lease held by this thread: an outcome unknown.
SERVED = "_redislock_idempotency"


@dataclasses.dataclass(frozen=True)
class Call:
    """One request with a key, ready to be served."""

    request: Any  # as the view receives it (Django's, or DRF's)
    policy: Policy
    keys: IdempotencyKeys
    fingerprint: str
    label: str  # who holds the lock, for operators: the view, or the middleware
    # The record's calls, on the client of the view's kind (sync, or asyncio).
    record: KeyRecord
    # Databases whose ATOMIC_REQUESTS the view opted out of (non_atomic_requests).
    non_atomic: frozenset[str] = frozenset()


# -- preparing a call -------------------------------------------------------------------
def _key_or_answer(request: Any, policy: Policy) -> str | HttpResponseBase | None:
    if (request.method or "").upper() not in policy.methods:
        return None
    try:
        key = key_of(request, policy)
    except BadKey as exc:
        logger.info("bad %s: 400", policy.header)
        return problem(request, 400, "idempotency_key_invalid", str(exc))
    if key is None and policy.required:
        return problem(
            request,
            400,
            "idempotency_key_missing",
            f"This endpoint needs an {policy.header} header: send a new unique key (a UUID) "
            "with each new request, and the same key when you retry it.",
        )
    return key


def _scope_refused(request: Any, exc: ScopeUnknown) -> HttpResponseBase:
    logger.error("refused a request with an idempotency key: %s", exc)
    return problem(request, 500, "idempotency_scope_unknown", str(exc))


def _call(
    request: Any,
    policy: Policy,
    found: tuple[str, str],
    digest: str,
    view: Any,
    label: str,
    asynchronous: bool,
) -> Call:
    scope, key = found
    keys = keyspace().idempotency(scope, key)
    client = get_async_client(policy.alias) if asynchronous else get_client(policy.alias)
    return Call(
        request=request,
        policy=policy,
        keys=keys,
        fingerprint=digest,
        label=label,
        record=KeyRecord(client, keys, asynchronous),
        non_atomic=opted_out(view),
    )


def _scoped(
    request: Any,
    policy: Policy,
    view: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
) -> tuple[str, str] | HttpResponseBase | None:
    """(scope, key), or what ``prepare`` answers without them."""
    key = _key_or_answer(request, policy)
    if not isinstance(key, str):
        return key
    try:
        scope = scope_of(request, policy, view, args, kwargs)
    except ScopeUnknown as exc:
        return _scope_refused(request, exc)
    except NotAuthenticated:
        return None  # the view's own authentication answers, and runs nothing
    return scope, key


def prepare(
    request: Any,
    policy: Policy,
    *,
    view: Any,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    label: str,
) -> Call | HttpResponseBase | None:
    """The call to serve, an answer (400, or a refusal), or None: run the view as it is."""
    found = _scoped(request, policy, view, args, kwargs)
    if not isinstance(found, tuple):
        return found
    return _call(request, policy, found, fingerprint(request), view, label, False)


async def prepare_async(
    request: Any,
    policy: Policy,
    *,
    view: Any,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    label: str,
) -> Call | HttpResponseBase | None:
    """``prepare`` in an event loop: a scope that needs the database is computed
    in a thread, and so is the fingerprint of a large body."""
    found = await sync_from_loop(_scoped)(request, policy, view, args, kwargs)
    if not isinstance(found, tuple):
        return found
    digest = await fingerprint_async(request)
    return _call(request, policy, found, digest, view, label, True)


# -- serving it ---------------------------------------------------------------------------
def _looked(call: Call) -> tuple[Record, int] | RedisUnavailable:
    """Step 1's round trip: the record and the lease, or why Redis did not answer."""
    try:
        return call.record.read()
    except RedisUnavailable as exc:
        return exc


async def _looked_async(call: Call) -> tuple[Record, int] | RedisUnavailable:
    try:
        return await call.record.read()
    except RedisUnavailable as exc:
        return exc


def _early(
    call: Call, looked: tuple[Record, int] | RedisUnavailable
) -> HttpResponseBase | Refusal | RedisUnavailable | None:
    """What step 1 decides alone (a replay, a refusal, Redis's failure), or None: claim the key."""
    # On Django's request, which a DRF Request reads through.
    setattr(getattr(call.request, "_request", call.request), SERVED, True)
    if isinstance(looked, RedisUnavailable):
        return looked
    return answer(call.policy, call.fingerprint, *looked)


def serve(call: Call, run: Callable[[], Any]) -> Any:
    """Serve ``call``, running ``run()`` (the view) at most once per key and scope."""
    looked = _looked(call)
    early = _early(call, looked)
    if early is None:
        attempt = Attempt(call, run)
        return claim(attempt)
    return given(call.label, call.request, call.policy, call.keys.name, early)


async def serve_async(call: Call, run: Callable[[], Awaitable[Any]]) -> Any:
    """``serve`` for an async view: claim, view, store and release run to their
    end, whatever happens to the request (``detached.py``)."""
    looked = await _looked_async(call)
    early = _early(call, looked)
    if early is None:
        attempt = Attempt(call, run)
        return await to_the_end(call.keys.name, claim_async, attempt)
    return given(call.label, call.request, call.policy, call.keys.name, early)
