"""The retry policy of the library's own Redis clients.

One quick retry of a connection error (a pooled connection that died with a
restarted Redis); never a timeout, which is raised at once with its
connection closed. ``connection.py`` gives it to every client it builds.
"""

from __future__ import annotations

import inspect
from typing import Any, NoReturn

import redis
import redis.asyncio.retry
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

__all__ = ["RETRIED", "TIMEOUTS", "BoundedAsyncRetry", "BoundedRetry", "bounded_retry"]


RETRIED = (redis.exceptions.ConnectionError,)
TIMEOUTS = (redis.exceptions.TimeoutError, TimeoutError)


def _reraise(exc: redis.exceptions.ConnectionError) -> NoReturn:
    # redis-py's asyncio connect reports a handshake that timed out as a
    # ConnectionError: say what it is, so that it is not retried.
    if isinstance(exc.__cause__, TIMEOUTS):
        raise redis.exceptions.TimeoutError(str(exc)) from exc
    raise exc


def _failing(fail: Any, exc: BaseException, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call redis-py's failure handler for ``exc`` as a retried error would."""
    counted = args[1] if len(args) > 1 else kwargs.get("with_failure_count", False)
    return fail(exc, 1) if counted else fail(exc)


class BoundedRetry(Retry):
    """``Retry`` that never retries a timeout, even one reported as a ConnectionError.

    A timeout still goes through the failure handler, which closes the
    connection: its reply may come later, and must not be read by whoever
    takes the connection next. (A Sentinel-managed connection does not close
    itself on a read error; redis-py closes it only in that handler, which
    its Retry calls for retried errors alone.)
    """

    def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
        def once() -> Any:
            try:
                return do()
            except redis.exceptions.ConnectionError as exc:
                _reraise(exc)

        try:
            return super().call_with_retry(once, fail, *args, **kwargs)
        except TIMEOUTS as exc:
            _failing(fail, exc, args, kwargs)
            raise


class BoundedAsyncRetry(redis.asyncio.retry.Retry):
    """``BoundedRetry`` for ``redis.asyncio`` connections."""

    async def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
        async def once() -> Any:
            try:
                return await do()
            except redis.exceptions.ConnectionError as exc:
                _reraise(exc)

        try:
            return await super().call_with_retry(once, fail, *args, **kwargs)
        except TIMEOUTS as exc:
            failed = _failing(fail, exc, args, kwargs)
            if inspect.isawaitable(failed):
                await failed
            raise


def bounded_retry(kind: Any = BoundedRetry) -> Any:
    # One quick retry covers a pooled connection that died with a restarted
    # Redis; more would stretch the caller's bound for little gain. Timeouts
    # are not retried: the command may have run, and the caller is better
    # told "unavailable" than handed the result of running it twice. (Lock
    # scripts do not use this policy at all: see core/io/calls_async.py.)
    return kind(ExponentialBackoff(cap=0.1, base=0.01), 1, supported_errors=RETRIED)
