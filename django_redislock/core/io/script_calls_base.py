"""One call of a script, decided without I/O for both shells.

EVALSHA first, the source again by EVAL when the server does not have it
(``NOSCRIPT``: a restart, ``SCRIPT FLUSH``, a failover), which also caches it
for the next EVALSHA; a broken connection sends a repeatable script once more
on a new one, never after a timeout (the first may still be on its way); an
error reply or a failure becomes ``RedisUnavailable``. ``ScriptCall`` is that
decision; ``script_calls_async.py`` and its generated twin send its batches.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import failures
from ..clients import AnyRedisClient
from ..engine.scripts import Script
from ..exceptions import RedisUnavailable
from . import transport

__all__ = [
    "Args",
    "Keys",
    "ScriptCall",
    "clean",
    "first_batch",
    "wait_for_replicas",
]

Keys = tuple[bytes, ...]
Args = tuple[Any, ...]


def _unavailable(script: Script, exc: BaseException, client: AnyRedisClient) -> RedisUnavailable:
    # A wrong password, a server that is not running and one that does not
    # answer in time each get their own words (see failures.py).
    return failures.unavailable(f"running {script.name}", exc, failures.address_of(client))


def _send_again(script: Script, failed: transport.CallFailed, tried: int) -> bool:
    """Whether a failed batch of ``script`` is sent once more (see Script)."""
    return (
        tried == 1
        and script.repeatable
        and failed.pending is None
        and isinstance(failed.cause, RedisConnectionError)
        and not isinstance(failed.cause, RedisTimeoutError)
    )


def _failed(
    script: Script, failed: transport.CallFailed, client: AnyRedisClient
) -> RedisUnavailable:
    error = _unavailable(script, failed.cause, client)
    # What ``may_have_run`` reads; ``pending`` orders a give-back after the late script.
    error.may_have_run = failed.may_have_run  # type: ignore[attr-defined]
    error.pending = failed.pending  # type: ignore[attr-defined]
    return error


def _batch(script: Script, keys: Keys, args: Args, extra: Args, *, by_sha: bool) -> list[Args]:
    head = ("EVALSHA", script.sha) if by_sha else ("EVAL", script.source)
    return [(*head, len(keys), *keys, *args), *extra]


def _batches(
    client: AnyRedisClient, script: Script, keys: Keys, args: Args, extra: Args
) -> Generator[list[Args], list[Any], list[Any]]:
    """The batches one call of ``script`` sends: each is yielded, and its
    replies sent back or its ``CallFailed`` thrown in. Returns the replies."""
    for tried in (1, 2):
        try:
            replies = yield _batch(script, keys, args, extra, by_sha=True)
            if isinstance(replies[0], NoScriptError):
                # It did not run: send the source, with what followed it, again.
                replies = yield _batch(script, keys, args, extra, by_sha=False)
        except transport.CallFailed as failed:
            if _send_again(script, failed, tried):
                continue
            raise _failed(script, failed, client) from failed.cause
        for reply in replies:
            if isinstance(reply, Exception):
                raise _unavailable(script, reply, client) from reply
        return replies
    raise AssertionError("unreachable")  # pragma: no cover


class ScriptCall:
    """One call of a script, decided once (``batches``) for the sync and the
    asyncio shell, which only send ``batch`` and hand back what came of it."""

    def __init__(
        self, client: AnyRedisClient, script: Script, keys: Keys, args: Args, extra: Args = ()
    ) -> None:
        self.slot_key = keys[0] if keys else b""
        self._steps = _batches(client, script, keys, args, extra)
        self.batch: list[Args] | None = next(self._steps)
        self.replies: list[Any] = []

    def answer(self, outcome: list[Any] | transport.CallFailed) -> None:
        """The replies to ``batch``, or how it failed; ``batch`` is None once done."""
        try:
            if isinstance(outcome, transport.CallFailed):
                self.batch = self._steps.throw(outcome)
            else:
                self.batch = self._steps.send(outcome)
        except StopIteration as done:
            self.batch, self.replies = None, done.value

    def answered(self, outcome: list[Any] | transport.CallFailed) -> ScriptCall:
        """``answer`` the first batch, sent by the caller; returns the call."""
        self.answer(outcome)
        return self


def clean(replies: list[Any]) -> bool:
    """Whether the first batch's replies are the answer as they are: the common
    case, which needs none of ``batches``' decisions (no error reply, no NOSCRIPT)."""
    return not any(isinstance(reply, Exception) for reply in replies)


def first_batch(script: Script, keys: Keys, args: Args, extra: Args) -> tuple[list[Args], bytes]:
    """The first batch of a call (as ``batches`` makes it) and its slot's key."""
    return _batch(script, keys, args, extra, by_sha=True), keys[0] if keys else b""


def wait_for_replicas(replicas: int, timeout: float) -> Args:
    # WAIT 0 would block forever: the smallest bound is one millisecond.
    return (("WAIT", replicas, max(1, int(timeout * 1000))),)
