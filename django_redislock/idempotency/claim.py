"""The claim of a key (steps 2 to 6 of ``guard.py``): its body run under the key's lock.

``claim`` (``claim_async``) hands ``run_locked`` (``locking/running.py``), the
run under a lock that ``redis_locked`` makes of every call, the key's lock
plan, a body and a busy answer: so the lease, its renewal, fencing, signals,
metrics and the transaction handling are those of every locked view.

The body and the busy answer are each one generator of record calls
(``stepping.py``), stepped in a thread for a sync view and on the event loop
for an async one: the decisions between the calls are written once.
"""

from __future__ import annotations

import collections
import functools
import logging
import secrets
from collections.abc import Callable
from typing import Any

from django.db import connections
from django.http import HttpResponseBase

from ..core import (
    IdempotencyKeys,
    Record,
    RedisUnavailable,
    forget_record,
    forget_record_async,
    read_record,
    read_record_async,
    write_record,
    write_record_async,
)
from ..locking.options import LockOptions
from ..locking.running import LockPlan, run_locked, run_locked_async
from ..locking.transactions import Transactions, in_user_transaction
from ..signals import count_key
from ..stepping import Steps, run_steps, run_steps_async
from .responses import answer, given, in_progress, running, snapshot
from .settling import settle_at_commit

__all__ = ["Attempt", "KeyRecord", "claim", "claim_async"]

logger = logging.getLogger("django_redislock.idempotency")


class KeyRecord:
    """The record's calls for one key, each of no arguments: what a body yields.

    The same body runs sync (``run_steps``) and on the event loop
    (``run_steps_async``); only the client and the functions differ.
    """

    def __init__(self, client: Any, keys: IdempotencyKeys, asynchronous: bool) -> None:
        read: Callable[..., Any]
        self._write: Callable[..., Any]
        self._forget: Callable[..., Any]
        if asynchronous:
            read, self._write, self._forget = (
                read_record_async,
                write_record_async,
                forget_record_async,
            )
        else:
            read, self._write, self._forget = read_record, write_record, forget_record
        self.read: Callable[[], Any] = functools.partial(read, client, keys)
        self._bound = (client, keys)

    def write(self, record: Record, ttl: float, holder: bytes | None = None) -> Callable[[], Any]:
        return functools.partial(self._write, *self._bound, record, ttl, holder)

    def forget(self, attempt: bytes) -> Callable[[], Any]:
        return functools.partial(self._forget, *self._bound, attempt)


class Attempt:
    """What one request did with the key: its marker, and its store.

    ``call`` is the guard's ``Call``: its request, policy, keys, fingerprint,
    label, the view's ``non_atomic`` opt-outs and its ``record`` (a ``KeyRecord``).
    """

    def __init__(self, call: Any, run: Callable[[], Any]) -> None:
        self.call = call
        self.record: KeyRecord = call.record
        self.run = run
        self.id = secrets.token_hex(8).encode()

    def marker(self) -> Record:
        return running(self.call.fingerprint, self.id)

    def store(self, done: Record) -> Callable[[], Any]:
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

    def stored(self, done: Record) -> Steps[None]:
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


def _under_lock(attempt: Attempt) -> Steps[Any]:
    """Steps 3, 5 and the undoing: the body run under the key's lock, sync or async."""
    call, record = attempt.call, attempt.record
    early: Any
    try:
        stored, _ = yield record.read
        early = answer(call.policy, call.fingerprint, stored, None)
        if early is None:
            yield record.write(attempt.marker(), call.policy.ttl)
    except RedisUnavailable as exc:
        early = exc
    if early is not None:
        return given(call.label, call.request, call.policy, call.keys.name, early)
    count_key("idempotency", call.label, "claimed")
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


def _busy(attempt: Attempt) -> Steps[HttpResponseBase]:
    """The key's lock is held: by the first request with this key (or it just finished)."""
    call = attempt.call
    early: Any
    try:
        stored, pttl = yield attempt.record.read
        early = answer(call.policy, call.fingerprint, stored, pttl)
        early = early or in_progress(call.policy, stored, pttl)
    except RedisUnavailable as exc:
        early = exc
    return given(call.label, call.request, call.policy, call.keys.name, early)


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


def claim(attempt: Attempt) -> Any:
    """Steps 2 to 6 of a sync view: its body run under the key's lock, as a locked view runs."""
    call, policy = attempt.call, attempt.call.policy
    plan = _plan(call.label, policy.alias, policy.wait, policy.timeout, policy.renew)
    # The view's own opt-outs; the other ATOMIC_REQUESTS blocks open inside the lock.
    txn = Transactions.around(call.non_atomic, True, _learned[call.label])
    return run_locked(
        plan,
        call.keys.name,
        lambda: run_steps(_under_lock(attempt)),
        txn=txn,
        request=call.request,
        on_busy=lambda: run_steps(_busy(attempt)),
    )


async def claim_async(attempt: Attempt) -> Any:
    """``claim`` for an async view."""
    call, policy = attempt.call, attempt.call.policy
    plan = _plan(call.label, policy.alias, policy.wait, policy.timeout, policy.renew)
    return await run_locked_async(
        plan,
        call.keys.name,
        lambda: run_steps_async(_under_lock(attempt)),
        request=call.request,
        on_busy=lambda: run_steps_async(_busy(attempt)),
    )
