"""Lua scripts, run as Redis Functions (FCALL) or by EVALSHA with a fallback to EVAL.

The scripts live in ``lua/`` beside this module. Each lock script is the shared
``_prelude.lua`` followed by its own body, so the queue logic exists once.

The lock scripts (acquire, release, extend, cancel, clear) also form one
function library, ``redislock_<hash of its source>``, loaded with ``FUNCTION
LOAD`` the first time a server lacks it. On Redis 7.0 an FCALL costs the
server about 2,000 instructions less than the same script by EVALSHA (no
lookup by SHA; measured with ``python -m benchmarks.server_cost``), some 2% of
an uncontended acquire and release. Each function carries its flags: release,
extend, give-back and clear may run when Redis is out of memory (as the same
scripts do by EVAL), so that they never leave a lease behind for want of it;
acquire is refused whole. A server without functions (Redis
6.2), a user the ACL denies ``FCALL`` or ``FUNCTION LOAD``, or a server that
refuses the library: the client's pool is marked and its scripts go by
EVALSHA from then on, exactly as before.

A Redis that lost its functions or its script cache (restart without
persistence, ``FUNCTION FLUSH``, ``SCRIPT FLUSH``, a failover to a node that
never saw them) gets the source again: ``FUNCTION LOAD``, or EVAL, which also
caches it for the next EVALSHA. Neither runs anything: the call is then sent
as it was, once.

A library is not a key and has no TTL: Redis keeps it (and saves it with the
data) until ``FUNCTION DELETE redislock_<hash>``. Each version of these
scripts adds one of about 45 kB; ``FUNCTION LIST LIBRARYNAME redislock_``
shows them, and one no running process uses can be deleted at any time (a
process that still uses it loads it again on its next call).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import weakref
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import failures, transport
from .exceptions import RedisUnavailable
from .protocol import STATE_KEEP_MS, may_have_run

__all__ = [
    "LIBRARY",
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
    # Its name in the function library (FCALL), or "" for EVALSHA only.
    function: str = ""


def _read(filename: str) -> str:
    return (resources.files(__package__) / "lua" / filename).read_text("utf-8")


def load(name: str, *, prelude: str | None = "_prelude.lua", repeatable: bool = False) -> Script:
    text = _read(f"{name}.lua")
    if prelude:
        text = _read(prelude) + "\n" + text
    # One source for the state's keep time: the scripts say @STATE_KEEP_MS@.
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


@dataclass(frozen=True)
class Library:
    """The lock scripts as one Redis Functions library."""

    name: str
    source: bytes

    @property
    def load_command(self) -> tuple[Any, ...]:
        return ("FUNCTION", "LOAD", self.source)


def _library(members: list[Script]) -> tuple[Library, list[Script]]:
    """The library holding ``members``, and the members named in it.

    Named after a hash of its source, so that versions of this package that
    differ in any script never call each other's functions, and a rolling
    upgrade loads its own library beside the old one.
    """
    digest = hashlib.sha1(b"\0".join(m.source for m in members)).hexdigest()[:16]
    name = f"redislock_{digest}"
    named = [replace(m, function=f"{name}_{m.name}") for m in members]
    parts = [f"#!lua name={name}\n".encode()]
    for m in named:
        # Each script runs as the body of its function, KEYS and ARGV its
        # parameters, so its text is the same as by EVAL. Without flags a
        # function is refused whole when Redis is out of memory: right for
        # acquire, which would add a lease. The others only release, extend
        # or give back, and must not leave a lease behind for want of memory.
        flags = b"{}" if m.name == "acquire" else b"{'allow-oom'}"
        parts.append(
            b"redis.register_function{function_name='"
            + m.function.encode()
            + b"', flags="
            + flags
            + b", callback=function(KEYS, ARGV)\n"
            + m.source
            + b"\nend}\n"
        )
    return Library(name, b"".join(parts)), named


# Pools (or Cluster clients) whose server cannot run the library: FCALL unknown
# (Redis before 7.0), refused by the ACL, or the library not loadable. Their
# calls go by EVALSHA for the life of the pool.
_no_functions: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_no_functions_lock = threading.Lock()


def _owner_of(client: Any) -> Any:
    return getattr(client, "connection_pool", None) or client


def uses_functions(client: Any) -> bool:
    """Whether the lock scripts reach ``client``'s server as functions (FCALL)."""
    try:
        return _owner_of(client) not in _no_functions
    except TypeError:  # cannot be weakly referenced: keep to EVALSHA
        return False


def use_eval_only(client: Any) -> None:
    """Send ``client``'s lock scripts by EVALSHA from now on (see the module)."""
    with _no_functions_lock, contextlib.suppress(TypeError):
        _no_functions[_owner_of(client)] = True


def _function_missing(reply: Any) -> bool:
    """FCALL did not run because the server lacks the library (load it)."""
    return isinstance(reply, ResponseError) and "function not found" in str(reply).lower()


def _functions_refused(reply: Any) -> bool:
    """FCALL did not run and never will here: no such command, or the ACL."""
    if not isinstance(reply, ResponseError):
        return False
    text = str(reply).lower()
    return "unknown command" in text or text.startswith("noperm") or "no permissions" in text


def _batch(
    script: Script,
    keys: tuple[bytes, ...],
    args: tuple[Any, ...],
    extra: tuple[Any, ...],
    *,
    by_sha: bool,
    by_function: bool = False,
) -> list[tuple[Any, ...]]:
    if by_function:
        head: tuple[Any, ...] = ("FCALL", script.function)
    elif by_sha:
        head = ("EVALSHA", script.sha)
    else:
        head = ("EVAL", script.source)
    return [(*head, len(keys), *keys, *args), *extra]


def _load_failed(script: Script, failed: transport.CallFailed, client: Any) -> RedisUnavailable:
    # FUNCTION LOAD runs nothing of the script: whatever became of it, the
    # script did not run.
    error = _unavailable(script, failed.cause, client)
    error.may_have_run = False  # type: ignore[attr-defined]
    error.pending = failed.pending  # type: ignore[attr-defined]
    return error


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
    if script.function and uses_functions(client):
        replies = _run_function(client, script, keys, args, extra, slot_key)
        if replies is not None:
            return replies
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
    if script.function and uses_functions(client):
        replies = await _run_function_async(client, script, keys, args, extra, slot_key)
        if replies is not None:
            return replies
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


def _run_function(
    client: Any,
    script: Script,
    keys: tuple[bytes, ...],
    args: tuple[Any, ...],
    extra: tuple[Any, ...],
    slot_key: bytes,
) -> list[Any] | None:
    """``_run`` by FCALL; None when this server takes no functions (then EVALSHA)."""
    batch = _batch(script, keys, args, extra, by_sha=True, by_function=True)
    loaded = False
    for tried in (1, 2, 3):
        try:
            replies = transport.call(client, batch, slot_key)
        except transport.CallFailed as failed:
            if _send_again(script, failed, tried):
                continue
            raise _failed(script, failed, client) from failed.cause
        first = replies[0]
        if _functions_refused(first) or (loaded and _function_missing(first)):
            use_eval_only(client)
            return None
        if _function_missing(first):
            # Not run. Load the library on the node that owns the keys (FUNCTION
            # LOAD has no key: it runs where it is sent), then send the call as it was.
            try:
                transport.call(client, [LIBRARY.load_command], slot_key)
            except transport.CallFailed as failed:
                raise _load_failed(script, failed, client) from failed.cause
            loaded = True
            continue
        return _checked(script, replies, client)
    use_eval_only(client)  # pragma: no cover  (a library that keeps vanishing)
    return None


async def _run_function_async(
    client: Any,
    script: Script,
    keys: tuple[bytes, ...],
    args: tuple[Any, ...],
    extra: tuple[Any, ...],
    slot_key: bytes,
) -> list[Any] | None:
    """``_run_function`` for a ``redis.asyncio`` client."""
    batch = _batch(script, keys, args, extra, by_sha=True, by_function=True)
    loaded = False
    for tried in (1, 2, 3):
        try:
            replies = await transport.call_async(client, batch, slot_key)
        except transport.CallFailed as failed:
            if _send_again(script, failed, tried):
                continue
            raise _failed(script, failed, client) from failed.cause
        first = replies[0]
        if _functions_refused(first) or (loaded and _function_missing(first)):
            use_eval_only(client)
            return None
        if _function_missing(first):
            try:
                await transport.call_async(client, [LIBRARY.load_command], slot_key)
            except transport.CallFailed as failed:
                raise _load_failed(script, failed, client) from failed.cause
            loaded = True
            continue
        return _checked(script, replies, client)
    use_eval_only(client)  # pragma: no cover
    return None


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


LIBRARY, (ACQUIRE, RELEASE, EXTEND, CANCEL, CLEAR) = _library(
    [
        load("acquire"),
        load("release", repeatable=True),
        load("extend", repeatable=True),
        load("cancel", repeatable=True),
        load("clear"),
    ]
)
