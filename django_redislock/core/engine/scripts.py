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
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import failures
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


def load(name: str, *, prelude: str | None = "lock", repeatable: bool = False) -> Script:
    """The script ``lua/<name>.lua``, after the pieces of its kind.

    ``prelude`` is the kind (a key of ``PIECES``), or None for a stand-alone
    script.
    """
    pieces = (*PIECES[prelude], f"{name}.lua") if prelude else (f"{name}.lua",)
    text = "\n".join(_read(piece) for piece in pieces)
    # The one way the scripts learn the state's keep time (docs/internals.rst).
    source = text.replace("@STATE_KEEP_MS@", str(STATE_KEEP_MS)).encode()
    return Script(name, source, hashlib.sha1(source).hexdigest(), repeatable)


def _unavailable(script: Script, exc: BaseException, client: Any = None) -> RedisUnavailable:
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


def _failed(script: Script, failed: transport.CallFailed, client: Any) -> RedisUnavailable:
    error = _unavailable(script, failed.cause, client)
    # What ``may_have_run`` reads; ``pending`` orders a give-back after the late script.
    error.may_have_run = failed.may_have_run  # type: ignore[attr-defined]
    error.pending = failed.pending  # type: ignore[attr-defined]
    return error


def _batch(
    script: Script,
    keys: tuple[bytes, ...],
    args: tuple[Any, ...],
    extra: tuple[Any, ...],
    *,
    by_sha: bool,
) -> list[tuple[Any, ...]]:
    head = ("EVALSHA", script.sha) if by_sha else ("EVAL", script.source)
    return [(*head, len(keys), *keys, *args), *extra]


def _checked(script: Script, replies: list[Any], client: Any) -> list[Any]:
    for reply in replies:
        if isinstance(reply, Exception):
            raise _unavailable(script, reply, client) from reply
    return replies


def _run(
    client: Any,
    script: Script,
    keys: tuple[bytes, ...],
    args: tuple[Any, ...],
    extra: tuple[Any, ...] = (),
) -> list[Any]:
    slot_key = keys[0] if keys else b""
    for tried in (1, 2):
        try:
            replies = transport.call(
                client, _batch(script, keys, args, extra, by_sha=True), slot_key
            )
            if isinstance(replies[0], NoScriptError):
                # It did not run: send the source, with what followed it, again.
                replies = transport.call(
                    client, _batch(script, keys, args, extra, by_sha=False), slot_key
                )
        except transport.CallFailed as failed:
            if _send_again(script, failed, tried):
                continue
            raise _failed(script, failed, client) from failed.cause
        return _checked(script, replies, client)
    raise AssertionError("unreachable")  # pragma: no cover


async def _run_async(
    client: Any,
    script: Script,
    keys: tuple[bytes, ...],
    args: tuple[Any, ...],
    extra: tuple[Any, ...] = (),
) -> list[Any]:
    slot_key = keys[0] if keys else b""
    for tried in (1, 2):
        try:
            replies = await transport.call_async(
                client, _batch(script, keys, args, extra, by_sha=True), slot_key
            )
            if isinstance(replies[0], NoScriptError):
                replies = await transport.call_async(
                    client, _batch(script, keys, args, extra, by_sha=False), slot_key
                )
        except transport.CallFailed as failed:
            if _send_again(script, failed, tried):
                continue
            raise _failed(script, failed, client) from failed.cause
        return _checked(script, replies, client)
    raise AssertionError("unreachable")  # pragma: no cover


def run(client: Any, script: Script, keys: tuple[bytes, ...], args: tuple[Any, ...]) -> Any:
    """Run ``script`` on a sync client; Redis failures become RedisUnavailable.

    Bounded by the client's socket timeout whatever its retry policy (see
    ``transport``); a script that may have run is never sent again.
    """
    return _run(client, script, keys, args)[0]


async def run_async(
    client: Any, script: Script, keys: tuple[bytes, ...], args: tuple[Any, ...]
) -> Any:
    """``run`` for a ``redis.asyncio`` client."""
    return (await _run_async(client, script, keys, args))[0]


def _replicas_ms(timeout: float) -> int:
    # WAIT 0 would block forever: the smallest bound is one millisecond.
    return max(1, int(timeout * 1000))


def run_acked(
    client: Any,
    script: Script,
    keys: tuple[bytes, ...],
    args: tuple[Any, ...],
    replicas: int,
    timeout: float,
) -> tuple[Any, int]:
    """``run``, then WAIT for ``replicas``; returns (result, replicas that acked).

    The script and WAIT go together on one connection (of the node owning the
    keys' slot, on a Cluster): WAIT counts only the writes made on its own
    connection, so anywhere else it could confirm a write it never saw.
    Still one round trip.
    """
    wait = (("WAIT", replicas, _replicas_ms(timeout)),)
    result, acked = _run(client, script, keys, args, wait)
    return result, int(acked)


async def run_acked_async(
    client: Any,
    script: Script,
    keys: tuple[bytes, ...],
    args: tuple[Any, ...],
    replicas: int,
    timeout: float,
) -> tuple[Any, int]:
    """``run_acked`` for a ``redis.asyncio`` client."""
    wait = (("WAIT", replicas, _replicas_ms(timeout)),)
    result, acked = await _run_async(client, script, keys, args, wait)
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
