"""Whether this process runs on green threads (gevent or eventlet monkey patching).

Under monkey patching the renewal watchdog and the give-back worker are
greenlets: they run only when the code holding a lock yields to the hub (a
patched socket, ``time.sleep``). A CPU-bound stretch, or a database driver
that blocks the process, keeps them from running, and a renewed lease can run
out mid-call. docs/servers.rst says what holds under each server model.

Neither library is imported here: one that is not imported yet has patched
nothing.
"""

from __future__ import annotations

import sys

__all__ = ["RENEWAL_HINT", "green_runtime", "renewal_warning"]


def green_runtime() -> str | None:
    """``"gevent"`` or ``"eventlet"`` if it has monkey-patched ``threading``, else None."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        return "gevent"
    patcher = sys.modules.get("eventlet.patcher")
    # eventlet names the threading patch "thread".
    if patcher is not None and patcher.is_monkey_patched("thread"):
        return "eventlet"
    return None


# The system check (django_redislock.W004) and the log at the first renewal say this.
def renewal_warning(runtime: str) -> str:
    """What to tell a user who renews leases under ``runtime``."""
    return (
        f"Lease renewal runs on {runtime} green threads in this process (threading is "
        "monkey-patched): a renewal runs only while the code holding the lock yields to the "
        "hub. A CPU-bound stretch, or a database driver that blocks the process (psycopg2 "
        "without psycogreen, psycopg 3 under eventlet), longer than the lease lets the lease "
        "run out while the holder works, and another request take the lock."
    )


RENEWAL_HINT = (
    "Use a cooperative database driver, keep CPU-bound work out of locked code (or give "
    "the lock a TIMEOUT longer than it), and write under the lock with fencing tokens "
    "(fenced_update), which refuse a holder whose lease ran out. See 'Server models' in "
    "docs/servers.rst."
)
