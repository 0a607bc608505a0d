"""The protocol's decisions, with plain numbers: no Redis, no clock."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from django_redislock.core.engine.protocol import (
    Acquisition,
    Move,
    may_have_run,
    renewal_pace,
    retry_renewal_in,
    short_of_replicas,
    validity,
)
from django_redislock.core.engine.wakeup_message import NO_CHANNEL, Handed, parse_wakeup
from django_redislock.core.exceptions import RedisUnavailable


def _acq(*, deadline: float = 10.0, ttl_ms: int = 1000, handed: bool = True) -> Acquisition:
    return Acquisition(
        ttl_ms=ttl_ms, deadline=deadline, drift_factor=0.01, can_take_handed=handed, now=0.0
    )


def test_validity_is_conservative() -> None:
    assert validity(100.0, 1000, 0.01) == pytest.approx(100.0 + 1.0 - 0.01 - 0.002)


def test_a_free_lock_is_taken_in_one_attempt_without_queueing() -> None:
    acq = _acq()
    round_, wait_ms = acq.attempt(0.0)
    assert (round_, wait_ms) == (1, 0)  # not listening yet: never queue
    step = acq.on_reply(1, 42, 0.001)
    assert step.move is Move.ACCEPT and step.fence == 42
    assert not acq.queued


def test_a_grant_that_arrives_after_its_validity_is_given_back() -> None:
    acq = _acq(ttl_ms=1000)
    acq.attempt(0.0)
    assert acq.on_reply(1, 42, 0.99).move is Move.GIVE_BACK


def test_busy_with_no_time_left_gives_up_and_only_a_queued_caller_leaves_a_queue() -> None:
    acq = _acq(deadline=0.0)
    acq.attempt(0.0)
    assert acq.on_reply(0, 500, 0.001).move is Move.GIVE_UP
    assert not acq.queued  # nothing to cancel: a wait=0 busy costs one round trip


def test_first_contention_listens_then_queues_and_sleeps_until_the_state_can_change() -> None:
    acq = _acq(deadline=10.0)
    acq.attempt(0.0)
    step = acq.on_reply(0, 500, 0.001)
    assert step.move is Move.LISTEN and step.timeout == 2.0
    acq.listening_on(b"pchannel")
    round_, wait_ms = acq.attempt(0.002)
    assert round_ == 2 and wait_ms == 9998 and acq.queued
    step = acq.on_reply(0, 500, 0.003)
    assert step.move is Move.SLEEP and step.timeout == 0.5
    assert acq.retry_after == 0.5


def test_a_channel_that_is_not_up_leaves_the_caller_queued_without_it() -> None:
    acq = _acq()
    acq.listening_on(None)
    assert acq.queued_without_channel and acq.address == NO_CHANNEL
    acq.channel_up(b"pchannel")
    assert not acq.queued_without_channel


def test_a_lease_handed_for_the_latest_attempt_is_taken_as_it_is() -> None:
    acq = _acq(ttl_ms=1000)
    acq.listening_on(b"p")
    acq.attempt(0.0)
    acq.on_reply(0, 500, 0.001)
    step = acq.on_wakeup(Handed(fence=7, round=1), 0.1)
    assert step.move is Move.ACCEPT and step.fence == 7


@pytest.mark.parametrize(
    ("handed", "now", "why"),
    [
        (Handed(7, 1), 0.1, "an earlier round"),
        (Handed(7, 3), 0.1, "a round never sent"),
        (Handed(7, 2), 0.6, "less than half the lease left"),
        (None, 0.1, "a look-again"),
    ],
)
def test_anything_else_only_makes_the_waiter_look_again(
    handed: Handed | None, now: float, why: str
) -> None:
    acq = _acq(ttl_ms=1000)
    acq.listening_on(b"p")
    acq.attempt(0.0)
    acq.on_reply(0, 500, 0.001)
    acq.attempt(0.002)
    acq.on_reply(0, 500, 0.003)
    assert acq.on_wakeup(handed, now).move is Move.RETRY, why


def test_a_handoff_during_the_send_of_a_later_attempt_is_not_taken() -> None:
    # The message for round 1 may arrive while round 2 is in flight: the
    # reply to round 2 decides, not the message.
    acq = _acq()
    acq.listening_on(b"p")
    acq.attempt(0.0)
    acq.on_reply(0, 500, 0.001)
    acq.attempt(0.002)  # no reply yet
    assert acq.on_wakeup(Handed(7, 2), 0.003).move is Move.RETRY


def test_with_replicas_a_handed_lease_is_always_confirmed_by_an_acquire() -> None:
    acq = _acq(handed=False)
    acq.listening_on(b"p")
    acq.attempt(0.0)
    acq.on_reply(0, 500, 0.001)
    assert acq.on_wakeup(Handed(7, 1), 0.01).move is Move.RETRY
    assert short_of_replicas(1, 0, 1) and not short_of_replicas(1, 1, 1)
    assert not short_of_replicas(0, 0, 1)


def test_wakeup_messages() -> None:
    assert parse_wakeup(b"abc") == ("abc", None)
    assert parse_wakeup(b"abc:12:3") == ("abc", Handed(12, 3))
    assert parse_wakeup("abc:12") == ("abc", None)  # no round: look again
    assert parse_wakeup(b"abc:x:3") == ("abc", None)


def test_only_a_timeout_leaves_a_script_that_may_have_run() -> None:
    def wrapped(cause: BaseException) -> RedisUnavailable:
        try:
            raise RedisUnavailable("x") from cause
        except RedisUnavailable as exc:
            return exc

    assert may_have_run(wrapped(RedisTimeoutError()))
    assert may_have_run(wrapped(TimeoutError()))
    assert not may_have_run(wrapped(RedisConnectionError()))


def test_a_failed_renewal_retries_while_there_is_time_and_reports_loss_before_the_end() -> None:
    # 30 s lease (a pace of 3 s), 10 s of validity left, the slowest failed call took 1 s.
    assert retry_renewal_in(valid_until=20.0, now=10.0, slowest=1.0, ttl_ms=30_000) == 3.0
    # 5.5 s left: another as slow, as much again to spare and the pace leave 0.5 s.
    assert retry_renewal_in(valid_until=15.5, now=10.0, slowest=1.0, ttl_ms=30_000) == 0.5
    # 4.9 s left: another as slow could end with as much again to spare, not
    # with the pace besides.
    assert retry_renewal_in(valid_until=14.9, now=10.0, slowest=1.0, ttl_ms=30_000) is None


def test_a_renewal_refused_at_once_still_keeps_a_pace_in_hand() -> None:
    # A 1.8 s lease whose renewals fail in no time (connections refused):
    # tries every pace, and reports the loss a pace (0.18 s) before the
    # validity ends, not at its end, where a thread that runs late would
    # report it after Redis expired the key.
    assert renewal_pace(1_800) == pytest.approx(0.18)
    assert retry_renewal_in(valid_until=11.0, now=10.0, slowest=0.0, ttl_ms=1_800) == 0.18
    assert retry_renewal_in(valid_until=11.0, now=10.7, slowest=0.0, ttl_ms=1_800) == (
        pytest.approx(0.12)
    )
    assert retry_renewal_in(valid_until=11.0, now=10.82, slowest=0.0, ttl_ms=1_800) is None
    # Short leases keep 50 ms in hand.
    assert renewal_pace(100) == 0.05


def test_a_renewal_reckons_with_the_slowest_attempt_of_the_outage() -> None:
    # The first attempt waited out a 0.2 s socket timeout; the one after it
    # was refused at once. The next may wait as long as the first: the retry
    # is planned on the slowest, not on the last.
    assert retry_renewal_in(valid_until=11.0, now=10.5, slowest=0.0, ttl_ms=1_800) == 0.18
    assert retry_renewal_in(valid_until=11.0, now=10.5, slowest=0.2, ttl_ms=1_800) is None
