"""The lock implementations under comparison, behind one tiny interface.

Each factory takes ``(client, name, ttl, wait)`` and returns a handle with
``acquire() -> bool`` (blocking for at most ``wait`` seconds) and
``release()``. Every implementation gets the same lease TTL and wait bound and
is used the way its own documentation shows: a blocking acquire with a timeout.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import secrets
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class Handle(Protocol):
    def acquire(self) -> bool: ...

    def release(self) -> None: ...


Factory = Callable[[Any, str, float, float], Handle]


@dataclass(frozen=True)
class Impl:
    key: str
    label: str
    factory: Factory
    peer: bool  # counted among the peers in the targets (the baseline is not)
    module: str  # what must be importable for it to take part
    note: str = ""
    # Run when ``--impls`` is not given: a reference made for one question is not.
    default: bool = True

    def missing(self) -> str | None:
        """Why this implementation cannot run here, or None."""
        try:
            __import__(self.module)
        except ImportError as exc:
            return f"{self.module} is not installed ({exc})"
        return None


@functools.cache
def _imported(module: str, name: str) -> Any:
    """``name`` of ``module``, imported on first use (a run may not include its
    implementation) and once: ``from package import name`` inside a factory
    runs importlib's Python code on every call, which a program that imports
    at the top never pays."""
    return getattr(importlib.import_module(module), name)


# -- django_redislock -------------------------------------------------------------
def _ours(client: Any, name: str, ttl: float, wait: float) -> Handle:
    lock = _imported("django_redislock.core", "Lock")
    return lock(client, name, ttl=ttl, wait=wait)  # type: ignore[no-any-return]


def _ours_barging(client: Any, name: str, ttl: float, wait: float) -> Handle:
    lock = _imported("django_redislock.core", "Lock")
    return lock(client, name, ttl=ttl, wait=wait, fair=False)  # type: ignore[no-any-return]


# -- redis-py ---------------------------------------------------------------------
def _redis_py(client: Any, name: str, ttl: float, wait: float) -> Handle:
    from redis.lock import Lock

    # Defaults otherwise: it polls every 0.1 s while the lock is busy.
    return Lock(client, name, timeout=ttl, blocking=True, blocking_timeout=wait)


# -- python-redis-lock --------------------------------------------------------------
class _PythonRedisLock:
    def __init__(self, client: Any, name: str, ttl: float, wait: float) -> None:
        import redis_lock  # type: ignore[import-untyped]

        # It takes whole seconds for both, and refuses a wait longer than expire.
        self._lock = redis_lock.Lock(client, name, expire=max(1, int(ttl)))
        self._wait = max(1, int(wait))

    def acquire(self) -> bool:
        return bool(self._lock.acquire(blocking=True, timeout=self._wait))

    def release(self) -> None:
        self._lock.release()


# -- pottery --------------------------------------------------------------------------
class _Pottery:
    def __init__(self, client: Any, name: str, ttl: float, wait: float) -> None:
        self._lock = _imported("pottery", "Redlock")(
            key=name, masters={client}, auto_release_time=ttl
        )
        self._wait = wait

    def acquire(self) -> bool:
        return bool(self._lock.acquire(blocking=True, timeout=self._wait))

    def release(self) -> None:
        self._lock.release()


# -- the bare minimum -------------------------------------------------------------------
_CAD = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# Only used when the baseline takes part in the contended runs: it has no
# wake-up at all, so it retries after this long.
BASELINE_POLL = 0.001


_CAD_SHA = hashlib.sha1(_CAD.encode()).hexdigest()
# Clients that have had the script loaded: a handle made per call (as a
# decorator makes one) must not pay a SCRIPT LOAD round trip each time.
_loaded: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


class _Baseline:
    """SET NX PX to acquire, EVALSHA compare-and-delete to release: one round trip each."""

    def __init__(self, client: Any, name: str, ttl: float, wait: float) -> None:
        self._client = client
        self._name = name
        self._ttl_ms = int(ttl * 1000)
        self._wait = wait
        self._token = b""
        self._sha = _CAD_SHA
        if client not in _loaded:
            client.script_load(_CAD)
            _loaded[client] = True

    def acquire(self) -> bool:
        token = secrets.token_hex(16).encode()
        deadline = time.monotonic() + self._wait
        while not self._client.set(self._name, token, nx=True, px=self._ttl_ms):
            if time.monotonic() >= deadline:
                return False
            time.sleep(BASELINE_POLL)
        self._token = token
        return True

    def release(self) -> None:
        if not self._client.evalsha(self._sha, 1, self._name, self._token):
            raise RuntimeError(f"baseline lock {self._name!r} was not held at release")


# -- the least two scripts can do ------------------------------------------------------
# What any lock that runs a script to acquire and one to release pays at least:
# one string per name holding token and fence, read and rewritten by each.
# No owner, no queue, no memory of released tokens, no waiting but polling: a
# reference point for the server's cost, not a lock anyone should use.
_FLOOR_LIBRARY = """#!lua name=bench_floor
redis.register_function('bench_floor_acquire', function(KEYS, ARGV)
  local v = redis.call('GET', KEYS[1])
  if v and string.sub(v, 1, 1) ~= '-' then return 0 end
  local f = v and string.sub(v, 2) + 1 or redis.call('TIME')[1] * 1000000
  redis.call('SET', KEYS[1], ARGV[1] .. f, 'PX', ARGV[2])
  return 1
end)
redis.register_function('bench_floor_release', function(KEYS, ARGV)
  local v = redis.call('GET', KEYS[1])
  if not v or string.sub(v, 1, 16) ~= ARGV[1] then return 0 end
  redis.call('SET', KEYS[1], '-' .. string.sub(v, 17), 'KEEPTTL')
  return 1
end)
"""
_floor_loaded: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


class _ScriptedFloor:
    """A script to acquire, a script to release (FCALL): see ``_FLOOR_LIBRARY``."""

    def __init__(self, client: Any, name: str, ttl: float, wait: float) -> None:
        self._client = client
        self._name = name
        self._ttl_ms = int(ttl * 1000)
        self._wait = wait
        self._token = ""
        if client not in _floor_loaded:
            client.function_load(_FLOOR_LIBRARY, replace=True)
            _floor_loaded[client] = True

    def acquire(self) -> bool:
        token = secrets.token_hex(8)
        deadline = time.monotonic() + self._wait
        while not self._client.fcall("bench_floor_acquire", 1, self._name, token, self._ttl_ms):
            if time.monotonic() >= deadline:
                return False
            time.sleep(BASELINE_POLL)
        self._token = token
        return True

    def release(self) -> None:
        if not self._client.fcall("bench_floor_release", 1, self._name, self._token):
            raise RuntimeError(f"floor lock {self._name!r} was not held at release")


# -- the least a first-come, fenced lock with hand-off does ---------------------------
# A reference for the contended runs: what strict first-come order with a
# direct hand-off costs when nothing else is kept. Acquire: SET NX PX and a
# fence, or join the queue. Release: owner check, pop the next waiter, raise
# the fence, write its lease, publish its turn on its process's channel,
# which the waiting thread reads itself. No owner metadata, no memory of
# released or lost leases, one waiter per process, no deadlines on queue
# entries, a fence counter that never expires, no Cluster or replicas: read
# its figures as a ceiling for the order, not as a lock anyone should use.
_FIFO_ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[3])
end
if ARGV[3] ~= '' then
  redis.call('RPUSH', KEYS[2], ARGV[1] .. '|' .. ARGV[3])
end
return 0
"""
_FIFO_RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local nxt = redis.call('LPOP', KEYS[2])
if not nxt then
  redis.call('DEL', KEYS[1])
  return 1
end
local bar = string.find(nxt, '|', 1, true)
local token = string.sub(nxt, 1, bar - 1)
local fence = redis.call('INCR', KEYS[3])
redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
redis.call('PUBLISH', string.sub(nxt, bar + 1), token .. '|' .. fence)
return 1
"""
# The same floor with the library's server work added as plain Lua (a loop of
# string operations ahead of each script, about 1,050 Redis 7.0 instructions
# each): padded so that ``server_cost --contended 8`` counts about what a
# contended section of ``Lock`` costs the server. Whether that work slows the
# hand-off is then the difference between the two floors, in the same run.
_HEAVY_ROUNDS = (65, 56)  # acquire, release
_HEAVY_PAD = "for _ = 1, {} do local _ = string.sub(ARGV[1], 1, 4) end\n"
_fifo_loaded: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
# This process's wake-up channel per client: (pid, channel, pubsub).
_fifo_channels: weakref.WeakKeyDictionary[Any, tuple[int, str, Any]] = weakref.WeakKeyDictionary()


def _with_shas(*sources: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return sources, tuple(hashlib.sha1(source.encode()).hexdigest() for source in sources)


def _load_once(client: Any, sources: Sequence[str | bytes], shas: Sequence[str]) -> None:
    """Load a reference's scripts on ``client`` the first time one of its handles meets it."""
    loaded = _fifo_loaded.setdefault(client, set())
    if shas[0] not in loaded:
        for source in sources:
            client.script_load(source)
        loaded.update(shas)


class _FifoFloor:
    """First-come order with a fenced hand-off and nothing else (``_FIFO_*``)."""

    _scripts, _shas = _with_shas(_FIFO_ACQUIRE, _FIFO_RELEASE)

    def __init__(self, client: Any, name: str, ttl: float, wait: float) -> None:
        self._client = client
        self._keys = (f"{name}:lease", f"{name}:queue", f"{name}:fence")
        self._ttl_ms = int(ttl * 1000)
        self._wait = wait
        self._token = ""
        self.fence = 0
        _load_once(client, self._scripts, self._shas)

    def _channel(self) -> tuple[str, Any]:
        known = _fifo_channels.get(self._client)
        if known is None or known[0] != os.getpid():
            channel = f"fifo-floor:{secrets.token_hex(8)}"
            pubsub = self._client.pubsub()
            pubsub.subscribe(channel)
            confirmed = pubsub.get_message(timeout=5.0)
            if confirmed is None or confirmed["type"] != "subscribe":
                raise RuntimeError(f"the floor's channel was not subscribed: {confirmed!r}")
            known = _fifo_channels[self._client] = (os.getpid(), channel, pubsub)
        return known[1], known[2]

    def acquire(self) -> bool:
        token = secrets.token_hex(8)
        # Subscribed before queueing, so that the turn is heard; only to wait.
        channel, pubsub = self._channel() if self._wait > 0 else ("", None)
        fence = self._first_try(token, channel)
        deadline = time.monotonic() + self._wait
        while not fence:
            left = deadline - time.monotonic()
            if left <= 0 or pubsub is None:
                return False  # busy, or left queued: a reference, not a lock
            message = pubsub.get_message(timeout=left)
            if message is not None and message["type"] == "message":
                mine, handed = self._turn(message["data"])
                if mine == token.encode():
                    fence = handed
        self._token, self.fence = token, fence
        return True

    def _first_try(self, token: str, channel: str) -> int:
        """The acquire script: the fence when granted, else 0 (queued or busy)."""
        return int(
            self._client.evalsha(self._shas[0], 3, *self._keys, token, self._ttl_ms, channel)
        )

    def _turn(self, data: bytes) -> tuple[bytes, int]:
        """The token and fence a wake-up names: ``<token>|<fence>``."""
        mine, _, handed = data.partition(b"|")
        return mine, int(handed)

    def release(self) -> None:
        if not self._client.evalsha(self._shas[1], 3, *self._keys, self._token, self._ttl_ms):
            raise RuntimeError(f"fifo floor lock {self._keys[0]!r} was not held at release")


class _FifoFloorHeavy(_FifoFloor):
    """``_FifoFloor`` whose scripts also do about the library's server work."""

    _scripts, _shas = _with_shas(
        _HEAVY_PAD.format(_HEAVY_ROUNDS[0]) + _FIFO_ACQUIRE,
        _HEAVY_PAD.format(_HEAVY_ROUNDS[1]) + _FIFO_RELEASE,
    )


class _LeanClient(_FifoFloor):
    """The library's own scripts and keys (``Lock``'s first-come order), run
    by the floor's client: a process channel of its own, redis-py's
    ``evalsha``, nothing else. No handle, notifier, bounded calls, retries
    or give-backs: what ``Lock``'s scripts do for the rate with the least
    client around them. A reference, not a lock anyone should use."""

    _OWNER = b'{"pid": 0}'

    def __init__(self, client: Any, name: str, ttl: float, wait: float) -> None:
        scripts, keys, protocol = _library()
        lock_keys = keys.KeySpace.default().lock(name)
        self._client = client
        self._keys = (lock_keys.lease, lock_keys.queue, lock_keys.state)
        self._ttl_ms = int(ttl * 1000)
        self._state_ttl_ms = self._ttl_ms + protocol.STATE_KEEP_MS
        self._wait = wait
        self._token = ""
        self.fence = 0
        self._acquire_script, self._release_script = scripts.ACQUIRE, scripts.RELEASE
        pair = (self._acquire_script, self._release_script)
        _load_once(client, [s.source for s in pair], [s.sha for s in pair])

    def _first_try(self, token: str, channel: str) -> int:
        # ARGV as Lock sends them (lua/acquire.lua): the first attempt, its
        # wake-ups on a single server's channel ('p'), or none ('-').
        reply = self._client.evalsha(
            self._acquire_script.sha,
            3,
            *self._keys,
            token,
            self._ttl_ms,
            b"",
            self._OWNER,
            int(self._wait * 1000),
            ("p" + channel) if channel else "-",
            self._state_ttl_ms,
            1,
        )
        # A fence comes as text; a wait (queued or busy) as an integer.
        return int(reply) if isinstance(reply, bytes) else 0

    def _turn(self, data: bytes) -> tuple[bytes, int]:
        mine, fence, _ = data.split(b":")  # <token>:<fence>:<round>
        return mine, int(fence)

    def release(self) -> None:
        if not self._client.evalsha(
            self._release_script.sha, 3, *self._keys, self._token, self.fence
        ):
            raise RuntimeError(f"lock {self._keys[0]!r} was not held at release")


@functools.cache
def _library() -> tuple[Any, Any, Any]:
    """The library's scripts, key space and protocol modules, imported once."""
    from django_redislock.core.engine import keys, protocol, scripts

    return scripts, keys, protocol


IMPLS: dict[str, Impl] = {
    impl.key: impl
    for impl in (
        Impl("ours", "django_redislock.Lock", _ours, peer=False, module="django_redislock.core"),
        Impl(
            "ours_barging",
            "django_redislock.Lock, fair=False",
            _ours_barging,
            peer=False,
            module="django_redislock.core",
            note="barging: a freed lease goes to whoever asks first, within a bound",
        ),
        Impl(
            "baseline",
            "baseline SET NX + EVALSHA",
            _Baseline,
            peer=False,
            module="redis",
            note=f"polls every {BASELINE_POLL * 1000:g} ms when busy",
        ),
        Impl(
            "floor",
            "two-script floor (FCALL)",
            _ScriptedFloor,
            peer=False,
            module="redis",
            note="reference only: token and fence, nothing else; polls when busy",
        ),
        Impl(
            "lean_client",
            "the library's scripts, the floor's client",
            _LeanClient,
            peer=False,
            module="django_redislock.core",
            note="reference only: Lock's scripts and keys with nothing else on the client",
            default=False,
        ),
        Impl(
            "fifo_floor_heavy",
            "first-come floor, the library's server work",
            _FifoFloorHeavy,
            peer=False,
            module="redis",
            note="reference only: the floor, its scripts padded to the library's server work",
            default=False,
        ),
        Impl(
            "fifo_floor",
            "first-come floor (reference)",
            _FifoFloor,
            peer=False,
            module="redis",
            note="reference only: first-come hand-off, fence, nothing else",
        ),
        Impl(
            "redis_py",
            "redis.lock.Lock",
            _redis_py,
            peer=True,
            module="redis.lock",
            note="polls every 0.1 s when busy (default sleep)",
        ),
        Impl(
            "python_redis_lock",
            "redis_lock.Lock",
            _PythonRedisLock,
            peer=True,
            module="redis_lock",
            note="BLPOP on a signal list when busy",
        ),
        Impl(
            "pottery",
            "pottery.Redlock (1 master)",
            _Pottery,
            peer=True,
            module="pottery",
            note="retries after a random 0-0.2 s sleep when busy",
        ),
    )
}


def semaphore_factory() -> Callable[[Any, str, int, float, float], Any] | None:
    """``Semaphore(client, name, limit, ttl=, wait=)`` when the module exists yet."""
    try:
        from django_redislock.core.drivers.semaphore import Semaphore
    except ImportError:
        return None

    def make(client: Any, name: str, limit: int, ttl: float, wait: float) -> Any:
        return Semaphore(client, name, limit, ttl=ttl, wait=wait)

    return make
