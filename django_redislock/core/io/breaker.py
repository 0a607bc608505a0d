"""Fail fast while a Redis does not answer: one breaker per connection pool, per process.

A frozen Redis (paused, swapping, a network that drops packets) makes every
call wait its whole socket timeout. Each waiting call holds a worker thread
(or an event loop's attention) for that long, so a few seconds of stall take
down every page of the site, locked or not. After one call to a pool times
out, its breaker **opens**: for ``window`` seconds every call to that pool
fails at once with ``BreakerOpen`` (``RedisUnavailable``, reason
``breaker_open``, to the caller), so locks answer 503 and throttles fail open
in microseconds. Once the window has passed, the next call is let through as
the **probe** (the others keep failing fast while it is out): an answer of any
kind closes the breaker, another timeout opens it for another window. A
Redis that answers again is thus noticed within one window of its return, or
at once when the probe is already on its way.

What counts:

* only a timeout (of the socket, or of the connect) opens a breaker: a
  refused connection or an error reply fails fast by itself;
* any call that gets its replies (error replies included), or that fails
  without a timeout, closes it: Redis answered, or at least did not make the
  caller wait;
* a probe cut short by anything else (a cancelled task, a signal's
  ``KeyboardInterrupt``) is abandoned: the next caller probes;
* calls made off the callers' path (``off_path``: the background thread's
  renewals and give-backs, asyncio's renewal and give-back tasks) are never
  refused, since they hold no request: a renewal must not take a refusal in
  a millisecond for a verdict on Redis and then probe at the end of its
  lease, and a give-back must not leave a name blocked a window longer.
  Their outcomes count as any call's: one that times out keeps the breaker
  open, one that gets an answer closes it (often before any caller probes).

The state machine is written once, with no I/O and no awaits, and is shared by
threads and asyncio tasks (its mutex is held for a few instructions, never
across a call). A closed breaker costs a caller one attribute read.
``window`` is read from ``set_window``'s source at each opening (the Django
layer sets ``REDISLOCK['BREAKER_WINDOW']``); 0 turns the breakers off.

Waiters sleeping on a wake-up channel are woken when their Redis's breaker
opens (``on_open``): their next attempt fails fast, so a queued waiter does
not sleep out its whole wait against a Redis that is not answering.
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = [
    "DEFAULT_WINDOW",
    "MAX_WINDOW",
    "Breaker",
    "BreakerOpen",
    "breaker_of",
    "node_breaker",
    "node_breakers",
    "off_path",
    "on_open",
    "set_window",
    "window",
]

logger = logging.getLogger("django_redislock.breaker")

# Seconds a breaker stays open after a timeout before one call probes. Short:
# a Redis that answers again is noticed within it, and a one-off slow call
# costs at most this many seconds of refusals.
DEFAULT_WINDOW = 1.0
# A longer window would refuse calls for that long after a single slow one.
MAX_WINDOW = 60.0
# A probe not heard of for this long (its caller vanished without a word,
# which the ``finally`` of every call path rules out) lets another caller probe.
_PROBE_STALE = 30.0

_window_source: Callable[[], float] | float = DEFAULT_WINDOW

# True in a thread or task that makes calls for no caller (see the docstring).
_off_path: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "redislock_off_path", default=False
)


def set_window(source: Callable[[], float] | float) -> Callable[[], float] | float:
    """Seconds a breaker stays open, or a callable read at each opening; 0: off.
    Returns the previous source."""
    global _window_source
    previous, _window_source = _window_source, source
    return previous


def off_path() -> None:
    """Mark the running thread (or asyncio task) as making calls for no
    caller: its calls are never refused (the module's docstring says why)."""
    _off_path.set(True)


def window() -> float:
    source = _window_source
    try:
        value = float(source() if callable(source) else source)
    except Exception:  # a bad setting (the system check says which): the default
        return DEFAULT_WINDOW
    return min(max(value, 0.0), MAX_WINDOW) if value == value else DEFAULT_WINDOW


class BreakerOpen(RedisError):
    """A call not sent: its Redis timed out lately and its breaker is open.

    ``remaining``: seconds until a call may probe again (0: a probe is out);
    ``since``: seconds since the breaker opened; ``address`` where known.
    Not a connection error: nothing is known to be wrong with the connection,
    and on a Cluster it must not have the slot map read again.
    """

    def __init__(self, address: str | None, remaining: float, since: float) -> None:
        self.address = address
        self.remaining = remaining
        self.since = since
        if remaining > 0:
            when = f"for {remaining:.1f}s more, then one call tries it again"
        else:
            when = "until the call trying it now gets an answer"
        super().__init__(
            f"the circuit breaker is open after a timeout {since:.1f}s ago: calls fail fast {when}"
        )


def _is_timeout(exc: BaseException | None) -> bool:
    # asyncio's TimeoutError is the builtin one from Python 3.11; before, it
    # is asyncio.TimeoutError, which the name check below also finds.
    return isinstance(exc, (RedisTimeoutError, TimeoutError)) or (
        exc is not None and type(exc).__name__ == "TimeoutError"
    )


class Breaker:
    """The breaker of one pool (or one Cluster node): closed, open, or probing."""

    def __init__(self, address: str | None) -> None:
        self.address = address
        # Read without the mutex on every call: True from the opening to the
        # close. Only written under the mutex.
        self.open = False
        self._mutex = threading.Lock()
        self._until = 0.0  # monotonic: when a call may probe
        self._opened_at = 0.0
        self._probe_since: float | None = None
        self._refused = 0  # calls failed fast since the opening

    def admit(self) -> bool:
        """Before a call: False (closed: go ahead), True (go ahead as the
        probe), or ``BreakerOpen`` raised (fail fast)."""
        if not self.open or _off_path.get():
            return False
        now = time.monotonic()
        with self._mutex:
            if not self.open:
                return False
            probing = self._probe_since is not None and now - self._probe_since < _PROBE_STALE
            if probing or now < self._until:
                self._refused += 1
                raise BreakerOpen(
                    self.address, 0.0 if probing else self._until - now, now - self._opened_at
                )
            self._probe_since = now
            return True

    def refusing(self) -> bool:
        """Whether ``admit`` would refuse a call now; nothing changes."""
        if not self.open or _off_path.get():
            return False
        now = time.monotonic()
        with self._mutex:
            probing = self._probe_since is not None and now - self._probe_since < _PROBE_STALE
            return self.open and (probing or now < self._until)

    def answered(self, probe: bool) -> None:
        """The call got its replies: Redis answers."""
        if self.open or probe:
            self._close("answered")

    def failed(self, cause: BaseException, probe: bool) -> None:
        """The call failed with ``cause``: a timeout opens the breaker."""
        if _is_timeout(cause):
            self._trip(probe)
        elif not isinstance(cause, BreakerOpen) and (self.open or probe):
            # It failed, but fast (refused, reset): no reason to refuse calls.
            self._close(f"failed without a timeout ({cause})")

    def abandoned(self, probe: bool) -> None:
        """The call was cut short by its caller (cancelled, interrupted)."""
        if probe:
            with self._mutex:
                self._probe_since = None

    def _trip(self, probe: bool) -> None:
        seconds = window()
        if seconds <= 0:
            return
        now = time.monotonic()
        with self._mutex:
            was_open = self.open
            if not was_open:
                self._opened_at = now
                self._refused = 0
            self._until = max(self._until, now + seconds) if was_open else now + seconds
            if probe:
                self._probe_since = None
            self.open = True
        if not was_open:
            logger.warning(
                "Redis at %s did not answer in time: calls to it fail fast for %.1fs, "
                "then one call tries it again (circuit breaker open)",
                self.address or "?",
                seconds,
                extra={"address": self.address, "window_seconds": seconds},
            )
            for ref in list(_listeners):
                listener = ref()
                if listener is None:
                    continue
                try:
                    listener(self)
                except Exception:
                    logger.exception("a listener of the circuit breaker failed")
        elif probe:
            logger.debug(
                "Redis at %s still does not answer: calls fail fast for another %.1fs",
                self.address or "?",
                seconds,
            )

    def _close(self, how: str) -> None:
        with self._mutex:
            if not self.open:
                self._probe_since = None
                return
            self.open = False
            self._probe_since = None
            opened_for = time.monotonic() - self._opened_at
            refused = self._refused
        logger.warning(
            "Redis at %s %s after %.1fs: calls go through again; %d failed fast meanwhile "
            "(circuit breaker closed)",
            self.address or "?",
            how,
            opened_for,
            refused,
            extra={
                "address": self.address,
                "open_seconds": round(opened_for, 3),
                "refused": refused,
            },
        )


# -- one breaker per pool ----------------------------------------------------------------
_breakers: weakref.WeakKeyDictionary[Any, Breaker] = weakref.WeakKeyDictionary()
_node_breakers: weakref.WeakKeyDictionary[Any, dict[str, Breaker]] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()
# Bound methods, held weakly: a notifier that goes away stops listening.
_listeners: list[weakref.WeakMethod[Callable[[Breaker], None]]] = []


def _address(kwargs: Any) -> str | None:
    if not isinstance(kwargs, dict):
        return None
    if kwargs.get("path"):
        return str(kwargs["path"])
    host, port = kwargs.get("host"), kwargs.get("port")
    return None if host is None else (f"{host}:{port}" if port is not None else str(host))


def breaker_of(pool: Any) -> Breaker:
    """The breaker of a connection pool (sync or asyncio), made on first use."""
    found = _breakers.get(pool)
    if found is None:
        with _registry_lock:
            found = _breakers.get(pool)
            if found is None:
                found = _breakers[pool] = Breaker(
                    _address(getattr(pool, "connection_kwargs", None))
                )
    return found


def node_breaker(client: Any, node: Any) -> Breaker:
    """The breaker of an asyncio Cluster node (which has no pool of its own)."""
    per_node = _node_breakers.get(client)
    found = per_node.get(node.name) if per_node is not None else None
    if found is None:
        with _registry_lock:
            per_node = _node_breakers.setdefault(client, {})
            found = per_node.get(node.name)
            if found is None:
                found = per_node[node.name] = Breaker(node.name)
    return found


def node_breakers(client: Any) -> list[Breaker]:
    """The breakers ``node_breaker`` made for an asyncio Cluster client."""
    per_node = _node_breakers.get(client)
    return list(per_node.values()) if per_node is not None else []


def on_open(listener: Callable[[Breaker], None]) -> None:
    """Call the bound method ``listener(breaker)`` (from the thread whose call
    timed out) each time a breaker opens, for as long as its object lives."""
    with _registry_lock:
        _listeners[:] = [ref for ref in _listeners if ref() is not None]
        _listeners.append(weakref.WeakMethod(listener))


def _after_fork_in_child() -> None:
    # Per process: a child has its own connections, and its first call finds out.
    global _registry_lock
    _breakers.clear()
    _node_breakers.clear()
    _registry_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
