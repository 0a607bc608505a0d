"""Capacity to plan with: what a held lock, a waiter and a permit cost Redis.

Usage::

    python -m benchmarks.capacity              # about half a minute
    python -m benchmarks.capacity --n 5000 --pairs 20000

It starts a private ``redis-server`` (a unix socket, nothing on disk, stopped
by its PID) and measures, on it alone:

* memory: ``used_memory`` before and after ``--n`` locks held on as many
  names, ``--n`` permits of one semaphore, ``--n`` waiters queued behind one
  held lock (threads of this process, as a view's waiters are; the idle
  connections their calls left in the pool are closed before counting), and
  up to 500 idle client connections, divided by their number; the server's
  allocator rounds, so small ``--n`` reads high;
* server CPU: the ``used_cpu_sys`` + ``used_cpu_user`` Redis reports, spent on
  ``--pairs`` uncontended acquire+release pairs of a new handle on a new name
  each time (the decorator's path), divided by ``--pairs``: one Redis core
  serves one over that many pairs per second when nothing else runs on it.

A contended critical section's server CPU is in ``python -m benchmarks.locks``
(``server CPU us/CS``). The numbers are this machine's; the ratios between
them hold on others.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
from typing import Any

from django_redislock.core import Lock
from django_redislock.core.drivers.semaphore import Semaphore

from .common import PrivateRedis, fmt, machine_facts, table


def used_memory(client: Any) -> int:
    client.execute_command("MEMORY", "PURGE")
    return int(client.info("memory")["used_memory"])


def server_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def held_locks(client: Any, n: int) -> float:
    before = used_memory(client)
    handles = [Lock(client, f"cap:held:{i}", ttl=600, wait=0) for i in range(n)]
    for handle in handles:
        assert handle.acquire()
    per = (used_memory(client) - before) / n
    for handle in handles:
        handle.release()
    return per


def waiters(client: Any, n: int) -> float:
    holder = Lock(client, "cap:queue", ttl=600, wait=0)
    assert holder.acquire()
    queue = holder.keys.queue
    before = used_memory(client)
    clients_before = int(client.info("clients")["connected_clients"])
    started = threading.Barrier(n + 1)

    def wait() -> None:
        started.wait(30)
        # The server goes at the end, with the waiters still queued.
        with contextlib.suppress(Exception):
            Lock(client, "cap:queue", ttl=600, wait=120).acquire()

    for _ in range(n):
        threading.Thread(target=wait, daemon=True).start()
    started.wait(30)
    deadline = time.monotonic() + 60
    while client.llen(queue) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {client.llen(queue)} of {n} waiters queued within 60 s")
        time.sleep(0.05)
    # A queued waiter holds no connection: close the idle ones their calls
    # left in the pool, so that what is counted is the waiters alone.
    client.connection_pool.disconnect(inuse_connections=False)
    while int(client.info("clients")["connected_clients"]) > clients_before + 2:
        if time.monotonic() > deadline:
            raise SystemExit("the pool's idle connections did not close within 60 s")
        time.sleep(0.05)
    return (used_memory(client) - before) / n


def permits(client: Any, n: int) -> float:
    before = used_memory(client)
    handles = [Semaphore(client, "cap:permits", n, ttl=600, wait=0) for _ in range(n)]
    for handle in handles:
        assert handle.acquire()
    per = (used_memory(client) - before) / n
    for handle in handles:
        handle.release()
    return per


def connections(server: PrivateRedis, n: int) -> float:
    """An idle client connection (a pooled one a worker keeps open)."""
    admin = server.client()
    before = used_memory(admin)
    clients = [server.client() for _ in range(n)]
    for c in clients:
        c.ping()
    per = (used_memory(admin) - before) / n
    for c in clients:
        c.close()
    admin.close()
    return per


def cpu_per_pair(client: Any, pairs: int) -> float:
    for i in range(200):  # warm: scripts loaded, connection open
        lock = Lock(client, f"cap:warm:{i}", ttl=30, wait=0)
        lock.acquire()
        lock.release()
    before = server_cpu(client)
    for i in range(pairs):
        lock = Lock(client, f"cap:pair:{i}", ttl=30, wait=0)
        lock.acquire()
        lock.release()
    return (server_cpu(client) - before) / pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.capacity", description=__doc__)
    parser.add_argument("--n", type=int, default=2000, help="locks, waiters and permits")
    parser.add_argument("--pairs", type=int, default=10000, help="acquire+release pairs")
    cfg = parser.parse_args(argv)
    server = PrivateRedis().start()
    try:
        # Room for every waiter's call in flight at once (a process's
        # threads share one pool, as a gunicorn worker's do).
        client = server.client(max_connections=cfg.n + 50)
        facts = machine_facts(server.version())
        rows = [
            ["held lock (its lease, and its name's state)", fmt(held_locks(client, cfg.n), 0)],
            ["permit of a semaphore", fmt(permits(client, cfg.n), 0)],
            ["idle client connection", fmt(connections(server, min(cfg.n, 500)), 0)],
        ]
        cpu = cpu_per_pair(client, cfg.pairs)
        # Last: the waiters stay queued (their threads blocked) until the server stops.
        rows.append(["waiter (its queue entry and state entry)", fmt(waiters(client, cfg.n), 0)])
    finally:
        server.stop()
    print(f"{facts['date_utc']}  {facts['cpu']}, {facts['cores']} cores")
    print(f"Redis {facts['redis_server']}, redis-py {facts['redis_py']}")
    print(f"n = {cfg.n}, pairs = {cfg.pairs}\n")
    print(table(["what", "Redis memory, bytes each"], rows))
    print()
    print(
        table(
            ["uncontended acquire+release, new handle and name", "value"],
            [
                ["server CPU per pair, us", fmt(cpu * 1e6, 1)],
                ["pairs per second per Redis core", fmt(1 / cpu if cpu else float("nan"), 0)],
            ],
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
