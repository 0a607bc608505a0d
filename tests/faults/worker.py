"""Processes the scenarios drive: a lock holder on stdin/stdout, and a contender.

``python -m tests.faults.worker URL`` holds at most one ``Lock`` and obeys one
JSON command per line (acquire, write, extend, release, state, exit), answering
one JSON line each. It is a real process so that it can be paused and killed.

``contend`` and ``contend_through_freeze`` are the bodies of the contending
processes the scenarios spawn.
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

from django_redislock.core.drivers.lock import Lock
from django_redislock.core.exceptions import LockError, RedisUnavailable

from .harness import bounded_client, freeze_bound
from .oracles import FenceTable, SharedOracles, TokenLedger


def _serve(url: str) -> None:
    client = bounded_client(url, timeout=0.5)
    lock: Lock | None = None
    for line in sys.stdin:
        cmd: dict[str, Any] = json.loads(line)
        op = cmd["op"]
        out: dict[str, Any] = {"op": op}
        try:
            if op == "acquire":
                lock = Lock(
                    client,
                    cmd["name"],
                    ttl=cmd.get("ttl", 30),
                    wait=cmd.get("wait", 0),
                    renew=cmd.get("renew", False),
                )
                out["ok"] = lock.acquire()
                out["fence"] = lock.fence
                out["token"] = lock.token
            elif op == "permit":
                from django_redislock.core.drivers.semaphore import Semaphore

                permit = Semaphore(
                    client, cmd["name"], cmd["limit"], ttl=cmd["ttl"], wait=cmd.get("wait", 0)
                )
                out["ok"] = permit.acquire()
            elif op == "write":
                assert lock is not None and lock.fence is not None
                out["ok"] = FenceTable(cmd["db"]).write(lock.fence, cmd["value"])
                out["fence"] = lock.fence
            elif op == "extend":
                assert lock is not None
                lock.extend()
                out["ok"] = True
            elif op == "release":
                assert lock is not None
                lock.release()
                out["ok"] = True
            elif op == "state":
                out["held"] = bool(lock and lock.held)
                out["lost"] = bool(lock and lock.lost)
            elif op == "exit":
                print(json.dumps(out), flush=True)
                return
        except (LockError, RedisUnavailable) as exc:
            out["ok"] = False
            out["error"] = type(exc).__name__
        out["held"] = bool(lock and lock.held)
        print(json.dumps(out), flush=True)


def contend(
    url: str,
    names: list[str],
    oracles: SharedOracles,
    seed: int,
    deadline_s: float,
    quota: int,
    ttl: float,
    use_lock: bool,
    stats: Any,
    slot: int,
) -> None:
    """One contending process: acquire a random lock, check in with the oracles, release.

    Stops after ``quota`` acquisitions or ``deadline_s`` seconds. ``use_lock=False``
    runs the same loop unlocked, to show the oracles do catch overlap.
    """
    rng = random.Random(seed)
    client = bounded_client(url, timeout=2.0)
    locks = [Lock(client, name, ttl=ttl, wait=10) for name in names]
    stop_at = time.monotonic() + deadline_s
    done = busy = errors = 0
    while done < quota and time.monotonic() < stop_at:
        i = rng.randrange(len(names))
        # Mostly no dwell; sometimes a short one, so waiters pile up and queue.
        dwell = 0.0 if rng.random() < 0.9 else rng.random() * 0.002
        if not use_lock:
            oracles.enter(i, done + 1 + slot * 10**12)
            oracles.increment(i, dwell)
            oracles.leave(i)
            done += 1
            continue
        lock = locks[i]
        try:
            if not lock.acquire():
                busy += 1
                continue
        except RedisUnavailable:
            errors += 1
            continue
        try:
            assert lock.fence is not None
            oracles.enter(i, lock.fence)
            oracles.increment(i, dwell)
            oracles.leave(i)
        finally:
            try:
                lock.release()
            except LockError:
                errors += 1
        done += 1
    stats[slot * 3] = done
    stats[slot * 3 + 1] = busy
    stats[slot * 3 + 2] = errors


class _LedgerLock(Lock):
    """A ``Lock`` whose tokens come from the ledger: each names its process and
    attempt, so a lease found in Redis can be traced to the attempt it belongs to."""

    def __init__(self, ledger: TokenLedger, slot: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ledger = ledger
        self._slot = slot
        self.last_token = ""

    def _new_token(self) -> str:
        self.last_token = self._ledger.issue(self._slot)
        return self.last_token


def contend_through_freeze(
    url: str,
    names: list[str],
    oracles: SharedOracles,
    ledger: TokenLedger,
    timing: Any,
    seed: int,
    slot: int,
    stop: Any,
    socket_timeout: float,
    wait: float,
    ttl: float,
) -> None:
    """Contend for ``names`` until ``stop`` is set, while Redis may be frozen.

    Half the acquires try once, half wait up to ``wait``. Every call is timed
    against its bound (``timing``, see ``FreezeTiming``); every token is
    reported to the ledger once nothing in this process holds or waits with it
    any more (acquire returned without the lease, or release returned).
    """
    rng = random.Random(seed)
    client = bounded_client(url, timeout=socket_timeout)
    locks = {
        (name, w): _LedgerLock(ledger, slot, client, name, ttl=ttl, wait=w)
        for name in names
        for w in (0.0, wait)
    }
    while not stop.is_set():
        i = rng.randrange(len(names))
        w = 0.0 if rng.random() < 0.5 else wait
        lock = locks[(names[i], w)]
        started = time.monotonic()
        try:
            got = lock.acquire()
        except RedisUnavailable:
            got = None
        timing.record(
            slot,
            "acquire-wait" if w else "acquire",
            time.monotonic() - started,
            w + freeze_bound(socket_timeout),
        )
        if not got:
            timing.count(slot, "unavailable" if got is None else "busy")
            ledger.retire(slot, lock.last_token)
            continue
        try:
            assert lock.fence is not None
            oracles.enter(i, lock.fence)
            oracles.increment(i, 0.0 if rng.random() < 0.8 else rng.random() * 0.005)
            oracles.leave(i)
        finally:
            started = time.monotonic()
            try:
                lock.release()
            except RedisUnavailable:
                timing.count(slot, "unavailable")
            except LockError:
                timing.count(slot, "lost")
            timing.record(slot, "release", time.monotonic() - started, freeze_bound(socket_timeout))
            ledger.retire(slot, lock.last_token)
    client.close()


if __name__ == "__main__":
    _serve(sys.argv[1])
