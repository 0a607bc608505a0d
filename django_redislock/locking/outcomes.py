"""How a call ends when it does not simply run: busy, Redis unavailable, lost, released."""

from __future__ import annotations

import logging
from typing import Any

from ..conf import conf
from ..core import AsyncLock, Lock, LockBase, LockLost, LockNotAcquired, RedisUnavailable, fields_of
from ..http import error_response, unavailable_response
from ..signals import send_unavailable

log_unavailable = logging.getLogger("django_redislock.unavailable")
log_release = logging.getLogger("django_redislock.release")
log_busy = logging.getLogger("django_redislock.busy")


def busy(
    on_busy: Any,
    request: Any,
    name: str,
    retry_after: float | None,
) -> Any:
    """What a call whose lock stayed busy returns, or raises; a callable
    ``on_busy`` comes bound to the call's arguments."""
    if on_busy == "skip":
        log_busy.info("skipped %r: lock busy", name, extra={"lock_name": name, "kind": "lock"})
        return None
    if callable(on_busy):
        return on_busy()
    if request is not None and on_busy is None:
        return error_response(
            request,
            status=conf.BUSY_STATUS,
            retry_after=retry_after,
            reason="busy",
            name=name,
            handler=conf.BUSY_RESPONSE,
        )
    raise LockNotAcquired(name, retry_after=retry_after)


def unavailable(
    on_busy: Any,
    request: Any,
    name: str,
    exc: RedisUnavailable,
    sender: type,
    lock: Lock | AsyncLock | None = None,
) -> Any:
    """Fail closed: a response for a view, else the exception."""
    log_unavailable.warning(
        "Redis unavailable for lock %r, not running the call: %s",
        name,
        exc,
        extra=_unavailable_fields(lock, name, exc, fail_open=False),
    )
    send_unavailable(sender, name=name, error=exc, fail_open=False, lock=lock)
    if request is not None and on_busy != "raise":
        return unavailable_response(request, name)
    raise exc


def failed_open(
    name: str, exc: RedisUnavailable, sender: type, lock: Lock | AsyncLock | None = None
) -> None:
    log_unavailable.warning(
        "Redis unavailable for lock %r, running unlocked: %s",
        name,
        exc,
        extra=_unavailable_fields(lock, name, exc, fail_open=True),
    )
    send_unavailable(sender, name=name, error=exc, fail_open=True, lock=lock)


def _unavailable_fields(
    lock: Any, name: str, exc: RedisUnavailable, *, fail_open: bool
) -> dict[str, Any]:
    """The structured fields of an outage's record: the lock's, and why."""
    fields = fields_of(lock) if lock is not None else {"lock_name": name, "kind": "lock"}
    return {**fields, "reason": getattr(exc, "reason", None), "fail_open": fail_open}


def lost_response(request: Any, name: str) -> Any:
    return unavailable_response(request, name, retry_after=1)


def lost_before_commit(lock: LockBase) -> LockLost:
    return LockLost(
        f"lock {lock.name!r} ran out before its transaction could commit; the work was "
        "rolled back (raise the timeout or pass renew=True)"
    )


def release(lock: Lock, *, quiet: bool) -> None:
    if lock.token is None:
        return
    try:
        lock.release()
    except LockLost:
        # lock_lost was sent and logged already; a view's response stands.
        if not quiet:
            raise
    except RedisUnavailable as exc:
        release_failed(lock, exc)


async def release_async(lock: AsyncLock, *, quiet: bool) -> None:
    if lock.token is None:
        return
    try:
        await lock.release()
    except LockLost:
        if not quiet:
            raise
    except RedisUnavailable as exc:
        release_failed(lock, exc)


def release_failed(lock: Lock | AsyncLock, exc: RedisUnavailable) -> None:
    """A decorated call's release could not reach Redis: its result stands, the
    give-back goes on off its path, and operators hear of it (the log and
    ``redis_unavailable``, the call having run under the lock)."""
    log_release.warning(
        "could not release %r (%s); its lease will expire",
        lock.name,
        exc,
        extra=_unavailable_fields(lock, lock.name, exc, fail_open=False),
    )
    send_unavailable(type(lock), lock.name, exc, fail_open=False, lock=lock)
