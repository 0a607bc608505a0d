# generated from rwlock_async.py by tools/gen_sync.py; do not edit
"""``ReadWriteLock``: many readers or one writer of a name, across every process.

The protocol, scripts and arguments are in ``rwlock_base.py``; the driver is
``Lock``'s (the wait loop, give-back on interrupt or timeout, renewal,
the context manager), with the read-write scripts in place of the lock's.
Written once, for asyncio; ``tools/gen_sync.py`` makes the sync driver from
it (edit this source, never the generated file).
"""

from __future__ import annotations

from ..clients import RedisClient
from ..engine.keys import KeySpace
from .handle import clear_holders
from .lock import Lock
from .rwlock_base import (
    ACQUIRE,
    CANCEL,
    CLEAR,
    MODES,
    REFRESH,
    RELEASE,
    Mode,
    ReadWriteLockBase,
    check_mode,
)

__all__ = [
    "MODES",
    "ReadWriteLock",
    "Mode",
    "ReadWriteLockBase",
    "check_mode",
    "clear_rw_lock",
]


class ReadWriteLock(ReadWriteLockBase[RedisClient], Lock):
    """Many readers or one writer of ``name`` at once, across every process.

    ``ReadWriteLock(client, "catalogue", "read", ttl=30, wait=5)``. Waits
    are first come first served, except that readers arriving while a writer
    waits queue behind it. Everything else is ``Lock``'s: ``acquire``,
    ``release``, ``extend``, ``renew=True``, the context manager, one holder
    per handle. Make one handle per concurrent reader: handles are cheap.
    """

    _acquire_script = ACQUIRE
    _cancel_script = CANCEL
    _release_script = RELEASE
    _extend_script = REFRESH
    # The cancel script does not remember the token: a give-back after a call
    # that may still arrive waits for that call's late reply first.
    _give_back_after_late_reply = True

    def owned(self) -> bool:
        """Ask Redis whether this handle still holds its turn (one round trip)."""
        return self._in_sorted_set()


def clear_rw_lock(
    client: RedisClient, keyspace: KeySpace, name: str, token: str | None = None
) -> int:
    """Force-release one holder of ``name`` (or every one, when ``token`` is None).

    Waiters that may come next are admitted. Former holders find out at their
    next extend, renewal or release. Returns how many turns (including
    unclaimed reservations) were dropped.
    """
    return clear_holders(client, CLEAR, keyspace.rwlock(name), token)
