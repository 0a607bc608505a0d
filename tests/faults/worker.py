"""Processes the scenarios drive: a lock holder on stdin/stdout, and a contender.

``python -m tests.faults.worker URL`` holds at most one ``Lock`` and obeys one
JSON command per line (acquire, write, extend, release, state, exit), answering
one JSON line each. It is a real process so that it can be paused and killed.
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

from django_redislock.core.exceptions import LockError, RedisUnavailable
from django_redislock.core.lock import Lock

from .harness import bounded_client
from .oracles import FenceTable, SharedOracles


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
                    client, cmd["name"], ttl=cmd.get("ttl", 30), wait=cmd.get("wait", 0),
                    renew=cmd.get("renew", False),
                )
                out["ok"] = lock.acquire()
                out["fence"] = lock.fence
                out["token"] = lock.token
            elif op == "permit":
                from django_redislock.core.semaphore import Semaphore

                permit = Semaphore(client, cmd["name"], cmd["limit"], ttl=cmd["ttl"], wait=0)
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


if __name__ == "__main__":
    _serve(sys.argv[1])
