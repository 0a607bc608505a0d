"""Many readers or one writer per name, with fair, writer-preferring admission:
the scripts, arguments and state of a read-write lock, for both drivers.

Protocol, one round trip each when uncontended (``lua/rw_*.lua``):

* acquire runs ``rw_acquire.lua``: it drops turns whose expiry (on the Redis
  server's clock) has passed, then admits the caller, or queues it if it will
  wait. A writer is admitted when nobody holds the name, a reader when no
  writer does; either only when nobody waits ahead of it. A writer gets a
  fencing token (the lock's kind: the server's microsecond clock, strictly
  increasing per name); a reader sees the last writer's.
* release runs ``rw_release.lua``: it removes the turn and serves the queue
  from its head: consecutive readers together, a writer alone. Each admitted
  waiter gets a short reservation and is woken through its process's channel;
  it runs acquire again and claims it. A writer at the head that cannot be
  admitted yet stops the readers behind it: a stream of readers never starves
  a waiting writer.

Readers and the writer are members of one sorted set, scored by expiry, so a
crashed holder's turn comes back by itself after its TTL, as a semaphore's
permit does; a woken waiter that died before claiming costs the grace period.

The drivers are ``Lock``'s (``lock_async.py``, and ``lock.py`` generated
from it): the same wait loop, give-back on interrupt or timeout, renewal and
context manager, with these scripts in place of the lock's
(``rwlock_async.py``, and ``rwlock.py`` generated from it). Each handle is
either a reader or a writer (``mode``), and holds one turn at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from ..engine.keys import KeySpace
from .base import (
    DEFAULT_DRIFT,
    DEFAULT_GRACE,
    DEFAULT_REPLICAS_TIMEOUT,
    STATE_KEEP_MS,
    ClientT,
    Observer,
)
from .holders_base import HoldersBase, holder_scripts

__all__ = [
    "ACQUIRE",
    "CANCEL",
    "CLEAR",
    "MODES",
    "REFRESH",
    "RELEASE",
    "Mode",
    "ReadWriteLockBase",
    "check_mode",
]

Mode = Literal["read", "write"]
MODES: tuple[str, ...] = ("read", "write")


ACQUIRE, RELEASE, REFRESH, CANCEL, CLEAR = holder_scripts("rwlock", "rw")


def check_mode(mode: object) -> Mode:
    """Validate a read-write lock mode, with an error that names the fix."""
    if mode == "read":
        return "read"
    if mode == "write":
        return "write"
    raise ValueError(f"mode must be 'read' or 'write', not {mode!r}")


class ReadWriteLockBase(HoldersBase[ClientT]):
    """Arguments and state of one read-write lock handle; drivers do the I/O.

    ``fence`` is the writer's fencing token, and None for a reader (readers
    share the name: no order among them for a fence to express).
    ``write_fence`` is the fence of the last writer admitted to the name, as
    Redis knew it when this handle was admitted (for a writer: its own), or
    None when none is known (no writer for longer than the state is kept).
    """

    kind = "rwlock"

    def __init__(
        self,
        client: ClientT,
        name: str,
        mode: Mode = "write",
        *,
        ttl: float = 30.0,
        wait: float = 10.0,
        keyspace: KeySpace | None = None,
        label: str = "",
        renew: bool = False,
        renew_max: float | None = None,
        on_lost: Callable[[Any], None] | None = None,
        observer: Observer | None = None,
        drift_factor: float = DEFAULT_DRIFT,
        # How long a woken waiter has to claim its turn before the next goes.
        grace: float = DEFAULT_GRACE,
        replicas: int = 0,
        replicas_timeout: float = DEFAULT_REPLICAS_TIMEOUT,
    ) -> None:
        self.mode: Mode = check_mode(mode)
        super().__init__(
            client,
            name,
            ttl=ttl,
            wait=wait,
            keyspace=keyspace,
            label=label,
            renew=renew,
            renew_max=renew_max,
            on_lost=on_lost,
            observer=observer,
            drift_factor=drift_factor,
            grace=grace,
            replicas=replicas,
            replicas_timeout=replicas_timeout,
        )
        self.keys = self.keyspace.rwlock(name)
        self.write_fence: int | None = None
        self._reply_serial: int | None = None
        self._mode_code = b"r" if self.mode == "read" else b"w"

    def __repr__(self) -> str:
        state = "held" if self.token else "free"
        return f"<{type(self).__name__} {self.name!r} {self.mode} {state} fence={self.fence}>"

    def _acquire_reply(self, reply: Any) -> tuple[int, int]:
        # rw_acquire.lua answers {1, fence, serial} or {0, ms}. The serial
        # (a writer's is its fence) waits here for _granted.
        if int(reply[0]) == 1:
            self._reply_serial = int(reply[2])
        return int(reply[0]), int(reply[1])

    def _kind_arg(self) -> bytes:
        return self._mode_code

    def _label(self) -> str:
        return f"{self.mode} lock {self.name!r}"

    def _release_args(self, token: str) -> tuple:
        serial = "" if self._serial is None else self._serial
        return (token, self._grace_ms, STATE_KEEP_MS, serial)

    def _cancel_args(self, token: str) -> tuple:
        return (token, self._grace_ms)

    def _granted(self, token: str, fence: int, sent: float, ttl_ms: int) -> None:
        super()._granted(token, fence, sent, ttl_ms)
        self.write_fence = int(fence) or None
        # From the acquire's reply; a lease adopted has none: a writer's
        # serial is its fence, a reader's is unknown.
        serial, self._reply_serial = self._reply_serial, None
        if serial is not None:
            self._serial = serial or None
        if self.mode == "read":
            self.fence = None
            if serial is None:
                self._serial = None
