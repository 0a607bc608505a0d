"""What the kinds whose holders are members of a sorted set scored by expiry
share (a semaphore's permits, a read-write lock's turns): their scripts'
arguments, for both drivers."""

from __future__ import annotations

from ..engine import scripts
from .base import STATE_KEEP_MS, ClientT, LockBase

__all__ = ["HoldersBase", "holder_scripts"]


def holder_scripts(
    prelude: str, prefix: str
) -> tuple[scripts.Script, scripts.Script, scripts.Script, scripts.Script, scripts.Script]:
    """(acquire, release, refresh, cancel, clear) of a kind whose holders are
    members of a sorted set scored by expiry: ``<prefix>_acquire.lua`` and
    its siblings on the kind's ``prelude``; refresh and clear are shared."""
    return (
        scripts.load(f"{prefix}_acquire", prelude=prelude),
        scripts.load(f"{prefix}_release", prelude=prelude, repeatable=True),
        scripts.HOLDERS_REFRESH,
        scripts.load(f"{prefix}_cancel", prelude=prelude, repeatable=True),
        scripts.load("holders_clear", prelude=prelude),
    )


class HoldersBase(LockBase[ClientT]):
    """Arguments of the scripts of a kind whose holders share a sorted set."""

    def _kind_arg(self) -> int | bytes:
        """The acquire script's last argument: a semaphore's limit, a read-write
        lock's mode."""
        raise NotImplementedError

    def _args_acquire(
        self, token: str, ttl_ms: int, who: str, wait_ms: int, address: bytes
    ) -> tuple:
        return (
            token,
            ttl_ms,
            self._name_b,
            self._owner(who),
            wait_ms,
            address,
            self._grace_ms,
            STATE_KEEP_MS,
            self._kind_arg(),
        )

    def _extend_args(self, token: str, ttl_ms: int) -> tuple:
        return (token, ttl_ms, STATE_KEEP_MS)
