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

* memory of an idempotency record: ``--n`` stored responses (status,
  Content-Type, fingerprint) with an empty body and with a 1 KiB body, as
  ``@idempotent`` writes them; the difference is what each byte of a stored
  body adds;
* with ``--cluster 3,6``: a private Redis Cluster of 3, then 6 primaries (no
  replicas, loopback), ``--workers`` processes doing the same pairs on names
  spread over every slot for ``--seconds``: pairs per second, and the server
  CPU per pair summed over the nodes. On a host whose cores the clients
  already use up, adding primaries cannot add throughput; the CPU per pair
  says how many pairs each core given to a primary serves.

A contended critical section's server CPU is in ``python -m benchmarks.locks``
(``server CPU us/CS``), server instructions per uncontended pair in
``python -m benchmarks.server_cost``. The numbers are this machine's; the
ratios between them hold on others.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import threading
import time
from typing import Any

from django_redislock.core import Lock, write_record
from django_redislock.core.drivers.semaphore import Semaphore
from django_redislock.core.engine.keys import KeySpace

from .common import PrivateCluster, PrivateRedis, fmt, machine_facts, table


def used_memory(client: Any) -> int:
    client.execute_command("MEMORY", "PURGE")
    return int(client.info("memory")["used_memory"])


def server_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _held_each(client: Any, handles: list[Any]) -> float:
    """Memory per handle while every one of ``handles`` holds (handles make no call)."""
    before = used_memory(client)
    for handle in handles:
        assert handle.acquire()
    per = (used_memory(client) - before) / len(handles)
    for handle in handles:
        handle.release()
    return per


def held_locks(client: Any, n: int) -> float:
    return _held_each(client, [Lock(client, f"cap:held:{i}", ttl=600, wait=0) for i in range(n)])


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
    handles = [Semaphore(client, "cap:permits", n, ttl=600, wait=0) for _ in range(n)]
    return _held_each(client, handles)


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


def idempotency_records(client: Any, n: int, body: int) -> float:
    """A stored response as ``@idempotent`` keeps it: fields as the guard writes them."""
    space = KeySpace("redislock")
    before = used_memory(client)
    for i in range(n):
        keys = space.idempotency("user:42", f"key-{i:08d}")
        record = {
            b"fp": os.urandom(32).hex().encode(),
            b"state": b"done",
            b"status": b"201",
            b"headers": b'[["Content-Type", "application/json"]]',
            b"body": b"x" * body,
        }
        write_record(client, keys, record, ttl=600)
    return (used_memory(client) - before) / n


def _spread_pairs(url_port: int, seconds: float, start: Any, results: Any) -> None:
    from redis import RedisCluster

    client = RedisCluster(host="127.0.0.1", port=url_port, socket_timeout=5.0)
    me = os.getpid()
    for i in range(50):  # warm: slot map, scripts, a connection per node
        lock = Lock(client, f"cap:warm:{me}:{i}", ttl=30, wait=0)
        lock.acquire()
        lock.release()
    start.wait(60)
    done = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        lock = Lock(client, f"cap:spread:{me}:{done}", ttl=30, wait=0)
        lock.acquire()
        lock.release()
        done += 1
    results.put(done)
    client.close()


def cluster_scaling(primaries: int, workers: int, seconds: float) -> tuple[float, float]:
    """Pairs per second, and server CPU per pair summed over the primaries."""
    cluster = PrivateCluster(primaries).start()
    try:
        ctx = multiprocessing.get_context("fork")
        start = ctx.Barrier(workers + 1)
        results = ctx.Queue()
        procs = [
            ctx.Process(target=_spread_pairs, args=(cluster.nodes[0].port, seconds, start, results))
            for _ in range(workers)
        ]
        for proc in procs:
            proc.start()
        admins = [node.client() for node in cluster.nodes]
        start.wait(60)
        before = sum(server_cpu(a) for a in admins)
        counts = [results.get(timeout=seconds + 60) for _ in procs]
        cpu = sum(server_cpu(a) for a in admins) - before
        for proc in procs:
            proc.join(30)
        for a in admins:
            a.close()
    finally:
        cluster.stop()
    pairs = sum(counts)
    return pairs / seconds, cpu / pairs if pairs else float("nan")


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
    parser.add_argument(
        "--cluster", default="", help="primaries of the Cluster runs, e.g. 3,6 (default: none)"
    )
    parser.add_argument("--workers", type=int, default=4, help="client processes (Cluster runs)")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of a Cluster run")
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
        empty = idempotency_records(client, cfg.n, 0)
        kib = idempotency_records(client, cfg.n, 1024)
        rows.append(["idempotency record, empty body", fmt(empty, 0)])
        rows.append(["idempotency record, 1 KiB body", fmt(kib, 0)])
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
    if cfg.cluster:
        rows = []
        for primaries in (int(p) for p in cfg.cluster.split(",")):
            rate, per = cluster_scaling(primaries, cfg.workers, cfg.seconds)
            rows.append([str(primaries), fmt(rate, 0), fmt(per * 1e6, 1)])
        print()
        print(f"Cluster: {cfg.workers} client processes, {cfg.seconds:g} s a run, no replicas")
        print(table(["primaries", "pairs/s", "server CPU per pair, us"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
