# generated from lock_async.py by tools/gen_sync.py; do not edit
"""``Lock``: a Redis lease with fencing, fair queueing and notification wake-ups.

Protocol, one round trip each when uncontended:

* acquire runs ``acquire.lua``: it grants the lease (writing token, fence and
  owner in one go) or, if the caller will wait, appends the caller to the
  lock's FIFO queue along with the process's wake-up channel.
* release runs ``release.lua``: compare-token delete, then the lease is
  handed straight to the oldest live waiter, which is woken through its
  channel with its fence: it holds the lock as it wakes, no second round trip.

Because a freed lock goes straight to the oldest waiter, nobody can barge in
and waits are first come first served across processes. ``fair=False`` opts
into barging instead (``acquire.lua`` told the barging limit, and
``release_barging.lua``): a release frees the lease and wakes the oldest
waiter to look again, and whoever asks first takes it, until the head of the
queue has seen ``BARGE_LIMIT`` others served; then it is handed over as above.

This module is the driver: it sends, receives and waits. What a reply means
and what to do next is decided in ``protocol.py``. It is written once, for
asyncio, and ``tools/gen_sync.py`` makes the sync driver from it by renaming
and dropping ``async`` and ``await``: edit the asyncio source, never the
generated file. What threads and tasks do
differently (the gate, who holds a handle, cancellation, where renewal runs)
lives in the primitives module imported below.

Waiters sleep on the process's wake-up channel (``notify.py``): one
connection however many wait. An acquire interrupted or cancelled at any
point gives back whatever it may have been granted, so a lease is never
left behind it.
"""

from __future__ import annotations

import logging
import os
import time
from types import TracebackType
from typing import Any, TypeVar

from redis.exceptions import RedisError

from ..engine import scripts
from ..engine.protocol import (
    BARGE_DEFER,
    Acquisition,
    Move,
    check_adopted,
    may_have_run,
    renew_interval,
    retry_renewal_in,
    short_of_replicas,
)
from ..exceptions import (
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    RedisUnavailable,
    ReplicationTimeout,
)
from ..io import giveback
from ..io.notify import get_notifier
from ._sync_prims import (
    CLEANUP_TIMEOUT,
    HOLDER_KIND,
    CallTimeout,
    Gate,
    Holder,
    Renewer,
    cancel_requests,
    complete,
    current_holder,
    current_name,
    keep_cancellation,
    raise_if_cancelled_since,
    start_renewal,
    stop_renewal,
)
from .base import LockBase, same_token

__all__ = ["SyncHandle", "Lock"]

log_acquire = logging.getLogger("django_redislock.acquire")
log_renew = logging.getLogger("django_redislock.renew")

_H = TypeVar("_H", bound="SyncHandle")

# A release runs to the end even if its task is cancelled, within this bound
# (the client's socket timeout normally ends it much sooner).
_RELEASE_TIMEOUT = 10.0


class SyncHandle(LockBase):
    """What ``Lock`` and ``Semaphore`` share: the gate, the wait
    loop, and giving back whatever an interrupted or timed-out attempt may hold.

    Shared between threads (sync) or tasks (asyncio), a handle behaves like
    ``threading.Lock`` or ``asyncio.Lock``: a second holder waits for the
    first to release, and only the one that acquired may release. Subclasses
    say how to try (``_attempt``), how to give back (``_cancel``,
    ``_cancel_script``) and what holding starts (``_on_acquired``).
    """

    # Takes the lease or permit, or queues for it; gives back whatever a
    # token may hold or be queued for (safe to repeat).
    _acquire_script: scripts.Script
    _cancel_script: scripts.Script
    # Whether a give-back must wait for the late reply of the call it follows
    # (else the late call could run after it and take what it gave back).
    _give_back_after_late_reply = True

    def _init_driver(self) -> None:
        self._gate = Gate()
        # The thread or task that holds the handle (None: nobody).
        self._holder: Holder | None = None
        self.retry_after: float | None = None

    def _attempt(
        self, token: str, ttl_ms: int, who: str, wait_ms: int, address: bytes
    ) -> tuple[int, int]:
        """Run the acquire script once: (1, fence) or (0, ms until a change)."""
        args = self._args_acquire(token, ttl_ms, who, wait_ms, address)
        if not self.replicas:
            reply = scripts.run(self.client, self._acquire_script, self._key_tuple, args)
            return self._acquire_reply(reply)
        reply, acked = scripts.run_acked(
            self.client,
            self._acquire_script,
            self._key_tuple,
            args,
            self.replicas,
            self.replicas_timeout,
        )
        granted, value = self._acquire_reply(reply)
        if short_of_replicas(granted, acked, self.replicas):
            self._cancel(token)
            raise ReplicationTimeout(
                self.name, acked=acked, wanted=self.replicas, timeout=self.replicas_timeout
            )
        return granted, value

    def _cancel(self, token: str) -> None:
        """Give back whatever ``token`` may hold or be queued for."""
        try:
            # To the end, even if the caller is cancelled meanwhile (asyncio).
            complete(self._cancel_call(token), CLEANUP_TIMEOUT)
        except (RedisUnavailable, CallTimeout) as exc:
            # A queue entry expires at its deadline, a lease or permit handed
            # to us unheard with its TTL; until then, keep trying off our path.
            log_acquire.info("could not leave the queue of %r: %r", self.name, exc)
            self._give_back_later(token, after=exc)

    def _on_acquired(self, ttl_ms: int) -> None:
        """Called once the handle holds what it asked for."""

    def _already_held(self) -> LockError:
        return LockError(
            f"lock {self.name!r} is already held by this handle in this {HOLDER_KIND}; "
            "locks are not reentrant: release it first or use another name"
        )

    def acquire(self, wait: float | None = None, *, ttl: float | None = None) -> bool:
        """Take it, waiting up to ``wait`` seconds (0: try once).

        Returns True when held, False when it stayed busy. Raises
        ``RedisUnavailable`` when Redis cannot be reached: that is not busy.
        """
        wait_s = self._wait_s(wait)
        ttl_ms = self._ttl_ms(ttl)
        if self._pid != os.getpid():
            self._detach_after_fork()
        me = current_holder()
        if self.token is not None and self._holder == me:
            raise self._already_held()
        started = time.monotonic()
        if not self._gate.acquire(wait_s):
            self.observer.busy(self, time.monotonic() - started)
            return False
        try:
            acquired = self._acquire(started + wait_s, ttl_ms)
        except BaseException:
            self._gate.release()
            raise
        if not acquired:
            self._gate.release()
            self.observer.busy(self, time.monotonic() - started)
            return False
        self._holder = me
        self._on_acquired(ttl_ms)
        self.observer.acquired(self, time.monotonic() - started)
        return True

    def _acquire(self, deadline: float, ttl_ms: int) -> bool:
        token = self._new_token()
        who = current_name()
        now = time.monotonic()
        acq = Acquisition(
            ttl_ms=ttl_ms,
            deadline=deadline,
            drift_factor=self.drift_factor,
            can_take_handed=not self.replicas,
            now=now,
            defer=0.0 if self.fair else BARGE_DEFER,
        )
        # Only a process already listening queues on the first attempt; the
        # uncontended path must not start a channel or wait for one.
        notifier = get_notifier(self.client, self.keyspace) if deadline > now else None
        tag = self.keys.tag  # on a Cluster, the wake-up channel lives in this slot
        event = None
        if notifier is not None:
            event = notifier.register_if_ready(token, tag)
            if event is not None:
                acq.listening_on(notifier.address_for(tag))
        cancels = cancel_requests()
        try:
            while True:
                if (
                    event is not None
                    and notifier is not None
                    and acq.queued_without_channel
                    and notifier.is_ready(tag)
                ):
                    # Queued while the channel was down; it is up now: queue
                    # again with it, so that our turn wakes us.
                    acq.channel_up(notifier.address_for(tag))
                self._round, wait_ms = acq.attempt(time.monotonic())
                granted, value = keep_cancellation(
                    self._attempt(token, ttl_ms, who, wait_ms, acq.address)
                )
                # redis-py's send may have swallowed our cancellation (3.11).
                raise_if_cancelled_since(cancels)
                step = acq.on_reply(granted, value, time.monotonic())
                self.retry_after = acq.retry_after
                if step.move is Move.LISTEN and notifier is not None:
                    # First contention in this process: start listening, then
                    # queue at once (the channel must be there to hear our turn).
                    event = notifier.register(token, tag)
                    up = notifier.wait_ready(step.timeout, tag)
                    acq.listening_on(notifier.address_for(tag) if up else None)
                    continue
                if step.move is Move.SLEEP and event is not None and notifier is not None:
                    # Marked first, so that the channel coming up wakes us;
                    # if it came up meanwhile, queue again with it at once.
                    event.needs_channel = acq.queued_without_channel
                    if event.needs_channel and notifier.is_ready(tag):
                        continue
                    handed = notifier.wait(event, step.timeout)
                    step = acq.on_wakeup(handed, time.monotonic())
                    while step.move is Move.SLEEP:
                        # Barging: woken to look again, it lets the releaser go first.
                        handed = notifier.wait(event, step.timeout)
                        step = acq.on_wakeup(handed, time.monotonic())
                    if step.move is Move.RETRY:
                        continue
                if step.move is Move.ACCEPT:
                    self._granted(token, step.fence, acq.sent, ttl_ms)
                    return True
                if step.move is Move.GIVE_BACK:
                    log_acquire.warning("acquire reply for %r came after its validity", self.name)
                    self._cancel(token)
                elif acq.queued:
                    self._cancel(token)  # out of time: leave the queue
                return False
        except RedisUnavailable as exc:
            if may_have_run(exc):
                # The script may have granted or queued us, or may yet, once
                # Redis reads it: give it back, off the caller's path.
                self._give_back_later(token, after=exc)
            raise
        except BaseException:
            # Interrupted (or, asyncio, cancelled at some await): the script
            # may have run and granted us what we asked. Give it back,
            # whatever happens to us.
            self._cancel(token)
            raise
        finally:
            if event is not None and notifier is not None:
                notifier.unregister(token)

    def _give_back_later(self, token: str, after: BaseException | None = None) -> None:
        """Give back whatever ``token`` may hold, retried off the caller's
        path until Redis answers or the lease would have ended anyway;
        ``after``: the failed call it follows, whose late reply comes first."""
        giveback.submit(
            lambda: self._cancel_call(token),
            within=self.ttl,
            after=after if self._give_back_after_late_reply else None,
            what=self._label(),
        )

    def _cancel_call(self, token: str) -> Any:
        return scripts.run(
            self.client, self._cancel_script, self._key_tuple, self._cancel_args(token)
        )

    def _detach_after_fork(self) -> None:
        # A child inherits the parent's handle, not what it holds: it starts free.
        self._pid = os.getpid()
        self._gate = Gate()
        self._holder = None
        self._forget()

    def _in_sorted_set(self) -> bool:
        """``owned()`` of the kinds whose holders are members of a sorted set
        scored by expiry (a semaphore's permits, a read-write lock's turns)."""
        token = self.token
        if token is None or not self.held:
            return False
        try:
            score = self.client.zscore(self.keys.lease, token)
        except RedisError as exc:
            raise RedisUnavailable(f"could not check {self._label()}: {exc}") from exc
        return score is not None and self.held

    # -- context manager ---------------------------------------------------------
    def __enter__(self: _H) -> _H:
        if not self.acquire():
            raise LockNotAcquired(self.name, retry_after=self.retry_after)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.release()
        except LockError:
            # The body's own exception passes through unchanged; loss was
            # already reported to the observer and on_lost.
            if exc_type is None:
                raise

    def _release_call(self, token: str) -> int:
        """Run the release script: 1 when released, 0 when not held."""
        raise NotImplementedError

    def _check_owner(self, action: str) -> str:
        """The token, if this thread or task may ``action`` it; else LockNotOwned."""
        raise NotImplementedError

    def _stop_renewal(self) -> None:
        """Called before releasing; renewing handles stop their renewal."""

    def release(self) -> None:
        """Give it back. Raises ``LockLost`` if it had been lost meanwhile,
        ``RedisUnavailable`` if Redis did not answer (the give-back then goes
        on off the caller's path until Redis answers or the lease ends)."""
        token = self._check_owner("release")
        self._stop_renewal()
        held = time.monotonic() - self._acquired_at
        # Forget first: a renewal in flight that finds the lease gone must see
        # that we let it go, not report it lost.
        self._forget()
        try:
            # To the end, even if the caller is cancelled meanwhile (asyncio).
            released = complete(self._release_call(token), _RELEASE_TIMEOUT)
        except CallTimeout as exc:
            self._give_back_later(token, after=exc)
            raise RedisUnavailable(f"release of {self.name!r} did not finish in time") from exc
        except RedisUnavailable as exc:
            self._give_back_later(token, after=exc)
            raise
        finally:
            self._holder = None
            self._gate.release()
        self._settle_release(released, held)


class Lock(SyncHandle):
    """A lock on ``name`` in Redis, held by this handle.

    ``Lock(client, "purchase:7", ttl=30, wait=10)``. A handle is
    reusable: it may be acquired again after release. Shared between threads
    (sync) or tasks (asyncio), it behaves like ``threading.Lock`` or
    ``asyncio.Lock``: a second holder waits for the first to release, and
    only the one that acquired may release or extend. Not reentrant.

    ``fair=False`` takes it in the barging order (``docs/locks.rst``): a release
    frees the lease and wakes the oldest waiter to look again, whoever asks
    first takes it, and the head of the queue is served within ``BARGE_LIMIT``
    others. More throughput for a hot lock, longer tail waits.
    """

    _acquire_script = scripts.ACQUIRE
    _cancel_script = scripts.CANCEL
    # The lock's cancel remembers the token and its acquire then grants
    # nothing: the give-back need not wait for a late reply that may never
    # come (a reply lost on the way), it frees the name as soon as Redis answers.
    _give_back_after_late_reply = False

    def _init_driver(self) -> None:
        super()._init_driver()
        self._renewer: Renewer | None = None
        self._ttl_ms_held = 0
        if not self.fair:
            # Barging: the acquire script told its limit, and a release of its own.
            self._acquire_script = scripts.ACQUIRE_BARGING

    def _on_acquired(self, ttl_ms: int) -> None:
        self._ttl_ms_held = ttl_ms
        if self.renew:
            self._renewer = start_renewal(self, renew_interval(ttl_ms))

    def _release_call(self, token: str) -> int:
        script = scripts.RELEASE if self.fair else scripts.RELEASE_BARGING
        args = self._release_args(token)
        return int(scripts.run(self.client, script, self._key_tuple, args))

    # -- release / extend ---------------------------------------------------------
    def _check_owner(self, action: str) -> str:
        # A forked child inherits the handle, never what it holds.
        if self.token is None or self._pid != os.getpid():
            raise LockNotOwned(f"cannot {action} {self.name!r}: this handle does not hold it")
        if self._holder != current_holder():
            raise LockNotOwned(
                f"cannot {action} {self.name!r}: it was acquired by another {HOLDER_KIND}"
            )
        return self.token

    def _stop_renewal(self) -> None:
        renewer, self._renewer = self._renewer, None
        stop_renewal(self, renewer)

    def extend(self, ttl: float | None = None) -> None:
        """Reset the lease to ``ttl`` seconds (default: the handle's) from now."""
        token = self._check_owner("extend")
        if self.lost:
            raise LockLost(f"lock {self.name!r} was already lost")
        ttl_ms = self._ttl_ms(ttl)
        sent = time.monotonic()
        try:
            ok = self._extend_call(token, ttl_ms)
        except RedisUnavailable as exc:
            self._reset_unknown(exc, sent, ttl_ms)
            raise
        if not ok:
            self._mark_lost("the lease was gone at extend (expired, cleared or lost by Redis)")
            raise LockLost(f"lock {self.name!r} was lost before it could be extended")
        self._ttl_ms_held = ttl_ms
        if self.token == token and not self.lost:
            self._valid_until = self._validity(sent, ttl_ms)

    def _extend_call(self, token: str, ttl_ms: int) -> bool:
        return bool(scripts.run(self.client, scripts.EXTEND, self._key_tuple, (token, ttl_ms)))

    def owned(self) -> bool:
        """Ask Redis whether this handle still holds the lease (one round trip)."""
        token = self.token
        if token is None or not self.held:
            return False
        try:
            current = self.client.hget(self.keys.lease, "t")
        except RedisError as exc:
            raise RedisUnavailable(f"could not check lock {self.name!r}: {exc}") from exc
        return same_token(current, token) and self.held

    def adopt(self, token: str, fence: int, *, ttl: float | None = None) -> bool:
        """Hold the lease that another handle took as ``token`` with ``fence``.

        For a lease handed across processes (a task's enqueuer to the worker
        that runs it): one round trip resets it to ``ttl`` seconds (default:
        the handle's) from now if ``token`` still holds it, and from then on
        this handle holds it as if it had acquired it, renewal included.
        Returns False, holding nothing, when ``token`` no longer holds it.
        """
        token, fence = check_adopted(token, fence)
        ttl_ms = self._ttl_ms(ttl)
        if self._pid != os.getpid():
            self._detach_after_fork()
        me = current_holder()
        if self.token is not None and self._holder == me:
            raise self._already_held()
        if not self._gate.acquire(0):
            raise LockError(
                f"lock {self.name!r}: this handle is held by another {HOLDER_KIND}; "
                "adopt with a handle of its own"
            )
        sent = time.monotonic()
        try:
            ok = self._extend_call(token, ttl_ms)
        except BaseException:
            self._gate.release()
            raise
        if not ok:
            self._gate.release()
            return False
        self._granted(token, fence, sent, ttl_ms)
        self._holder = me
        self._on_acquired(ttl_ms)
        log_acquire.debug("adopted %r fence=%s", self.name, fence)
        return True

    def detach(self, ttl: float | None = None) -> str:
        """Stop holding the lease without releasing it, for a handle to ``adopt``.

        The lease is reset to ``ttl`` seconds (default: the handle's) from now
        and no longer renewed; returns its token. Raises ``LockLost`` (and the
        handle holds nothing) if the lease was gone.
        """
        token = self._check_owner("detach")
        try:
            if self.lost:
                raise LockLost(f"lock {self.name!r} was already lost")
            self.extend(ttl)
        finally:
            self._stop_renewal()
            self._forget()
            self._holder = None
            self._gate.release()
        return token

    def _renew_once(self) -> float | None:
        """One renewal: seconds until the next, or None to stop."""
        token = self.token
        if token is None or self.lost or self._pid != os.getpid():
            return None
        if self.renew_max is not None and time.monotonic() - self._acquired_at >= self.renew_max:
            log_renew.info("stopped renewing %r after renew_max", self.name)
            return None
        ttl_ms = self._ttl_ms_held
        sent = time.monotonic()
        try:
            ok = self._extend_call(token, ttl_ms)
        except RedisUnavailable as exc:
            self._reset_unknown(exc, sent, ttl_ms)
            delay = retry_renewal_in(self._valid_until, sent, time.monotonic(), ttl_ms)
            if delay is None and self.token == token:
                self._mark_lost(f"could not renew before the lease ran out: {exc}")
            return delay
        if self.token != token:
            return None  # released while we were renewing: nothing to report
        if not ok:
            self._mark_lost("the lease was gone at renewal (expired, cleared or lost by Redis)")
            return None
        if not self.lost:
            self._valid_until = self._validity(sent, ttl_ms)
        return renew_interval(ttl_ms)
