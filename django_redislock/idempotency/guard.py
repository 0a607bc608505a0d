"""The one guarded path, ``serve`` (``serve_async``), which ``@idempotent`` and the middleware call.

For a request with a key (a ``Call``), in this order:

1. **Look.** The record and the lease, in one round trip: a stored response
   is replayed, a key reused for another request is refused (422), a key
   marked running that no request holds is an outcome unknown (409).
2. **Claim.** The key's lock, taken by ``run_locked`` (the run under a lock
   that ``redis_locked`` makes of every call) with the policy's ``wait``,
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

import collections
import dataclasses
import functools
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from django.db import connections
from django.http import HttpResponseBase

from ..connection import get_async_client, get_client
from ..core import IdempotencyKeys, RedisUnavailable
from ..locking.factories import keyspace
from ..locking.options import LockOptions
from ..locking.running import LockPlan, run_locked, run_locked_async
from ..locking.transactions import Transactions, in_user_transaction, opted_out
from ..signals import count_key
from ..stepping import Steps, run_steps, run_steps_async, sync_from_loop
from . import records
from .detached import to_the_end
from .fingerprint import BadKey, fingerprint, fingerprint_async, key_of
from .responses import (
    answer,
    counted,
    in_progress,
    problem,
    running,
    snapshot,
    unavailable,
)
from .scope import NotAuthenticated, ScopeUnknown, scope_of
from .settings import Policy
from .settling import settle_at_commit

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
    request: Any, policy: Policy, found: tuple[str, str], digest: str, view: Any, label: str
) -> Call:
    scope, key = found
    return Call(
        request=request,
        policy=policy,
        keys=keyspace().idempotency(scope, key),
        fingerprint=digest,
        label=label,
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
    return _call(request, policy, found, fingerprint(request), view, label)


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
    return _call(request, policy, found, await fingerprint_async(request), view, label)


# -- one attempt --------------------------------------------------------------------------
class _Record:
    """The record's calls for one request, each of no arguments: what a body yields.

    The same body runs sync (``run_steps``) and on the event loop
    (``run_steps_async``); only the client and the functions differ.
    """

    def __init__(self, keys: IdempotencyKeys, alias: str | None, asynchronous: bool) -> None:
        read: Callable[..., Any]
        self._write: Callable[..., Any]
        self._forget: Callable[..., Any]
        if asynchronous:
            client: Any = get_async_client(alias)
            read, self._write, self._forget = (
                records.read_async,
                records.write_async,
                records.forget_async,
            )
        else:
            client = get_client(alias)
            read, self._write, self._forget = records.read, records.write, records.forget
        self.read = functools.partial(read, client, keys)
        self._bound = (client, keys)

    def write(
        self, record: records.Record, ttl: float, holder: bytes | None = None
    ) -> Callable[[], Any]:
        return functools.partial(self._write, *self._bound, record, ttl, holder)

    def forget(self, attempt: bytes) -> Callable[[], Any]:
        return functools.partial(self._forget, *self._bound, attempt)


class _Attempt:
    """What one request did with the key: its marker, and its store."""

    def __init__(self, call: Call, record: _Record, run: Callable[[], Any]) -> None:
        self.call = call
        self.record = record
        self.run = run
        self.id = secrets.token_hex(8).encode()

    def marker(self) -> records.Record:
        return running(self.call.fingerprint, self.id)

    def store(self, done: records.Record) -> Callable[[], Any]:
        """The store of its response, over its own marker only: if the marker
        is another's (this one's was lost, and another attempt ran), that one
        is the record kept."""
        return self.record.write({**done, b"a": self.id}, self.call.policy.ttl, self.id)

    def forget(self) -> Callable[[], Any]:
        return self.record.forget(self.id)

    def let_go(self) -> Steps[None]:
        """The key freed: this attempt's marker removed, if still its own."""
        yield self.forget()
        count_key("idempotency", self.call.label, "released")

    def stored(self, done: records.Record) -> Steps[None]:
        try:
            ours = yield self.store(done)
        except RedisUnavailable as exc:
            logger.warning(
                "could not store the response for %s (%s): a retry with its key is answered "
                "409, outcome unknown, until its record expires",
                self.call.keys.name,
                exc,
            )
            return
        if not ours:
            logger.warning(
                "did not store the response for %s: its marker was gone, and the record "
                "now there is another attempt's",
                self.call.keys.name,
            )


def _under_lock(attempt: _Attempt) -> Steps[Any]:
    """Steps 3, 5 and the undoing: the body run under the key's lock, sync or async."""
    call, record = attempt.call, attempt.record
    try:
        stored, _ = yield record.read
        early = counted(
            call.label, call.request, answer(call.policy, call.fingerprint, stored, None)
        )
        if early is not None:
            return early
        yield record.write(attempt.marker(), call.policy.ttl)
        count_key("idempotency", call.label, "claimed")
    except RedisUnavailable as exc:
        return unavailable(call.request, call.policy, call.keys.name, exc)
    try:
        response = yield attempt.run
        # Rendered here, inside the transaction: a render that fails rolls back.
        done = snapshot(response, call.request, call.policy, call.fingerprint)
    except BaseException:
        yield from attempt.let_go()
        raise
    if done is None:
        yield from attempt.let_go()
        return response
    # Stored even if the lease ran out meanwhile: while the marker is this
    # attempt's, no other has run (a duplicate found it and did not). A
    # transaction open around the view is rolled back by run_locked, and
    # then stores nothing.
    aliases = [alias for alias in connections if in_user_transaction(alias)]
    if aliases:  # only around a sync view: no atomic block is open on an event loop
        settle_at_commit(aliases, lambda: run_steps(attempt.stored(done)), attempt.forget())
        return response
    yield from attempt.stored(done)
    return response


def _busy(attempt: _Attempt) -> Steps[HttpResponseBase]:
    """The key's lock is held: by the first request with this key (or it just finished)."""
    call = attempt.call
    try:
        stored, pttl = yield attempt.record.read
    except RedisUnavailable as exc:
        return unavailable(call.request, call.policy, call.keys.name, exc)
    early = answer(call.policy, call.fingerprint, stored, pttl)
    return counted(call.label, call.request, early or in_progress(call.policy, stored, pttl))


# What metrics have always called every key's lock (one series for all keys),
# kept so that dashboards built on it go on working.
_METRIC_NAME = "django_redislock.idempotency.guard._cached_runner.<locals>.run"


@functools.lru_cache(maxsize=256)
def _plan(
    label: str, alias: str | None, wait: float, timeout: float | None, renew: bool | None
) -> LockPlan:
    """The key's lock for one kind of call: the policy's ``wait``, ``timeout`` and
    ``renew`` (checked where given: at decoration, or as the settings are read),
    never failing open (running a retry unguarded is what this prevents)."""
    opts = LockOptions(
        timeout=timeout,
        wait=wait,
        renew=renew,
        renew_max=None,
        on_busy=None,
        fail_open=False,
        alias=alias,
        label=label,
    )
    return LockPlan.of(opts, label, _METRIC_NAME)


# The databases each kind of call connected to, for REDISLOCK['CONNECT_EARLY'].
_learned: dict[str, set[str]] = collections.defaultdict(set)


def _claim(attempt: _Attempt) -> Any:
    """Steps 2 to 6 of a sync view: its body run under the key's lock, as a locked view runs."""
    call, policy = attempt.call, attempt.call.policy
    return run_locked(
        _plan(call.label, policy.alias, policy.wait, policy.timeout, policy.renew),
        call.keys.name,
        lambda: run_steps(_under_lock(attempt)),
        # The view's own opt-outs; the other ATOMIC_REQUESTS blocks open inside the lock.
        txn=Transactions.around(call.non_atomic, True, _learned[call.label]),
        request=call.request,
        on_busy=lambda: run_steps(_busy(attempt)),
    )


async def _claim_async(attempt: _Attempt) -> Any:
    """``_claim`` for an async view."""
    call, policy = attempt.call, attempt.call.policy
    return await run_locked_async(
        _plan(call.label, policy.alias, policy.wait, policy.timeout, policy.renew),
        call.keys.name,
        lambda: run_steps_async(_under_lock(attempt)),
        request=call.request,
        on_busy=lambda: run_steps_async(_busy(attempt)),
    )


def _serve(call: Call, run: Callable[[], Any], asynchronous: bool) -> Steps[Any]:
    # On Django's request, which a DRF Request reads through.
    setattr(getattr(call.request, "_request", call.request), SERVED, True)
    record = _Record(call.keys, call.policy.alias, asynchronous)
    try:
        stored, pttl = yield record.read
    except RedisUnavailable as exc:
        return unavailable(call.request, call.policy, call.keys.name, exc)
    early = counted(call.label, call.request, answer(call.policy, call.fingerprint, stored, pttl))
    if early is not None:
        return early
    attempt = _Attempt(call, record, run)
    if asynchronous:
        # Claim, view, store and release: to their end, whatever happens to
        # the request (detached.py).
        return (yield functools.partial(to_the_end, call.keys.name, _claim_async, attempt))
    return (yield functools.partial(_claim, attempt))


def serve(call: Call, run: Callable[[], Any]) -> Any:
    """Serve ``call``, running ``run()`` (the view) at most once per key and scope."""
    return run_steps(_serve(call, run, asynchronous=False))


async def serve_async(call: Call, run: Callable[[], Awaitable[Any]]) -> Any:
    """``serve`` for an async view."""
    return await run_steps_async(_serve(call, run, asynchronous=True))
