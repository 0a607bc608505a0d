# generated from script_calls_async.py by tools/gen_sync.py; do not edit
"""Run a Lua script on a client, bounded, as every lock call is.

The decisions (EVALSHA or EVAL, whether to send again, what a failure is)
are ``calls_base.ScriptCall``'s; this module only sends its batches.
Written once, for asyncio; ``tools/gen_sync.py`` makes the sync functions
(``script_calls.py``) from it (edit this source, never the generated file).
"""

from __future__ import annotations

from typing import Any

from ..clients import RedisClient
from ..engine.scripts import Script
from . import transport
from .calls_base import Args, Keys, ScriptCall, clean, first_batch, wait_for_replicas

__all__ = ["run_acked", "run"]


def _resent(client: RedisClient, call: ScriptCall) -> list[Any]:
    while call.batch is not None:
        try:
            call.answer(transport.call(client, call.batch, call.slot_key))
        except transport.CallFailed as failed:
            call.answer(failed)
    return call.replies


def _sent(client: RedisClient, script: Script, keys: Keys, args: Args, extra: Args = ()) -> Any:
    """The first batch; ``ScriptCall`` decides what follows only when it is not clean."""
    try:
        outcome: Any = transport.call(client, *first_batch(script, keys, args, extra))
        if clean(outcome):
            return outcome
    except transport.CallFailed as failed:
        outcome = failed
    call = ScriptCall(client, script, keys, args, extra).answered(outcome)
    return _resent(client, call)


def run(client: RedisClient, script: Script, keys: Keys, args: Args) -> Any:
    """Run ``script``; Redis failures become RedisUnavailable.

    Bounded by the client's socket timeout whatever its retry policy (see
    ``transport``); a script that may have run is never sent again.
    """
    return (_sent(client, script, keys, args))[0]


def run_acked(
    client: RedisClient,
    script: Script,
    keys: Keys,
    args: Args,
    replicas: int,
    timeout: float,
) -> tuple[Any, int]:
    """``run``, then WAIT for ``replicas``; returns (result, replicas that acked).

    The script and WAIT go together on one connection (of the node owning the
    keys' slot, on a Cluster): WAIT counts only the writes made on its own
    connection, so anywhere else it could confirm a write it never saw.
    Still one round trip.
    """
    result, acked = _sent(client, script, keys, args, wait_for_replicas(replicas, timeout))
    return result, int(acked)
