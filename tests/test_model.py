"""A model-based test of the lock protocol: Hypothesis stateful testing on a real Redis.

Several lock handles on two names and three handles on a two-permit semaphore,
spread over two simulated processes (each its own client, connection pool and
wake-up channel, each behind its own fault proxy), are driven through random
interleavings of the public API and of faults:

* acquire without waiting, and acquire with a short wait in the handle's own
  thread, which the model can pause at any call the wait loop makes into the
  library (and resume later), and join;
* release, extend (``refresh`` for permits), and a renewal tick: what the
  renewal watchdog does, run when the model says (its own thread would make
  the runs depend on timing, and Hypothesis could not replay them);
* the model's clock: short sleeps, so that leases of 50 to 600 ms run out;
* force-release through ``core.ops.force.clear``;
* a lost reply (one or both attempts of a call), Redis frozen (SIGSTOP) for a
  while, Redis killed and restarted empty.

After every step the model reads one consistent snapshot of the private Redis
and checks:

1. exclusion: per name, at most one handle believes it holds the lock
   (``held``), and Redis agrees that it does: its token is the lease's. Handles
   whose lease was taken away from outside (force-release, a restart without
   persistence) are excused until they acquire again, as documented; but a
   handle that knows of its loss (``lost``) must not report ``held``.
   For the semaphore: no more believers than permits, each one a live permit
   in Redis, and never more live permits in Redis than the limit;
2. fences strictly increase per name: along the leases seen in Redis, and
   between any two acquisitions of which one returned before the other began;
3. every key in the private Redis has a TTL;
4. every call returns within its bound (its wait, plus the bound of its Redis
   calls on this client, plus a constant), the time the model kept it paused
   not counted;
5. a release or extend of a lease that is still well inside its validity and
   was not taken away from outside does not report it lost; and after an
   extend that ran or may have run (a timeout), the handle counts on no more
   than the new TTL;

and at the end of each run, once every handle has let go and every lease has
run out, every name can be taken again and every permit of the semaphore is
free: nothing leaks.

The budget is fixed and every batch of runs has a fixed seed, so CI runs the
same interleavings every time (their timing, and so a timing-dependent
failure, can still differ): ``REDISLOCK_MODEL_STEPS`` steps (10 000 by
default; raise it for a longer exploration), ``REDISLOCK_MODEL_SEED`` for
other interleavings, ``REDISLOCK_MODEL_OFF`` to leave named invariants
unchecked and look past a known failure, ``REDISLOCK_MODEL_SHRINK=1`` to let
Hypothesis shrink a failure (slow, and unreliable when it depends on timing;
without it the failing run is printed step by step).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.control import current_build_context
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

import django_redislock.core
from django_redislock.core.drivers.lock import Lock
from django_redislock.core.drivers.semaphore import Semaphore
from django_redislock.core.engine.keys import KeySpace
from django_redislock.core.engine.protocol import STATE_KEEP_MS
from django_redislock.core.exceptions import LockError, LockLost, LockNotOwned, RedisUnavailable
from django_redislock.core.ops import force
from tests.faults.harness import FaultServer, bounded_client, call_bound
from tests.faults.proxy import FaultProxy

# -- budget -------------------------------------------------------------------------
STEPS = int(os.environ.get("REDISLOCK_MODEL_STEPS", "10000"))
# Faults are budgeted per run (they are slow), so longer runs are cheaper per step.
STEPS_PER_RUN = 200
SEED = int(os.environ.get("REDISLOCK_MODEL_SEED", "0"))
# Shrinking replays a failing run hundreds of times: minutes. On demand only;
# without it a failure prints its run step by step.
SHRINK = os.environ.get("REDISLOCK_MODEL_SHRINK") == "1"
# Invariants left unchecked, to look past a known failure to the next one:
# bound, exclusion, false-loss, fence, leak, lost-held, permits, ttl, validity.
OFF = frozenset(filter(None, os.environ.get("REDISLOCK_MODEL_OFF", "").split(",")))
# About 5 ms a step on a quiet host; the rest is headroom for a loaded one.
pytestmark = pytest.mark.timeout(max(120, int(STEPS * 0.03)))

# -- timing -------------------------------------------------------------------------
# The clients' socket timeout: short, because every lost reply costs one.
TIMEOUT = 0.1
CALL = call_bound(TIMEOUT)
# Scheduling on a loaded host, the proxy's hops, a reconnection after a restart.
SLACK = 0.75
# A call that has not returned this long after its bound is reported as a hang.
HANG = 5.0
# A paused waiter is let go after this long whatever the model does, so a
# broken model cannot hang the run.
PAUSE_LIMIT = 10.0
# A release or extend must succeed when the lease has at least this much left,
# plus, for each lost reply, the timeout and the first backoff before the retry
# (bounded_client: base 0.01 s, doubled per retry).
SAFE_MARGIN = 0.025
FIRST_BACKOFF = 0.02
GRACE = 0.2  # semaphore reservations: short, so a stranded one costs little here
LIMIT = 2

# Whether a call's reply (or its retry's too) is lost: mostly not.
LOST = st.sampled_from([0, 0, 0, 0, 0, 1, 2])

PREFIX = "model"
NAMES = ("a", "b")
SEMAPHORE = "s"


@dataclass(frozen=True)
class Spec:
    label: str
    process: int
    name: str
    ttl: float
    semaphore: bool = False


# Two processes; on name "a" two handles of one process share its wake-up channel.
SPECS = (
    Spec("L0", 0, "a", 0.10),
    Spec("L1", 1, "a", 0.15),
    Spec("L2", 0, "a", 0.08),
    Spec("L3", 0, "b", 0.06),
    Spec("L4", 1, "b", 0.20),
    Spec("S0", 0, SEMAPHORE, 0.10, semaphore=True),
    Spec("S1", 1, SEMAPHORE, 0.15, semaphore=True),
    Spec("S2", 1, SEMAPHORE, 0.20, semaphore=True),
)
LABELS = tuple(s.label for s in SPECS)
PROCESSES = 2

STATS: Counter[str] = Counter()
SECONDS: Counter[str] = Counter()
PAUSED_AT: Counter[str] = Counter()

# One consistent snapshot in one round trip: the server's clock, each lock's
# lease, the semaphore's permits and state, and every key without a TTL.
# (KEYS is fine here: a private server holding a few dozen keys.)
SNAPSHOT = """
local out = {redis.call('TIME')}
for i = 1, #KEYS - 2 do
  out[#out + 1] = redis.call('HMGET', KEYS[i], 't', 'f')
end
out[#out + 1] = redis.call('ZRANGE', KEYS[#KEYS - 1], 0, -1, 'WITHSCORES')
out[#out + 1] = redis.call('HGETALL', KEYS[#KEYS])
local eternal = {}
for _, key in ipairs(redis.call('KEYS', '*')) do
  if redis.call('PTTL', key) == -1 then
    eternal[#eternal + 1] = key
  end
end
out[#out + 1] = eternal
return out
"""

# Invariant 3's other half, per lock (KEYS: lease, queue, state of each;
# ARGV[1] KEEP): the state outlives the lease by KEEP, and the state and the
# queue outlive every waiter's deadline by KEEP. Read in one script, so
# nothing changes between the reads. Returns what falls short.
OUTLIVED = """
local keep, short = tonumber(ARGV[1]), {}
-- No TTL is the other check's; a key that is gone lasts no time at all.
local function left(key)
  local ms = redis.call('PTTL', key)
  return ms == -1 and math.huge or ms
end
-- The server's clock may move between two calls: what must outlive is read
-- first, what it must outlive after, so a tick between them errs towards
-- passing (by a millisecond), never towards a false alarm.
for i = 1, #KEYS, 3 do
  local lease, queue, state = KEYS[i], KEYS[i + 1], KEYS[i + 2]
  local s, q = left(state), left(queue)
  -- 0: the lease ends within the millisecond, or ended already (PTTL says
  -- 0 for a key past its end that Redis has not yet dropped): nothing to
  -- compare.
  local l = redis.call('PTTL', lease)
  if l > 0 and s < l + keep then
    short[#short + 1] = state .. ' ' .. s .. ' ms, its lease ' .. l .. ' ms'
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  for _, element in ipairs(redis.call('LRANGE', queue, 0, -1)) do
    -- <token>|<since>|<entry> (the first-come order) or a bare token whose
    -- entry is in the state (the barging order).
    local token, info = string.match(element, '^([^|]+)|%d+|(.*)$')
    if not token then
      token, info = element, redis.call('HGET', state, element)
    end
    local deadline = info and tonumber(string.match(info, '^(%d+)|'))
    if deadline and math.min(q, s) < deadline - now + keep then
      short[#short + 1] = queue .. ' ' .. q .. ' ms, state ' .. s .. ' ms, waiter ' ..
        token .. ' until ' .. (deadline - now) .. ' ms'
    end
  end
end
return short
"""


def _lock_key_triple(keyspace: KeySpace, name: str) -> tuple[bytes, bytes, bytes]:
    keys = keyspace.lock(name)
    return keys.lease, keys.queue, keys.state


# -- a thread per handle, which the model can pause ------------------------------------
_CORE_DIR = os.path.dirname(os.path.abspath(django_redislock.core.__file__)) + os.sep
# The functions of the wait loop (sync handles): a waiter is paused only at a
# call one of them makes, that is, between two of its steps. Never inside the
# notifier or a script call, whose locks would stall the whole process, which
# is not what one slow waiter does. If they are renamed, the run fails saying
# that no waiter was ever paused.
WAIT_LOOP = frozenset({"acquire", "_acquire"})


class Job:
    def __init__(self, label: str, fn: Callable[[], Any], bound: float, epoch: int) -> None:
        self.label = label
        self.fn = fn
        self.bound = bound
        self.epoch = epoch  # restarts seen when it began
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.started = 0.0
        self.finished = 0.0
        self.paused_for = 0.0
        self.holding = False  # an acquire by a handle that already holds: refused

    def run(self) -> None:
        self.started = time.monotonic()
        try:
            self.result = self.fn()
        except BaseException as exc:  # reported to the model, which judges it
            self.error = exc
        finally:
            self.finished = time.monotonic()
            self.done.set()

    @property
    def took(self) -> float:
        return self.finished - self.started - self.paused_for


class Worker:
    """Runs one handle's calls in one thread (a handle belongs to its thread).

    ``arm(n)`` pauses the thread at the n-th call that the wait loop makes
    from now on: between any two of its steps. A hook in the wait loop itself
    would make this exact and independent of function names; this uses the
    interpreter's trace function instead, so the library is unchanged.
    """

    def __init__(self, label: str) -> None:
        self.label = label
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._armed = 0
        self.paused = False
        self.paused_at = ""
        self.job: Job | None = None
        self.thread = threading.Thread(target=self._run, name=f"model-{label}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        sys.settrace(self._trace)
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self.job = job
            job.run()

    def _trace(self, frame: Any, event: str, arg: Any) -> None:
        if not self._armed:
            return None
        caller = frame.f_back
        if caller is None or caller.f_code.co_name not in WAIT_LOOP:
            return None
        if not caller.f_code.co_filename.startswith(_CORE_DIR):
            return None
        with self._cond:
            if not self._armed:
                return None
            self._armed -= 1
            if self._armed:
                return None
            self.paused_at = f"{caller.f_code.co_name} -> {frame.f_code.co_name}"
            self.paused = True
            STATS["pauses hit"] += 1
            PAUSED_AT[self.paused_at] += 1
            started = time.monotonic()
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self.paused, PAUSE_LIMIT)
            self.paused = False
            if self.job is not None:
                self.job.paused_for += time.monotonic() - started
        return None

    def submit(self, job: Job) -> Job:
        self._jobs.put(job)
        return job

    def arm(self, count: int) -> None:
        with self._cond:
            self._armed = count

    def resume(self) -> None:
        with self._cond:
            self._armed = 0
            self.paused = False
            self._cond.notify_all()

    def stop(self) -> None:
        self.resume()
        self._jobs.put(None)
        self.thread.join(HANG)


# -- what lives across runs: one Redis, two proxies, their clients, the workers ----------
class World:
    def __init__(self) -> None:
        self.server = FaultServer()
        self.server.start()
        self.admin = bounded_client(self.server.url, timeout=2.0)
        self.proxies = [FaultProxy(("127.0.0.1", self.server.port or 0)) for _ in range(PROCESSES)]
        self.clients = [bounded_client(p.url, timeout=TIMEOUT) for p in self.proxies]
        self.workers = {label: Worker(label) for label in LABELS}
        self.keyspace = KeySpace(PREFIX)
        self.frozen = False

    def close(self) -> None:
        for worker in self.workers.values():
            worker.stop()
        if self.frozen:
            self.server.resume()
        for client in [*self.clients, self.admin]:
            client.close()
        for proxy in self.proxies:
            proxy.close()
        self.server.cleanup()


@pytest.fixture
def world() -> Iterator[World]:
    w = World()
    try:
        yield w
    finally:
        w.close()


# -- the model ----------------------------------------------------------------------
@dataclass
class Acquisition:
    label: str
    started: float
    returned: float
    fence: int


@dataclass
class Model:
    handle: Any
    spec: Spec
    worker: Worker
    proxy: FaultProxy
    job: Job | None = None  # an acquire with a wait, running in the background
    armed: bool = False
    # Tokens taken away from outside (force-release, restart): excused.
    excused: set[str] = field(default_factory=set)


def _off(invariant: str) -> bool:
    return invariant in OFF


def _step(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark the machine as failing while a rule or check runs, so the
    teardown never raises over the failure it is cleaning up after."""

    @functools.wraps(fn)
    def wrapper(self: LockModel, *args: Any, **kwargs: Any) -> Any:
        self.failing = True
        self.trace.append(f"{fn.__name__}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})")
        started = time.monotonic()
        result = fn(self, *args, **kwargs)
        SECONDS[fn.__name__] += time.monotonic() - started
        self.failing = False
        STATS["steps"] += 1
        return result

    return wrapper


class LockModel(RuleBasedStateMachine):
    world: World  # set by the test

    def __init__(self) -> None:
        super().__init__()
        w = self.world
        STATS["runs"] += 1
        self.failing = False
        # The steps of this run and what they did, printed when one fails: the
        # timing of a failure can vary, and Hypothesis then cannot replay it.
        self.trace: list[str] = []
        self.restarts = 0  # epoch: restarts so far in this run
        self.slept = 0.0
        self.faults_left = {"lost": 2, "freeze": 1, "restart": 1}
        self.acquisitions: dict[str, list[Acquisition]] = {n: [] for n in NAMES}
        self.seen_lease: dict[str, tuple[str, int] | None] = dict.fromkeys(NAMES)
        w.admin.flushall()
        self.models: dict[str, Model] = {}
        for spec in SPECS:
            client = w.clients[spec.process]
            handle: Any
            if spec.semaphore:
                handle = Semaphore(
                    client,
                    spec.name,
                    LIMIT,
                    ttl=spec.ttl,
                    wait=0,
                    keyspace=w.keyspace,
                    label=spec.label,
                    grace=GRACE,
                )
            else:
                handle = Lock(
                    client,
                    spec.name,
                    ttl=spec.ttl,
                    wait=0,
                    keyspace=w.keyspace,
                    label=spec.label,
                )
            self.models[spec.label] = Model(
                handle, spec, w.workers[spec.label], w.proxies[spec.process]
            )

    # -- running calls ------------------------------------------------------------
    def _job(self, m: Model, what: str, fn: Callable[[], Any], bound: float) -> Job:
        return m.worker.submit(Job(f"{m.spec.label}.{what}", fn, bound, self.restarts))

    def _finish(self, m: Model, job: Job) -> Job:
        """Wait for ``job``, check its bound (invariant 4)."""
        if not job.done.wait(job.bound + job.paused_for + HANG):
            raise AssertionError(f"{job.label} hangs: not back {job.bound + HANG:.2f}s on")
        outcome = repr(job.error) if job.error is not None else repr(job.result)
        fence = getattr(m.handle, "fence", None)
        paused = f", paused {job.paused_for:.3f}s at {m.worker.paused_at}" if job.paused_for else ""
        self.trace.append(
            f"    {job.label} -> {outcome} in {job.took:.3f}s (fence {fence}{paused})"
        )
        assert _off("bound") or job.took <= job.bound, (
            f"{job.label} took {job.took:.3f}s, over its bound of {job.bound:.3f}s"
        )
        return job

    def _call(self, m: Model, what: str, fn: Callable[[], Any], bound: float) -> Job:
        return self._finish(m, self._job(m, what, fn, bound))

    def _acquire_bound(self, wait: float) -> float:
        # The attempts before the deadline, the one in flight at it, giving back.
        return wait + 3 * CALL + SLACK

    def _after_acquire(self, m: Model, job: Job) -> None:
        h = m.handle
        if job.holding:
            assert isinstance(job.error, LockError), f"{job.label} re-entered"
            return
        if job.error is not None:
            if isinstance(job.error, RedisUnavailable):
                STATS["unavailable"] += 1
                return
            raise job.error
        STATS["acquired" if job.result else "busy"] += 1
        if not job.result:
            return
        assert h.token is not None, f"{job.label} returned True without a token"
        if job.epoch != self.restarts:
            m.excused.add(h.token)  # granted, perhaps, by the server that was restarted
        if m.spec.semaphore:
            return
        fence = int(h.fence)
        new = Acquisition(m.spec.label, job.started, job.finished, fence)
        for old in self.acquisitions[m.spec.name]:
            # Invariant 2: one acquisition returned before the other began.
            if old.returned < new.started:
                assert _off("fence") or old.fence < fence, (
                    f"fence went back on {m.spec.name!r}: {old.label} got {old.fence}, "
                    f"then {new.label} got {fence}"
                )
            if new.returned < old.started:
                assert _off("fence") or fence < old.fence, (
                    f"fence went back on {m.spec.name!r}: {new.label} got {fence}, "
                    f"then {old.label} got {old.fence}"
                )
            assert _off("fence") or old.fence != fence, (
                f"fence {fence} on {m.spec.name!r} handed out twice"
            )
        self.acquisitions[m.spec.name].append(new)

    def _excused(self, m: Model) -> bool:
        token = m.handle.token
        if m.job is not None and m.job.epoch != self.restarts:
            return True
        return token is not None and token in m.excused

    def _safe(self, m: Model, drop: int) -> bool:
        """Whether a release or extend now must find the lease: never taken
        away from outside, not known lost, and valid for long enough that even
        the retry after a lost reply runs inside it (the lost reply may have
        been NOSCRIPT's, and the script run only by the retry)."""
        h = m.handle
        return (
            h.token is not None
            and not h.lost
            and not self._excused(m)
            and h.remaining >= SAFE_MARGIN + drop * (TIMEOUT + FIRST_BACKOFF)
        )

    @staticmethod
    def _within(job: Job, seconds: float) -> bool:
        """Whether the whole call, every attempt included, ended inside
        ``seconds`` (less the margin) of its start: then no script of it can
        have met the lease expired. A loaded host can stall a call that loses
        no reply past a short lease, and then a loss is no false report."""
        return job.finished - job.started + SAFE_MARGIN <= seconds

    def _release(self, m: Model, drop: int = 0) -> None:
        h = m.handle
        safe = self._safe(m, drop)
        held = h.token is not None
        valid_for = h.remaining
        job = self._faulty(m, "release", h.release, CALL + SLACK, drop)
        safe = safe and self._within(job, valid_for)
        if job.error is None:
            STATS["released"] += 1
        elif isinstance(job.error, LockLost):
            STATS["release: lost"] += 1
            # Invariant 5: the lease was there to release.
            assert _off("false-loss") or not safe, (
                f"{job.label} reported a loss of a lease it still held"
            )
        elif isinstance(job.error, LockNotOwned):
            assert not held, f"{job.label}: LockNotOwned while holding"
        elif isinstance(job.error, RedisUnavailable):
            STATS["unavailable"] += 1
        else:
            raise job.error
        assert not h.held, f"{job.label} still reports held after release"

    def _extend(self, m: Model, ttl: float, drop: int = 0) -> None:
        h = m.handle
        # The first attempt may already have cut the lease to ``ttl``.
        safe = self._safe(m, drop) and ttl >= SAFE_MARGIN + drop * (TIMEOUT + FIRST_BACKOFF)
        held = h.token is not None
        valid_for = min(h.remaining, ttl)
        fn = h.refresh if m.spec.semaphore else h.extend
        job = self._faulty(m, "extend", lambda: fn(ttl), CALL + SLACK, drop)
        safe = safe and self._within(job, valid_for)
        if job.error is None:
            STATS["extended"] += 1
        elif isinstance(job.error, LockLost):
            STATS["extend: lost"] += 1
            assert _off("false-loss") or not safe, (
                f"{job.label} reported a loss of a lease it still held"
            )
            # DESIGN 11: a loss the library knows of is a loss everywhere.
            assert _off("lost-held") or not h.held, (
                f"{job.label} raised LockLost but still reports held"
            )
        elif isinstance(job.error, LockNotOwned):
            assert not held, f"{job.label}: LockNotOwned while holding"
        elif isinstance(job.error, RedisUnavailable):
            STATS["unavailable"] += 1
        else:
            raise job.error
        # An extend the circuit breaker refused was never sent: the lease ends
        # when it did, and the handle keeps what it counted on.
        sent = not (isinstance(job.error, RedisUnavailable) and job.error.reason == "breaker_open")
        if job.error is None or (isinstance(job.error, RedisUnavailable) and sent):
            # DESIGN 6: the extend ran, or may have run (a timeout): from now
            # on the lease may end ``ttl`` after it was sent, so the handle may
            # count on no more than that, even if it held more before.
            assert _off("validity") or h.remaining <= ttl, (
                f"{job.label} to {ttl}s: the handle counts on {h.remaining:.3f}s more"
            )

    def _faulty(self, m: Model, what: str, fn: Callable[[], Any], bound: float, drop: int) -> Job:
        if not drop:
            return self._call(m, what, fn, bound)
        m.proxy.drop_replies = drop
        try:
            return self._call(m, what, fn, bound)
        finally:
            m.proxy.drop_replies = False

    # -- rules: the API ---------------------------------------------------------------
    @rule(label=st.sampled_from(LABELS), lost=LOST)
    @_step
    def acquire(self, label: str, lost: int) -> None:
        m = self.models[label]
        if m.job is not None:
            return
        self._acquire_now(m, self._lose(lost, m.handle.token is None))

    def _acquire_now(self, m: Model, drop: int = 0) -> None:
        h = m.handle
        holding = h.token is not None
        job = self._faulty(m, "acquire", lambda: h.acquire(0), self._acquire_bound(0), drop)
        job.holding = holding
        self._after_acquire(m, job)

    waiters = Bundle("waiters")

    @rule(
        target=waiters,
        label=st.sampled_from(LABELS),
        wait=st.sampled_from([0.03, 0.1, 0.25]),
        pause_at=st.none() | st.integers(1, 16),
    )
    @_step
    def acquire_waiting(self, label: str, wait: float, pause_at: int | None) -> Any:
        """Start an acquire with a wait in the handle's thread; perhaps to be
        paused at the ``pause_at``-th call it makes into the library."""
        m = self.models[label]
        # Whether the bundle grows must not depend on timing (Hypothesis
        # replays choices), so a handle already holding is asked all the same.
        if m.job is not None:
            return multiple()
        h = m.handle
        # Read before the job starts: an uncontended acquire in the handle's
        # thread can be done before this thread looks again.
        holding = h.token is not None
        if pause_at is not None:
            m.worker.arm(pause_at)
            m.armed = True
        m.job = self._job(
            m, f"acquire(wait={wait})", lambda: h.acquire(wait), self._acquire_bound(wait)
        )
        m.job.holding = holding
        STATS["waits"] += 1
        return label

    @rule(label=waiters, count=st.integers(1, 8))
    @_step
    def pause(self, label: str, count: int) -> None:
        """Pause a waiter (again), ``count`` calls on from where it is."""
        m = self.models[label]
        if m.armed:
            return
        m.worker.arm(count)
        m.armed = True

    @rule(label=waiters)
    @_step
    def resume(self, label: str) -> None:
        m = self.models[label]
        m.worker.resume()
        m.armed = False

    @rule(label=consumes(waiters))
    @_step
    def join(self, label: str) -> None:
        m = self.models[label]
        assert m.job is not None
        m.worker.resume()
        m.armed = False
        job, m.job = m.job, None
        self._after_acquire(m, self._finish(m, job))

    @rule(label=st.sampled_from(LABELS), lost=LOST)
    @_step
    def release(self, label: str, lost: int) -> None:
        m = self.models[label]
        if m.job is None:
            self._release(m, self._lose(lost, m.handle.token is not None))

    # 0.6 s outlasts a call that loses both replies, so such a call can leave a
    # lease that the handle still counts on.
    @rule(label=st.sampled_from(LABELS), ttl=st.sampled_from([0.05, 0.1, 0.2, 0.6]), lost=LOST)
    @_step
    def extend(self, label: str, ttl: float, lost: int) -> None:
        m = self.models[label]
        if m.job is None:
            self._extend(m, ttl, self._lose(lost, m.handle.token is not None))

    def _lose(self, lost: int, calls_redis: bool) -> int:
        """How many replies of this call to lose: each costs a socket
        timeout, so a run loses a few at most."""
        if not lost or not calls_redis or self.faults_left["lost"] <= 0:
            return 0
        self.faults_left["lost"] -= 1
        STATS["lost replies"] += 1
        return lost

    @rule(label=st.sampled_from([s.label for s in SPECS if not s.semaphore]))
    @_step
    def renewal_tick(self, label: str) -> None:
        """What the watchdog does at each tick, on demand."""
        m = self.models[label]
        h = m.handle
        if m.job is not None:
            return
        was_lost = h.lost
        self._call(m, "renew", h._renew_once, CALL + SLACK)
        if h.lost and not was_lost:
            STATS["renew: lost"] += 1
            assert _off("lost-held") or not h.held, (
                f"{m.spec.label}: renewal found it lost but it still reports held"
            )

    # -- rules: the clock and the faults ------------------------------------------------
    @precondition(lambda self: self.slept < 0.3)
    @rule(seconds=st.sampled_from([0.01, 0.03, 0.06, 0.12]))
    @_step
    def sleep(self, seconds: float) -> None:
        self.slept += seconds
        time.sleep(seconds)

    @rule(which=st.sampled_from([*NAMES, SEMAPHORE]))
    @_step
    def force_clear(self, which: str) -> None:
        kind = "semaphore" if which == SEMAPHORE else "lock"
        w = self.world
        result = force.clear(w.admin, w.keyspace, names=[which], kinds=(kind,))
        tokens = {h.token for row in result.released + result.changed for h in row.holders}
        STATS["force-cleared"] += len(result.released)
        for m in self.models.values():
            if m.spec.name == which:
                m.excused |= tokens

    @precondition(lambda self: self.faults_left["freeze"] > 0)
    @rule(
        seconds=st.sampled_from([0.05, 0.15, 0.25]),
        label=st.none() | st.sampled_from(LABELS),
        op=st.sampled_from(["acquire", "release", "extend"]),
    )
    @_step
    def freeze(self, seconds: float, label: str | None, op: str) -> None:
        """SIGSTOP the server for a while; optionally one call meets it frozen."""
        self.faults_left["freeze"] -= 1
        w = self.world
        STATS["freezes"] += 1
        w.server.pause()
        w.frozen = True
        try:
            time.sleep(seconds)
            m = self.models[label] if label is not None else None
            if m is not None and m.job is None:
                if op == "acquire":
                    if m.handle.token is None:
                        self._acquire_now(m)
                elif op == "release":
                    self._release(m)
                else:
                    self._extend(m, m.spec.ttl)
        finally:
            w.server.resume()
            w.frozen = False

    @precondition(lambda self: self.faults_left["restart"] > 0)
    @rule()
    @_step
    def restart(self) -> None:
        """Kill Redis and start it again, empty (no persistence)."""
        self.faults_left["restart"] -= 1
        STATS["restarts"] += 1
        for m in self.models.values():
            if m.handle.token is not None:
                m.excused.add(m.handle.token)
        self.restarts += 1
        self.world.server.restart(kill=True)

    # -- invariants -------------------------------------------------------------------
    def _beliefs(self) -> dict[str, tuple[str | None, bool, bool]]:
        return {
            label: (m.handle.token, m.handle.held, m.handle.lost)
            for label, m in self.models.items()
        }

    @invariant()
    def check(self) -> None:
        self.failing = True
        started = time.monotonic()
        self._check()
        SECONDS["check"] += time.monotonic() - started
        self.failing = False

    def _check(self) -> None:
        w = self.world
        for label, m in self.models.items():
            # DESIGN 11: once the handle knows, nothing may still call it held.
            assert _off("lost-held") or not (m.handle.lost and m.handle.held), (
                f"{label} is lost but reports held"
            )
        before = self._beliefs()
        sem = w.keyspace.semaphore(SEMAPHORE)
        keys = [w.keyspace.lock(name).lease for name in NAMES] + [sem.lease, sem.state]
        reply = w.admin.eval(SNAPSHOT, len(keys), *keys)
        after = self._beliefs()
        seconds, micros = (int(x) for x in reply[0])
        now_ms = seconds * 1000 + micros // 1000
        leases = dict(zip(NAMES, reply[1 : 1 + len(NAMES)], strict=True))
        flat_permits, flat_state, eternal = reply[-3:]
        permits = [
            (flat_permits[i], float(flat_permits[i + 1])) for i in range(0, len(flat_permits), 2)
        ]
        sem_state = flat_state[::2]

        def believers(name: str) -> list[Model]:
            out = []
            for label, m in self.models.items():
                if m.spec.name != name:
                    continue
                token, held, _ = before[label]
                still = after[label][1] and after[label][0] == token
                # A handle that knows it lost the lease is judged by "lost-held" alone.
                known = before[label][2] or after[label][2]
                if held and still and not known and not self._excused(m):
                    out.append(m)
            return out

        for name in NAMES:
            raw_token, raw_fence = leases[name]
            token = raw_token.decode() if raw_token else None
            holders = believers(name)
            labels = [m.spec.label for m in holders]
            # Invariant 1.
            assert _off("exclusion") or len(holders) <= 1, (
                f"{labels} all believe they hold {name!r}"
            )
            if holders:
                m = holders[0]
                assert _off("exclusion") or token == m.handle.token, (
                    f"{m.spec.label} believes it holds {name!r}, Redis says "
                    f"{'nobody' if token is None else 'another token'} does"
                )
                assert (
                    _off("exclusion") or raw_fence is not None and int(raw_fence) == m.handle.fence
                ), (
                    f"{m.spec.label} holds {name!r} with fence {m.handle.fence}, Redis says "
                    f"{raw_fence!r}"
                )
            # Invariant 2, along the leases Redis shows.
            if token is not None:
                fence = int(raw_fence)
                seen = self.seen_lease[name]
                if seen is not None and seen[0] != token:
                    assert _off("fence") or fence > seen[1], (
                        f"fence went back on {name!r} in Redis: {seen[1]} then {fence}"
                    )
                self.seen_lease[name] = (token, fence)

        live = {t.decode() for t, score in permits if score > now_ms}
        assert _off("permits") or len(live) <= LIMIT, (
            f"{len(live)} live permits in Redis, limit {LIMIT}"
        )
        reserved = {k[2:].decode() for k in sem_state if k.startswith(b"r:")}
        holders = believers(SEMAPHORE)
        assert _off("permits") or len(holders) <= LIMIT, (
            f"{[m.spec.label for m in holders]} all hold permits"
        )
        for m in holders:
            assert _off("permits") or m.handle.token in live and m.handle.token not in reserved, (
                f"{m.spec.label} believes it holds a permit, Redis says it does not"
            )

        # Invariant 3.
        assert _off("ttl") or not eternal, f"keys without a TTL: {eternal}"
        lock_keys = [k for n in NAMES for k in _lock_key_triple(w.keyspace, n)]
        short = w.admin.eval(OUTLIVED, len(lock_keys), *lock_keys, STATE_KEEP_MS)
        assert _off("ttl") or not short, f"outlived by what they speak of: {short}"

    # -- the end of a run: quiet down, then nothing may leak ---------------------------------
    def teardown(self) -> None:
        w = self.world
        failing = self.failing
        if failing and (not STATS["traces shown"] or _final_replay()):
            STATS["traces shown"] += 1
            print("\n[model] a failing run, step by step:\n  " + "\n  ".join(self.trace))
        for proxy in w.proxies:
            proxy.heal()
        for m in self.models.values():
            m.worker.resume()
            m.armed = False
            if m.job is not None:
                job, m.job = m.job, None
                if failing:
                    job.done.wait(job.bound + HANG)
                else:
                    self.failing = True
                    self._after_acquire(m, self._finish(m, job))
                    self.failing = False
                    failing = self.failing
        for m in self.models.values():
            if m.handle.token is not None:
                job = self._job(m, "release", lambda h=m.handle: _quietly(h.release), CALL)
                job.done.wait(job.bound + HANG)
        if failing:
            return
        self.failing = True
        self._no_leaks()
        self.failing = False

    def _no_leaks(self) -> None:
        """Every name free and every permit back within the longest lease and grace."""
        w = self.world
        probes = [Lock(w.admin, name, ttl=1, keyspace=w.keyspace) for name in NAMES]
        permits = [
            Semaphore(w.admin, SEMAPHORE, LIMIT, ttl=1, keyspace=w.keyspace, grace=GRACE)
            for _ in range(LIMIT)
        ]
        deadline = time.monotonic() + max(s.ttl for s in SPECS) + GRACE + 1.0
        pending: list[Any] = [*probes, *permits]
        try:
            while pending:
                pending = [p for p in pending if not p.acquire(0)]
                if not pending:
                    break
                assert _off("leak") or time.monotonic() < deadline, (
                    f"still taken after every lease ran out: {[p.name for p in pending]}"
                )
                time.sleep(0.01)
        finally:
            for p in [*probes, *permits]:
                if p.token is not None:
                    _quietly(p.release)
        self._check()


def _final_replay() -> bool:
    """Whether Hypothesis is replaying the failure it will report."""
    try:
        return bool(current_build_context().is_final)
    except InvalidArgument:  # driven by hand, outside Hypothesis
        return False


def _quietly(fn: Callable[[], Any]) -> None:
    with contextlib.suppress(LockError, redis.RedisError):
        fn()


def test_model(world: World) -> None:
    """The protocol against its model (see the module docstring)."""
    STATS.clear()
    SECONDS.clear()
    PAUSED_AT.clear()
    LockModel.world = world
    started = time.monotonic()
    # Batches, each with its own fixed seed, until the budget of steps is spent:
    # Hypothesis starts with short runs, so the steps per run are not known ahead.
    batch = 0
    while STATS["steps"] < STEPS:
        config = settings(
            max_examples=max(1, math.ceil((STEPS - STATS["steps"]) / STEPS_PER_RUN)),
            stateful_step_count=STEPS_PER_RUN,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
            phases=(Phase.generate, Phase.shrink) if SHRINK else (Phase.generate,),
            report_multiple_bugs=True,
        )
        print(f"[model] batch {batch}: REDISLOCK_MODEL_SEED={SEED} + {batch}")
        run_state_machine_as_test(seed(SEED + batch)(LockModel), settings=config)
        batch += 1
    took = time.monotonic() - started
    summary = ", ".join(f"{k} {v}" for k, v in sorted(STATS.items()))
    timing = ", ".join(f"{k} {v:.1f}s" for k, v in SECONDS.most_common())
    paused = ", ".join(f"{k} {v}" for k, v in PAUSED_AT.most_common())
    print(f"\n[model] {took:.1f}s, {batch} batch(es): {summary}")
    print(f"[model] time by rule: {timing}\n[model] waiters paused at: {paused}")
