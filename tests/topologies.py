"""Private Redis Sentinel and Redis Cluster deployments for the test suite.

Everything is started from the suite's server binary (``redis_binary()`` in
servers.py: ``REDISLOCK_SERVER_BIN`` or ``redis-server``; it runs as a sentinel
with ``--sentinel``, as ``valkey-server`` does too) on free loopback ports,
waited for with a bound, and stopped by the PIDs we started. Nothing here
touches the machine's own Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import redis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import ClusterNode, RedisCluster

from django_redislock.core import KeySpace
from tests.drive import Drive
from tests.servers import RedisServer, cli_binary, redis_binary

SERVICE = "mymaster"
# A replica (re)syncs at once instead of after the default 5 s batching delay.
_FAST_SYNC = ("--repl-diskless-sync-delay", "0")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int, *, bus: bool = False) -> list[int]:
    """``count`` free loopback ports; with ``bus``, port + 10000 is free too.

    A Cluster node also listens on its port + 10000 (the cluster bus), so
    those ports are drawn below 55536 and checked in pairs.
    """
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port in ports:
            continue
        if bus and (port > 55535 or not _port_free(port + 10000)):
            continue
        ports.append(port)
    return ports


def wait_until(what: str, check: Callable[[], bool], timeout: float) -> None:
    """Poll ``check`` until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(redis.RedisError, OSError):
            if check():
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


class SentinelProcess(RedisServer):
    """``<server binary> <conf> --sentinel``: sentinels rewrite their config file."""

    def __init__(self, port: int, primary_port: int, directory: Path) -> None:
        super().__init__(port=port, unix=False, directory=str(directory))
        self.conf = self.dir / "sentinel.conf"
        self.conf.write_text(
            "\n".join(
                [
                    f"port {port}",
                    "bind 127.0.0.1",
                    f"dir {self.dir}",
                    f"logfile {self.dir / 'redis.log'}",
                    "loglevel warning",
                    f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2",
                    # Short, so a forced failover finishes within a test's patience.
                    f"sentinel down-after-milliseconds {SERVICE} 1000",
                    f"sentinel failover-timeout {SERVICE} 4000",
                    f"sentinel parallel-syncs {SERVICE} 1",
                    "",
                ]
            )
        )

    def args(self) -> list[str]:
        return [redis_binary(), str(self.conf), "--sentinel"]


class SentinelTopology:
    """A primary, one replica and three sentinels (quorum 2)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="redislock-sentinel-"))
        ports = free_ports(5)
        self.servers = [
            RedisServer(port=ports[0], unix=False, directory=str(self._sub("a")), extra=_FAST_SYNC),
            RedisServer(
                port=ports[1],
                unix=False,
                directory=str(self._sub("b")),
                extra=(*_FAST_SYNC, "--replicaof", "127.0.0.1", str(ports[0])),
            ),
        ]
        self.sentinels = [
            SentinelProcess(port, ports[0], self._sub(f"s{i}")) for i, port in enumerate(ports[2:])
        ]

    def _sub(self, name: str) -> Path:
        path = self.root / name
        path.mkdir()
        return path

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", s.port or 0) for s in self.sentinels]

    def start(self) -> SentinelTopology:
        try:
            for server in self.servers:
                server.start()
            self.wait_replicated()
            for sentinel in self.sentinels:
                sentinel.start()
            # Every sentinel must know the replica and its peers before a
            # failover can be forced.
            wait_until("sentinels to discover the topology", self._sentinels_ready, 30)
        except BaseException:
            self.stop()
            raise
        return self

    def _sentinels_ready(self) -> bool:
        for sentinel in self.sentinels:
            with sentinel.client(socket_timeout=1) as c:
                if not c.execute_command("SENTINEL", "REPLICAS", SERVICE):
                    return False
                if len(c.execute_command("SENTINEL", "SENTINELS", SERVICE)) < 2:
                    return False
        return True

    def primary_address(self) -> tuple[str, int]:
        with self.sentinels[0].client(socket_timeout=1) as c:
            host, port = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        return (host.decode() if isinstance(host, bytes) else host), int(port)

    def server_at(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def primary(self) -> RedisServer:
        return self.server_at(self.primary_address()[1])

    def replica(self) -> RedisServer:
        primary = self.primary()
        return next(s for s in self.servers if s is not primary)

    def wait_replicated(self, timeout: float = 20) -> None:
        """Wait until the replica of the current primary is linked and in sync."""

        def linked() -> bool:
            with (
                self.servers[0].client(socket_timeout=1) as a,
                self.servers[1].client(socket_timeout=1) as b,
            ):
                for c in (a, b):
                    info = c.info("replication")
                    if info["role"] == "slave" and info.get("master_link_status") != "up":
                        return False
                roles = {a.info("replication")["role"], b.info("replication")["role"]}
                return roles == {"master", "slave"}

        wait_until("the replica to be in sync", linked, timeout)

    def wait_settled(self, timeout: float = 60) -> None:
        """Wait until the replica is in sync and every sentinel sees it as a
        healthy replica of the primary they all name (after a failover, the
        old primary is made a replica only some seconds later)."""
        self.wait_replicated(timeout)

        def settled() -> bool:
            ports = set()
            for sentinel in self.sentinels:
                with sentinel.client(socket_timeout=1) as c:
                    ports.add(
                        int(c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)[1])
                    )
                    replicas = c.execute_command("SENTINEL", "REPLICAS", SERVICE)
                healthy = [
                    r
                    for r in (r if isinstance(r, dict) else _pairs(r) for r in replicas)
                    if r[b"flags"] == b"slave" and r[b"master-link-status"] == b"ok"
                ]
                if len(healthy) != 1:
                    return False
            return len(ports) == 1

        wait_until("every sentinel to see a healthy replica", settled, timeout)

    def failover(self, timeout: float = 30) -> tuple[str, int]:
        """Force a failover through the sentinels and wait for the new primary."""
        old = self.primary_address()
        with self.sentinels[0].client(socket_timeout=5) as c:
            c.execute_command("SENTINEL", "FAILOVER", SERVICE)
        self.wait_new_primary(old, timeout)
        return self.primary_address()

    def wait_new_primary(self, old: tuple[str, int], timeout: float = 30) -> None:
        def moved() -> bool:
            for sentinel in self.sentinels:
                with sentinel.client(socket_timeout=1) as c:
                    host, port = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
                if int(port) == old[1]:
                    return False
            with self.server_at(self.primary_address()[1]).client(socket_timeout=1) as c:
                return c.info("replication")["role"] == "master"

        wait_until("sentinels to agree on a new primary", moved, timeout)

    def stop(self) -> None:
        for process in [*self.sentinels, *self.servers]:
            with contextlib.suppress(Exception):
                process.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def _pairs(flat: list[Any]) -> dict[Any, Any]:
    """A map of a flat list of names and values (RESP2's form of one)."""
    return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}


class ClusterTopology:
    """``primaries`` primaries with ``replicas`` replicas each, slots spread evenly.

    ``extra(i)`` is added to the command line of the i-th node. The first
    ``primaries`` nodes are the primaries; node ``primaries + k`` replicates
    node ``k % primaries`` (a shard is nodes ``i``, ``i + primaries``, ...), so
    a test can give one shard's nodes settings of their own.
    """

    def __init__(
        self,
        primaries: int = 3,
        replicas: int = 0,
        *,
        extra: Callable[[int], tuple[str, ...]] = lambda i: (),
    ) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="redislock-cluster-"))
        self.primaries = primaries
        self.replicas = replicas
        self._extra = extra
        self.nodes: list[RedisServer] = []
        self._place()

    def _place(self) -> None:
        """Nodes on free ports (their buses on port + 10000 free too), not started."""
        ports = free_ports(self.primaries * (1 + self.replicas), bus=True)
        self.nodes = []
        for i, port in enumerate(ports):
            directory = self.root / str(port)
            directory.mkdir()
            self.nodes.append(
                RedisServer(
                    port=port,
                    unix=False,
                    directory=str(directory),
                    extra=(
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        str(directory / "nodes.conf"),
                        "--cluster-node-timeout",
                        "2000",
                        *_FAST_SYNC,
                        *self._extra(i),
                    ),
                )
            )

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", n.port or 0) for n in self.nodes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    def start(self) -> ClusterTopology:
        """Start the nodes and join them; once more on new ports if they did not join.

        The ports are free when drawn, not reserved: another process may bind
        one (or its bus port) before the node does, and a loaded host has
        been seen to leave ``--cluster create`` waiting for the join. Setting
        the Cluster up is not what any test here tests.
        """
        for attempt in (1, 2):
            try:
                self._start_once()
            except BaseException as exc:
                for node in self.nodes:
                    with contextlib.suppress(Exception):
                        node.stop()
                if attempt == 2 or not isinstance(exc, Exception):
                    shutil.rmtree(self.root, ignore_errors=True)
                    raise
                self._place()
            else:
                return self
        raise AssertionError("unreachable")

    def _start_once(self) -> None:
        for node in self.nodes:
            node.start()
        create = [
            cli_binary(),
            "--cluster",
            "create",
            *(f"127.0.0.1:{n.port}" for n in self.nodes[: self.primaries]),
            "--cluster-replicas",
            "0",
            "--cluster-yes",
        ]
        try:
            subprocess.run(create, check=True, capture_output=True, timeout=45)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            output = b"".join(o for o in (exc.stdout, exc.stderr) if isinstance(o, bytes))
            raise RuntimeError(
                f"{' '.join(create)} failed ({exc}); it said: "
                f"{output.decode(errors='replace')[-2000:]}"
            ) from exc
        for k, replica in enumerate(self.nodes[self.primaries :]):
            self._replicate(replica, self.nodes[k % self.primaries])
        wait_until("the cluster to be ok on every node", self._all_ok, 30)

    def _replicate(self, replica: RedisServer, primary: RedisServer) -> None:
        """Join ``replica`` to the Cluster as a replica of ``primary``."""
        with primary.client(socket_timeout=5) as p, replica.client(socket_timeout=5) as r:
            primary_id = p.execute_command("CLUSTER", "MYID")
            primary_id = primary_id.decode() if isinstance(primary_id, bytes) else primary_id
            r.execute_command("CLUSTER", "MEET", "127.0.0.1", primary.port)

            def knows_primary() -> bool:
                nodes = r.execute_command("CLUSTER", "NODES")
                text = nodes.decode() if isinstance(nodes, bytes) else str(nodes)
                return any(
                    line.startswith(primary_id) and " master " in f" {line} "
                    for line in text.splitlines()
                )

            wait_until("the new node to learn its primary", knows_primary, 30)
            r.execute_command("CLUSTER", "REPLICATE", primary_id)

    def _all_ok(self) -> bool:
        for node in self.live():
            with node.client(socket_timeout=1) as c:
                info = c.execute_command("CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                if "cluster_state:ok" not in text:
                    return False
                if f"cluster_known_nodes:{len(self.nodes)}" not in text:
                    return False
            if self.replicas:
                with node.client(socket_timeout=1) as c:
                    repl = c.info("replication")
                    if repl["role"] == "slave" and repl.get("master_link_status") != "up":
                        return False
        return True

    def replica_of(self, primary_port: int) -> RedisServer:
        for node in self.live():
            with node.client(socket_timeout=1) as c:
                if c.info("replication").get("master_port") == primary_port:
                    return node
        raise LookupError(f"no replica of port {primary_port}")

    def failover(self, replica: RedisServer, timeout: float = 30) -> None:
        """Promote ``replica`` by CLUSTER FAILOVER, retried; FORCE as a last resort.

        A coordinated failover gives up quietly when the replica was not in
        step with its primary in time (just after a pause, say).
        """

        def linked() -> bool:
            with replica.client(socket_timeout=1) as c:
                return bool(c.info("replication").get("master_link_status") == "up")

        def promoted() -> bool:
            with replica.client(socket_timeout=1) as c:
                return bool(c.info("replication")["role"] == "master")

        wait_until("the replica to be linked", linked, timeout)
        deadline = time.monotonic() + timeout
        for attempt in ("", "", "FORCE"):
            with replica.client(socket_timeout=5) as c:
                c.execute_command("CLUSTER", "FAILOVER", *([attempt] if attempt else []))
            try:
                patience = max(1.0, min(10.0, deadline - time.monotonic()))
                wait_until("the replica to take over", promoted, patience)
                break
            except RuntimeError:
                if attempt == "FORCE":
                    raise
        wait_until("the cluster to be ok on every node", self._all_ok, timeout)

    def node_at(self, port: int) -> RedisServer:
        return next(n for n in self.nodes if n.port == port)

    def live(self) -> list[RedisServer]:
        """The nodes that run and are not paused (``paused`` is a test's own note)."""
        return [n for n in self.nodes if n.proc is not None and n not in self.paused]

    paused: tuple[RedisServer, ...] = ()

    def primary_for(self, key: bytes) -> RedisServer:
        """The node that serves ``key``'s slot now, as the live nodes agree."""

        def owner() -> RedisServer | None:
            found = set()
            for node in self.live():
                with node.client(socket_timeout=1) as c:
                    slot = int(c.execute_command("CLUSTER", "KEYSLOT", key))
                    for start, end, primary, *_ in c.execute_command("CLUSTER", "SLOTS"):
                        if start <= slot <= end:
                            found.add(int(primary[1]))
            return self.node_at(found.pop()) if len(found) == 1 else None

        wait_until("the nodes to agree on a slot's primary", owner, 30)
        result = owner()
        assert result is not None
        return result

    def role(self, node: RedisServer) -> str:
        with node.client(socket_timeout=1) as c:
            return str(c.info("replication")["role"])

    def promote_by_failure(self, primary: RedisServer, *, kill: bool, timeout: float = 30) -> None:
        """Fail ``primary`` (SIGKILL, or SIGSTOP until its replica took over and
        SIGCONT then) and wait until its replica is the slot's primary and every
        running node says the Cluster is ok. A killed node stays down: ``revive``."""
        replica = self.replica_of(int(primary.port or 0))
        if kill:
            primary.kill()
            primary.proc = None
        else:
            primary.pause()
            self.paused = (primary,)
        try:
            wait_until("the replica to take over", lambda: self.role(replica) == "master", timeout)
        finally:
            if not kill:
                primary.resume()
                self.paused = ()
        wait_until("the cluster to be ok on every running node", self._all_ok, timeout)

    def revive(self, node: RedisServer, timeout: float = 30) -> None:
        """Start a killed node again: it rejoins as a replica of the node that replaced it."""
        node.start()
        wait_until("the cluster to be ok on every node", self._all_ok, timeout)

    def cluster_state(self, node: RedisServer) -> str:
        with node.client(socket_timeout=1) as c:
            info = c.execute_command("CLUSTER", "INFO")
        text = info.decode() if isinstance(info, bytes) else str(info)
        return text.split("cluster_state:", 1)[1].split()[0]

    def stop(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def names_on_every_node(
    client: RedisCluster, stem: str = "job", kind: str = "lock", count: int = 3
) -> list[str]:
    """Names ``stem:0``, ``stem:1``... whose keys of ``kind`` (``lock``, ``rwlock``)
    fall on ``count`` different primaries."""
    keys = getattr(KeySpace("redislock"), kind)
    found: dict[str, str] = {}
    i = 0
    while len(found) < count:
        name = f"{stem}:{i}"
        found.setdefault(client.get_node_from_key(keys(name).lease).name, name)
        i += 1
    return list(found.values())


def cluster_client(topology: ClusterTopology, **options: Any) -> RedisCluster:
    """A client of ``topology`` with the bounded timeouts the library expects.

    Every node is a startup node: a test may have killed any of them.
    """
    options = {"socket_timeout": 5, "socket_connect_timeout": 2, **options}
    nodes = [ClusterNode("127.0.0.1", n.port or 0) for n in topology.nodes]
    return RedisCluster(startup_nodes=nodes, **options)


def async_cluster_client(topology: ClusterTopology, **options: Any) -> AsyncRedisCluster:
    """``cluster_client`` for asyncio."""
    options = {"socket_timeout": 5, "socket_connect_timeout": 2, **options}
    nodes = [AsyncClusterNode("127.0.0.1", n.port or 0) for n in topology.nodes]
    return AsyncRedisCluster(startup_nodes=nodes, **options)


async def close_async_cluster(client: AsyncRedisCluster) -> None:
    """Close an asyncio Cluster client once this loop's work on it has ended.

    A give-back still running (a waiter cut short while a node was frozen
    gives its queue entry back once the node's breaker lets it) is given a
    bounded while to finish; the notifier's reader tasks are cancelled and
    awaited, each closing its node's client as it ends. Closing the client
    first would let a late give-back open a connection to a client already
    closed, left open when the loop ends (a ResourceWarning in whichever test
    runs next); and so would a node that a refresh of the slot map replaced,
    closed by redis-py in a task of its own."""
    me = asyncio.current_task()

    def ours(*prefixes: str) -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks() if t is not me and t.get_name().startswith(prefixes)]

    givebacks = ours("redislock-giveback")
    if givebacks:
        await asyncio.wait(givebacks, timeout=10)
    background = ours("redislock-notify", "redislock-giveback")
    for task in background:
        task.cancel()
    if background:
        await asyncio.wait(background, timeout=10)
    await client.aclose()
    # redis-py closes the nodes a slot-map refresh replaced in tasks of their
    # own (5.0: ``NodesManager.set_nodes``), which the loop's end would cancel
    # before they ran: let them finish.
    rest = [t for t in asyncio.all_tasks() if t is not me]
    if rest:
        await asyncio.wait(rest, timeout=10)


@contextlib.asynccontextmanager
async def cluster_drive(driver: str, topology: ClusterTopology) -> AsyncIterator[Drive]:
    """``drive`` (tests/drive.py) on ``topology``, every primary flushed first."""
    look = cluster_client(topology)
    look.flushall(target_nodes=RedisCluster.PRIMARIES)
    try:
        if driver == "sync":
            yield Drive("sync", look, look)
            return
        client = AsyncRedisCluster(
            host="127.0.0.1",
            port=topology.nodes[0].port or 0,
            socket_timeout=5,
            socket_connect_timeout=2,
        )
        try:
            yield Drive("asyncio", client, look)
        finally:
            await close_async_cluster(client)
    finally:
        look.close()
