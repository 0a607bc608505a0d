"""A TCP proxy on loopback that misbehaves on request, between a client and Redis.

Faults are attributes switched at run time from the test thread; every
connection thread reads them for each chunk, so a change applies to open
connections as well as new ones:

* ``latency``: seconds added before each chunk is forwarded (``direction``
  limits it to requests or replies);
* ``blackhole``: accept connections and read from them, forward nothing;
* ``drop_replies``: forward requests, swallow replies (``True`` for all of
  them, an ``int`` for that many reply chunks);
* ``split``: forward in chunks of this many bytes, so frames arrive in pieces;
* ``reset()``: abort every open connection with a TCP RST; ``refuse`` does the
  same to new connections as they arrive.

Every blocking call in the proxy is bounded, and ``close()`` stops every thread
it started, so a test never leaves it behind.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Literal

__all__ = ["FaultProxy"]

Direction = Literal["both", "request", "reply"]
_TICK = 0.05  # how often an idle connection thread looks at the stop flag
_SWITCHES = ("latency", "direction", "blackhole", "drop_replies", "split", "refuse")


def _abort(sock: socket.socket) -> None:
    """Close with RST rather than FIN: the peer sees 'connection reset'."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class _Pair:
    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.closed = threading.Event()

    def close(self, *, rst: bool = False) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.server):
            if rst:
                _abort(sock)
            else:
                with contextlib.suppress(OSError):
                    sock.close()


class FaultProxy:
    """``FaultProxy(("127.0.0.1", port))`` or ``FaultProxy("/path/redis.sock")``."""

    def __init__(self, upstream: tuple[str, int] | str) -> None:
        self.upstream = upstream
        self.latency = 0.0
        self.direction: Direction = "both"
        self.blackhole = False
        self.drop_replies: bool | int = False
        self.split = 0
        self.refuse = False
        self.connections_seen = 0
        # Chunks forwarded towards Redis: lets a test wait until a request is on its way.
        self.requests_forwarded = 0
        self._mutex = threading.Lock()
        self._pairs: list[_Pair] = []
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(_TICK)
        self.port = int(self._listener.getsockname()[1])
        self._spawn(self._accept_loop)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    # -- switches -------------------------------------------------------------
    def heal(self) -> None:
        """Back to a faithful proxy (open connections stay open)."""
        self.latency = 0.0
        self.direction = "both"
        self.blackhole = False
        self.drop_replies = False
        self.split = 0
        self.refuse = False

    def reset(self) -> int:
        """Abort every open connection with RST; returns how many there were."""
        with self._mutex:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.close(rst=True)
        return len(pairs)

    @contextlib.contextmanager
    def fault(self, **switches: object) -> Iterator[FaultProxy]:
        """``with proxy.fault(blackhole=True): ...`` then heal."""
        for name, value in switches.items():
            if name not in _SWITCHES:
                raise AttributeError(f"no such fault switch: {name}; use one of {_SWITCHES}")
            setattr(self, name, value)
        try:
            yield self
        finally:
            self.heal()

    # -- machinery ------------------------------------------------------------
    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name="fault-proxy")  # type: ignore[arg-type]
        with self._mutex:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _connect_upstream(self) -> socket.socket:
        if isinstance(self.upstream, str):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        else:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(2.0)
        try:
            sock.connect(self.upstream)
        except OSError:
            sock.close()  # the upstream is down: this socket never connected
            raise
        return sock

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections_seen += 1
            if self.refuse:
                _abort(client)
                continue
            try:
                server = self._connect_upstream()
            except OSError:
                _abort(client)
                continue
            for sock in (client, server):
                if sock.family == socket.AF_INET:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = _Pair(client, server)
            with self._mutex:
                self._pairs.append(pair)
            self._spawn(self._pump, pair, client, server, "request")
            self._spawn(self._pump, pair, server, client, "reply")

    def _applies(self, direction: str) -> bool:
        return self.direction in ("both", direction)

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket, direction: str) -> None:
        try:
            # Inside the try: the pair may have been reset before this thread ran.
            src.settimeout(_TICK)
            while not pair.closed.is_set() and not self._stop.is_set():
                try:
                    data = src.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    break
                if self.blackhole:
                    continue
                if direction == "reply" and self.drop_replies:
                    if not isinstance(self.drop_replies, bool):
                        self.drop_replies -= 1
                    continue
                # A delay is bounded by the stop flag, so close() never waits it out.
                delay = self.latency if self._applies(direction) else 0.0
                if delay and (self._stop.wait(delay) or pair.closed.is_set()):
                    break
                step = self.split
                if step:
                    # TCP_NODELAY is on: each piece leaves as its own segment.
                    for i in range(0, len(data), step):
                        dst.sendall(data[i : i + step])
                else:
                    dst.sendall(data)
                if direction == "request":
                    self.requests_forwarded += 1
        except OSError:
            pass
        finally:
            pair.close()
            with self._mutex, contextlib.suppress(ValueError):
                self._pairs.remove(pair)

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self.reset()
        with self._mutex:
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(2.0)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
