"""Lua scripts, run by EVALSHA with a transparent fallback to EVAL on NOSCRIPT.

The scripts live in ``lua/`` beside this module. Each lock script is the shared
``_prelude.lua`` followed by its own body, so the queue logic exists once.
A Redis that lost its script cache (restart, ``SCRIPT FLUSH``, failover) gets
the source again through EVAL, which also caches it for the next EVALSHA.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .exceptions import RedisUnavailable
from .protocol import STATE_KEEP_MS
from .topology import is_cluster

__all__ = ["Script", "load", "run", "run_acked", "run_acked_async", "run_async"]


@dataclass(frozen=True)
class Script:
    name: str
    source: bytes
    sha: str


def _read(filename: str) -> str:
    return (resources.files(__package__) / "lua" / filename).read_text("utf-8")


def load(name: str, *, prelude: str | None = "_prelude.lua") -> Script:
    text = _read(f"{name}.lua")
    if prelude:
        text = _read(prelude) + "\n" + text
    # One source for the state's keep time: the scripts say @STATE_KEEP_MS@.
    source = text.replace("@STATE_KEEP_MS@", str(STATE_KEEP_MS)).encode()
    return Script(name, source, hashlib.sha1(source).hexdigest())


def _unavailable(script: Script, exc: RedisError) -> RedisUnavailable:
    if isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
        what = "could not be reached in time"
    else:
        what = "answered with an error"
    return RedisUnavailable(f"Redis {what} running {script.name}: {exc}")


def run(client: Any, script: Script, keys: tuple[bytes, ...], args: tuple[Any, ...]) -> Any:
    """Run ``script`` on a sync client; Redis failures become RedisUnavailable."""
    try:
        try:
            return client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            return client.eval(script.source, len(keys), *keys, *args)
    except RedisError as exc:
        raise _unavailable(script, exc) from exc


async def run_async(
    client: Any, script: Script, keys: tuple[bytes, ...], args: tuple[Any, ...]
) -> Any:
    """``run`` for a ``redis.asyncio`` client."""
    try:
        try:
            return await client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await client.eval(script.source, len(keys), *keys, *args)
    except RedisError as exc:
        raise _unavailable(script, exc) from exc


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

    On one server (or Sentinel) the script and WAIT go in one non-transactional
    pipeline: still a single round trip. On a Cluster WAIT must reach the node
    that owns the keys' slot, which a pipeline cannot address: two round trips.
    """
    try:
        if is_cluster(client):
            result = run(client, script, keys, args)
            node = client.get_node_from_key(keys[0])
            acked = client.execute_command(
                "WAIT", replicas, _replicas_ms(timeout), target_nodes=node
            )
            return result, int(acked)
        for command in ("evalsha", "eval"):
            pipe = client.pipeline(transaction=False)
            body = script.sha if command == "evalsha" else script.source
            getattr(pipe, command)(body, len(keys), *keys, *args)
            pipe.wait(replicas, _replicas_ms(timeout))
            result, acked = pipe.execute(raise_on_error=False)
            if not isinstance(result, NoScriptError):
                break
        for value in (result, acked):
            if isinstance(value, Exception):
                raise value
        return result, int(acked)
    except RedisError as exc:
        raise _unavailable(script, exc) from exc


async def run_acked_async(
    client: Any,
    script: Script,
    keys: tuple[bytes, ...],
    args: tuple[Any, ...],
    replicas: int,
    timeout: float,
) -> tuple[Any, int]:
    """``run_acked`` for a ``redis.asyncio`` client."""
    try:
        if is_cluster(client):
            result = await run_async(client, script, keys, args)
            node = client.get_node_from_key(keys[0])
            acked = await client.execute_command(
                "WAIT", replicas, _replicas_ms(timeout), target_nodes=node
            )
            return result, int(acked)
        for command in ("evalsha", "eval"):
            pipe = client.pipeline(transaction=False)
            body = script.sha if command == "evalsha" else script.source
            getattr(pipe, command)(body, len(keys), *keys, *args)
            pipe.wait(replicas, _replicas_ms(timeout))
            result, acked = await pipe.execute(raise_on_error=False)
            if not isinstance(result, NoScriptError):
                break
        for value in (result, acked):
            if isinstance(value, Exception):
                raise value
        return result, int(acked)
    except RedisError as exc:
        raise _unavailable(script, exc) from exc


ACQUIRE = load("acquire")
RELEASE = load("release")
EXTEND = load("extend")
CANCEL = load("cancel")
CLEAR = load("clear")
