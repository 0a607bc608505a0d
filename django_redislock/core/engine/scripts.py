"""Lua scripts, run by EVALSHA with a transparent fallback to EVAL on NOSCRIPT.

The scripts live in ``lua/`` beside this module. Every lock, semaphore and
read-write lock script is ``_prelude.lua`` (what the three kinds share: the
clock, TTLs, waiter entries and wake-ups, serials and the memory of losses),
then its kind's own piece, then its body: ``_lock.lua`` for a lock;
``_holders.lua`` (what semaphores and read-write locks share) and then
``_semaphore.lua`` or ``_rwlock.lua``. A script that needs no more than
``_holders.lua`` is one script for both kinds (``HOLDERS_REFRESH``).
A Redis that lost its script cache (restart, ``SCRIPT FLUSH``, failover) gets
the source again through EVAL, which also caches it for the next EVALSHA.
"""

from __future__ import annotations

import hashlib
from collections.abc import Generator
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import failures
from ..clients import AnyRedisClient, AsyncRedisClient, RedisClient
from ..exceptions import RedisUnavailable
from ..io import transport
from .protocol import STATE_KEEP_MS, may_have_run

__all__ = [
    "PIECES",
    "Script",
    "load",
    "may_have_run",
    "run",
    "run_acked",
    "run_acked_async",
    "run_async",
]


@dataclass(frozen=True)
class Script:
    name: str
    source: bytes
    sha: str
    # Safe to run twice with the same arguments (release, extend, cancel): a
    # batch cut by a broken connection is sent once more, on a new one, so
    # the caller gets an answer. Never after a timeout (the first may still
    # be on its way), and never for a script that is not.
    repeatable: bool = False


def _read(filename: str) -> str:
    return (resources.files(__package__) / "lua" / filename).read_text("utf-8")


# The pieces before a script's body, per kind (``load``'s ``prelude``).
PIECES: dict[str, tuple[str, ...]] = {
    "shared": ("_prelude.lua",),
    "lock": ("_prelude.lua", "_lock.lua"),
    "holders": ("_prelude.lua", "_holders.lua"),
    "semaphore": ("_prelude.lua", "_holders.lua", "_semaphore.lua"),
    "rwlock": ("_prelude.lua", "_holders.lua", "_rwlock.lua"),
}


# A line of a piece that ends what every run of a script makes (its constants
# and locals) and begins the helpers (the functions). A body that holds the
# line runs what comes before it ahead of every piece's helpers: a fast path
# that returns there makes no closure (see docs/internals.rst, Script cost).
HELPERS = "-- @HELPERS@\n"


def _split(text: str) -> tuple[str, str]:
    """``text`` before and after its HELPERS line (all of it after, without one)."""
    head, found, tail = text.partition(HELPERS)
    return (head, tail) if found else ("", text)


def load(name: str, *, prelude: str | None = "lock", repeatable: bool = False) -> Script:
    """The script ``lua/<name>.lua``, after the pieces of its kind.

    ``prelude`` is the kind (a key of ``PIECES``), or None for a stand-alone
    script.
    """
    body = _read(f"{name}.lua")
    if prelude is None:
        text = body
    else:
        heads, helpers = zip(*(_split(_read(piece)) for piece in PIECES[prelude]), strict=True)
        if HELPERS in body:
            # A run that returns before the marker makes none of the helpers'
            # closures: what they cost is paid only by the runs that need them.
            fast, slow = _split(body)
            text = "\n".join((*heads, fast, *helpers, slow))
        else:
            text = "\n".join(head + helper for head, helper in zip(heads, helpers, strict=True))
            text += "\n" + body
    # The one way the scripts learn the state's keep time (docs/internals.rst).
    source = text.replace("@STATE_KEEP_MS@", str(STATE_KEEP_MS)).encode()
    return Script(name, source, hashlib.sha1(source).hexdigest(), repeatable)


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


class _Call:
    """One call of a script, decided once (``_batches``) for the sync and the
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

    def answered(self, outcome: list[Any] | transport.CallFailed) -> _Call:
        """``answer`` the first batch, sent by the caller; returns the call."""
        self.answer(outcome)
        return self


def _clean(replies: list[Any]) -> bool:
    """Whether the first batch's replies are the answer as they are: the common
    case, which needs none of ``_batches``' decisions (no error reply, no NOSCRIPT)."""
    return not any(isinstance(reply, Exception) for reply in replies)


def _resent(client: RedisClient, call: _Call) -> list[Any]:
    while call.batch is not None:
        try:
            call.answer(transport.call(client, call.batch, call.slot_key))
        except transport.CallFailed as failed:
            call.answer(failed)
    return call.replies


async def _resent_async(client: AsyncRedisClient, call: _Call) -> list[Any]:
    while call.batch is not None:
        try:
            call.answer(await transport.call_async(client, call.batch, call.slot_key))
        except transport.CallFailed as failed:
            call.answer(failed)
    return call.replies


def _first(script: Script, keys: Keys, args: Args, extra: Args) -> tuple[list[Args], bytes]:
    """The first batch of a call (as ``_batches`` makes it) and its slot's key."""
    return _batch(script, keys, args, extra, by_sha=True), keys[0] if keys else b""


def _sent(client: RedisClient, script: Script, keys: Keys, args: Args, extra: Args = ()) -> Any:
    """The first batch; ``_batches`` decides what follows only when it is not clean."""
    try:
        outcome: Any = transport.call(client, *_first(script, keys, args, extra))
        if _clean(outcome):
            return outcome
    except transport.CallFailed as failed:
        outcome = failed
    return _resent(client, _Call(client, script, keys, args, extra).answered(outcome))


async def _sent_async(
    client: AsyncRedisClient, script: Script, keys: Keys, args: Args, extra: Args = ()
) -> Any:
    """``_sent`` on the event loop."""
    try:
        outcome: Any = await transport.call_async(client, *_first(script, keys, args, extra))
        if _clean(outcome):
            return outcome
    except transport.CallFailed as failed:
        outcome = failed
    return await _resent_async(client, _Call(client, script, keys, args, extra).answered(outcome))


def run(client: RedisClient, script: Script, keys: Keys, args: Args) -> Any:
    """Run ``script`` on a sync client; Redis failures become RedisUnavailable.

    Bounded by the client's socket timeout whatever its retry policy (see
    ``transport``); a script that may have run is never sent again.
    """
    return _sent(client, script, keys, args)[0]


async def run_async(client: AsyncRedisClient, script: Script, keys: Keys, args: Args) -> Any:
    """``run`` for a ``redis.asyncio`` client."""
    return (await _sent_async(client, script, keys, args))[0]


def _wait(replicas: int, timeout: float) -> Args:
    # WAIT 0 would block forever: the smallest bound is one millisecond.
    return (("WAIT", replicas, max(1, int(timeout * 1000))),)


def run_acked(
    client: RedisClient, script: Script, keys: Keys, args: Args, replicas: int, timeout: float
) -> tuple[Any, int]:
    """``run``, then WAIT for ``replicas``; returns (result, replicas that acked).

    The script and WAIT go together on one connection (of the node owning the
    keys' slot, on a Cluster): WAIT counts only the writes made on its own
    connection, so anywhere else it could confirm a write it never saw.
    Still one round trip.
    """
    result, acked = _sent(client, script, keys, args, _wait(replicas, timeout))
    return result, int(acked)


async def run_acked_async(
    client: AsyncRedisClient,
    script: Script,
    keys: Keys,
    args: Args,
    replicas: int,
    timeout: float,
) -> tuple[Any, int]:
    """``run_acked`` for a ``redis.asyncio`` client."""
    result, acked = await _sent_async(client, script, keys, args, _wait(replicas, timeout))
    return result, int(acked)


ACQUIRE = load("acquire")
RELEASE = load("release", repeatable=True)
EXTEND = load("extend", repeatable=True)
CANCEL = load("cancel", repeatable=True)
CLEAR = load("clear")
# The barging order (``Lock(..., fair=False)``): the same acquire script (the
# limit it is sent says which order), its own release.
ACQUIRE_BARGING = ACQUIRE
RELEASE_BARGING = load("release_barging", repeatable=True)
# Semaphores and read-write locks refresh a holder alike: one script.
HOLDERS_REFRESH = load("holders_refresh", prelude="holders", repeatable=True)
