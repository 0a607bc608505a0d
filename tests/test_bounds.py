"""Every number the library takes has a maximum: at it, accepted; just above, refused.

One table of every duration and count a caller can hand the library
(constructor and call arguments, decorators, factories, the test kit, unique
tasks), and one of the settings the system checks read, each with its
maximum (``django_redislock.core.validate``). Each row runs twice: at the
maximum the call goes through (against a real Redis where it reaches one),
just above it the call raises ``ValueError`` naming the argument, or the
check reports the row's ID naming the setting. Nothing is written to Redis
by a refused call.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.test import override_settings

from django_redislock import connection, get_lock, get_semaphore, redis_lock, redis_locked
from django_redislock.checks import check_settings
from django_redislock.contrib.celery_unique import UniqueTask
from django_redislock.core import (
    MAX_BYTES,
    MAX_COUNT,
    MAX_SECONDS,
    AsyncLock,
    Lock,
    MultiLock,
    ReadWriteLock,
    RedisUnavailable,
)
from django_redislock.core.drivers import rwlock_base as rw_base
from django_redislock.core.drivers import semaphore_base as sem_base
from django_redislock.core.drivers.semaphore import Semaphore
from django_redislock.core.engine import scripts
from django_redislock.core.engine.keys import KeySpace
from django_redislock.core.io import calls
from django_redislock.core.ops.summary import summarize
from django_redislock.idempotency import idempotent
from django_redislock.testing import hold_lock, hold_permits
from django_redislock.throttling.middleware import concurrency_limited

SECONDS = (MAX_SECONDS, math.nextafter(MAX_SECONDS, math.inf))
COUNT = (MAX_COUNT, MAX_COUNT + 1)
BYTES = (MAX_BYTES, MAX_BYTES + 1)
KS = KeySpace()


@dataclasses.dataclass(frozen=True)
class Bound:
    """``take(client, value)`` hands ``value`` to the library as ``name``."""

    label: str
    name: str
    limits: tuple[float, float]
    take: Callable[[redis.Redis, Any], Any]

    def __str__(self) -> str:
        return self.label


def _held(client: redis.Redis, act: Callable[[Lock], Any]) -> None:
    lock = Lock(client, "bounds", ttl=5, wait=0)
    assert lock.acquire()
    try:
        act(lock)
    finally:
        lock.release()


def _acquired(client: redis.Redis, **given: Any) -> None:
    lock = Lock(client, "bounds", ttl=5, wait=0)
    assert lock.acquire(**given)
    lock.release()


def _permit(client: redis.Redis, ttl: float) -> None:
    sem = Semaphore(client, "bounds", 2, ttl=5, wait=0)
    assert sem.acquire(ttl=ttl)
    sem.release()


def _view(request: Any) -> Any:
    raise AssertionError("never called")


class _Run:
    """A stand-in for a Celery task's ``run``."""

    @staticmethod
    def run(feed: int) -> None:
        raise AssertionError("never called")


def _unique(option: str) -> Callable[[redis.Redis, Any], Any]:
    def take(client: redis.Redis, value: Any) -> Any:
        attrs = {"unique_key": "feed:{feed}", option: value, "run": _Run.__dict__["run"]}
        return type("Bounded", (UniqueTask,), attrs)

    return take


ARGUMENTS = [
    Bound("Lock(ttl)", "ttl", SECONDS, lambda c, v: Lock(c, "b", ttl=v)),
    Bound("Lock(wait)", "wait", SECONDS, lambda c, v: Lock(c, "b", wait=v)),
    Bound("Lock(renew_max)", "renew_max", SECONDS, lambda c, v: Lock(c, "b", renew_max=v)),
    Bound("Lock(grace)", "grace", SECONDS, lambda c, v: Lock(c, "b", grace=v)),
    Bound(
        "Lock(replicas_timeout)",
        "replicas_timeout",
        SECONDS,
        lambda c, v: Lock(c, "b", replicas_timeout=v),
    ),
    Bound("Lock(replicas)", "replicas", COUNT, lambda c, v: Lock(c, "b", replicas=v)),
    Bound("AsyncLock(ttl)", "ttl", SECONDS, lambda c, v: AsyncLock(c, "b", ttl=v)),
    Bound("Lock.acquire(ttl)", "ttl", SECONDS, lambda c, v: _acquired(c, ttl=v)),
    Bound("Lock.acquire(wait)", "wait", SECONDS, lambda c, v: _acquired(c, wait=v)),
    Bound("Lock.extend(ttl)", "ttl", SECONDS, lambda c, v: _held(c, lambda h: h.extend(v))),
    Bound("Semaphore(limit)", "limit", COUNT, lambda c, v: Semaphore(c, "b", v)),
    Bound("Semaphore(ttl)", "ttl", SECONDS, lambda c, v: Semaphore(c, "b", 1, ttl=v)),
    Bound("Semaphore.acquire(ttl)", "ttl", SECONDS, _permit),
    Bound("ReadWriteLock(ttl)", "ttl", SECONDS, lambda c, v: ReadWriteLock(c, "b", "read", ttl=v)),
    Bound("MultiLock(wait)", "wait", SECONDS, lambda c, v: MultiLock(c, ["a", "b"], wait=v)),
    Bound("MultiLock(ttl)", "ttl", SECONDS, lambda c, v: MultiLock(c, ["a", "b"], ttl=v)),
    Bound("redis_locked(timeout)", "timeout", SECONDS, lambda c, v: redis_locked("b", timeout=v)),
    Bound("redis_locked(wait)", "wait", SECONDS, lambda c, v: redis_locked("b", wait=v)),
    Bound(
        "redis_locked(renew_max)", "renew_max", SECONDS, lambda c, v: redis_locked("b", renew_max=v)
    ),
    Bound("redis_lock(timeout)", "timeout", SECONDS, lambda c, v: redis_lock("b", timeout=v)),
    Bound("redis_lock(wait)", "wait", SECONDS, lambda c, v: redis_lock("b", wait=v)),
    Bound("get_lock(timeout)", "timeout", SECONDS, lambda c, v: get_lock("b", timeout=v)),
    Bound("get_lock(wait)", "wait", SECONDS, lambda c, v: get_lock("b", wait=v)),
    Bound("get_lock(renew_max)", "renew_max", SECONDS, lambda c, v: get_lock("b", renew_max=v)),
    Bound("get_lock(replicas)", "replicas", COUNT, lambda c, v: get_lock("b", replicas=v)),
    Bound(
        "get_lock(replicas_timeout)",
        "replicas_timeout",
        SECONDS,
        lambda c, v: get_lock("b", replicas_timeout=v),
    ),
    Bound("get_semaphore(limit)", "limit", COUNT, lambda c, v: get_semaphore("b", v)),
    Bound(
        "get_semaphore(timeout)", "timeout", SECONDS, lambda c, v: get_semaphore("b", 1, timeout=v)
    ),
    Bound("concurrency_limited(limit)", "limit", COUNT, lambda c, v: concurrency_limited("b", v)),
    Bound(
        "concurrency_limited(wait)",
        "wait",
        SECONDS,
        lambda c, v: concurrency_limited("b", 1, wait=v),
    ),
    Bound(
        "concurrency_limited(timeout)",
        "timeout",
        SECONDS,
        lambda c, v: concurrency_limited("b", 1, timeout=v),
    ),
    Bound(
        "concurrency_limited(retry_after)",
        "retry_after",
        SECONDS,
        lambda c, v: concurrency_limited("b", 1, retry_after=v),
    ),
    Bound("idempotent(ttl)", "ttl", SECONDS, lambda c, v: idempotent(ttl=v)(_view)),
    Bound("idempotent(wait)", "wait", SECONDS, lambda c, v: idempotent(wait=v)(_view)),
    Bound("idempotent(timeout)", "timeout", SECONDS, lambda c, v: idempotent(timeout=v)(_view)),
    Bound("idempotent(max_body)", "max_body", BYTES, lambda c, v: idempotent(max_body=v)(_view)),
    Bound("UniqueTask.unique_ttl", "ttl", SECONDS, _unique("unique_ttl")),
    Bound("UniqueTask.unique_lease", "lease", SECONDS, _unique("unique_lease")),
    Bound("hold_lock(timeout)", "timeout", SECONDS, lambda c, v: hold_lock("b", timeout=v)),
    Bound("hold_lock(wait)", "wait", SECONDS, lambda c, v: hold_lock("b", wait=v)),
    Bound("hold_permits(limit)", "limit", COUNT, lambda c, v: hold_permits("b", v)),
    Bound("summarize(busiest)", "busiest", COUNT, lambda c, v: summarize([], busiest=v)),
]


@pytest.fixture
def library(r: redis.Redis) -> Iterator[redis.Redis]:
    """The Django layer's client is ``r`` (the session's Redis, flushed per test)."""

    def factory(asyncio: bool = False) -> Any:
        return r

    with override_settings(REDISLOCK={"CLIENT": factory}):
        connection.reset()
        yield r
    connection.reset()


def _nothing_held(client: redis.Redis) -> None:
    """What was taken was given back; what stays (a lock's state) expires."""
    assert not client.exists(KS.lock("bounds").lease, KS.semaphore("bounds").lease)
    assert all(client.pttl(key) > 0 for key in client.scan_iter())


@pytest.mark.parametrize("bound", ARGUMENTS, ids=str)
def test_an_argument_at_its_maximum_is_taken(bound: Bound, library: redis.Redis) -> None:
    bound.take(library, bound.limits[0])
    _nothing_held(library)


@pytest.mark.parametrize("bound", ARGUMENTS, ids=str)
def test_an_argument_above_its_maximum_is_refused(bound: Bound, library: redis.Redis) -> None:
    with pytest.raises(ValueError, match=rf"\b{bound.name}'? must be .* at most") as raised:
        bound.take(library, bound.limits[1])
    assert str(bound.limits[0] if isinstance(bound.limits[0], int) else 31536000) in str(
        raised.value
    )
    _nothing_held(library)


# -- settings: the system checks ----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Setting:
    """``REDISLOCK`` with ``value`` at ``path``; ``check_id`` refuses it, naming ``shown``."""

    shown: str
    check_id: str
    limits: tuple[float, float]
    make: Callable[[Any], dict[str, Any]]

    def __str__(self) -> str:
        return self.shown


def _top(key: str, check_id: str = "E003", limits: tuple[float, float] = SECONDS) -> Setting:
    return Setting(f"REDISLOCK[{key!r}]", check_id, limits, lambda v: {key: v})


def _rule(key: str, check_id: str, limits: tuple[float, float] = SECONDS) -> Setting:
    def make(value: Any) -> dict[str, Any]:
        rule = {"name": "bounded", "path": r"^/bounded/", "limit": 1, key: value}
        return {"THROTTLE": [rule]}

    return Setting(f"'{key}'", check_id, limits, make)


def _idempotency(key: str, limits: tuple[float, float] = SECONDS) -> Setting:
    return Setting(
        f"REDISLOCK['IDEMPOTENCY'][{key!r}]", "E062", limits, lambda v: {"IDEMPOTENCY": {key: v}}
    )


SETTINGS = [
    *(
        _top(key)
        for key in (
            "TIMEOUT",
            "WAIT",
            "SOCKET_TIMEOUT",
            "CONNECT_TIMEOUT",
            "PERMIT_TIMEOUT",
            "REPLICAS_TIMEOUT",
            "UNIQUE_TTL",
            "RENEW_MAX",
        )
    ),
    _top("REPLICAS", "E009", COUNT),
    _rule("limit", "E025", COUNT),
    _rule("wait", "E026"),
    _rule("timeout", "E027"),
    _rule("retry_after", "E030"),
    _idempotency("TTL"),
    _idempotency("WAIT"),
    _idempotency("TIMEOUT"),
    _idempotency("MAX_BODY", BYTES),
    _idempotency("MAX_KEY_LENGTH", BYTES),
]


def _messages(setting: Setting, value: Any) -> list[Any]:
    with override_settings(REDISLOCK=setting.make(value)):
        found = check_settings()
    return [m for m in found if m.id == f"django_redislock.{setting.check_id}"]


@pytest.mark.parametrize("setting", SETTINGS, ids=str)
def test_a_setting_at_its_maximum_passes_the_checks(setting: Setting) -> None:
    assert _messages(setting, setting.limits[0]) == []


@pytest.mark.parametrize("setting", SETTINGS, ids=str)
def test_a_setting_above_its_maximum_fails_the_checks(setting: Setting) -> None:
    [message] = _messages(setting, setting.limits[1])
    assert setting.shown in message.msg
    assert "at most" in message.msg
    assert message.hint


# -- the scripts: a bad value from a bare client leaves no key without a TTL ----------------------
LOCK, SEM, RW = KS.lock("bare"), KS.semaphore("bare"), KS.rwlock("bare")
# What a caller other than this library might send as milliseconds.
BAD_MS = ["10000000000000000000", "1e19", "9999999999999", "-5", "1.5", "abc", ""]


def _lock_args(token: str, ttl: str = "10000", wait: str = "0", keep: str = "20000") -> tuple:
    # acquire.lua: token, ttl, name, owner, wait, channel, state ttl, round
    return (token, ttl, "", "{}", wait, "-", keep, "1")


def _sem_args(token: str, ttl: str = "10000", wait: str = "0", limit: str = "1") -> tuple:
    # sem_acquire.lua: token, ttl, name, owner, wait, channel, grace, unused, limit
    return (token, ttl, "bare", "{}", wait, "-", "2000", "10000", limit)


def _run(client: redis.Redis, script: scripts.Script, keys: Any, args: tuple) -> Any:
    return calls.run(client, script, (keys.lease, keys.queue, keys.state), args)


def _sem_waiter(client: redis.Redis) -> None:
    """A holder of the only permit, and a waiter queued behind it (no channel)."""
    assert _run(client, sem_base.ACQUIRE, SEM, _sem_args("a" * 16))[0] == 1
    assert _run(client, sem_base.ACQUIRE, SEM, _sem_args("b" * 16, wait="10000"))[0] == 0


@dataclasses.dataclass(frozen=True)
class ScriptCase:
    """``call(client, bad)`` runs a script with ``bad`` as a duration, after
    ``setup``; ``writes_first``: the script's own removals come before the check."""

    setup: Callable[[redis.Redis], Any]
    call: Callable[[redis.Redis, str], Any]
    writes_first: bool = False


SCRIPT_CASES = {
    "acquire ttl": ScriptCase(
        lambda c: None,
        lambda c, bad: _run(c, scripts.ACQUIRE, LOCK, _lock_args("a" * 16, ttl=bad)),
    ),
    "acquire state ttl": ScriptCase(
        lambda c: None,
        lambda c, bad: _run(c, scripts.ACQUIRE, LOCK, _lock_args("a" * 16, keep=bad)),
    ),
    "acquire wait, queued": ScriptCase(
        lambda c: _run(c, scripts.ACQUIRE, LOCK, _lock_args("a" * 16)),
        lambda c, bad: _run(c, scripts.ACQUIRE, LOCK, _lock_args("b" * 16, wait=bad)),
    ),
    "extend ttl": ScriptCase(
        lambda c: _run(c, scripts.ACQUIRE, LOCK, _lock_args("a" * 16)),
        lambda c, bad: _run(c, scripts.EXTEND, LOCK, ("a" * 16, bad)),
    ),
    "semaphore acquire ttl": ScriptCase(
        lambda c: None,
        lambda c, bad: _run(c, sem_base.ACQUIRE, SEM, _sem_args("a" * 16, ttl=bad)),
    ),
    "semaphore acquire wait, queued": ScriptCase(
        lambda c: _run(c, sem_base.ACQUIRE, SEM, _sem_args("a" * 16)),
        lambda c, bad: _run(c, sem_base.ACQUIRE, SEM, _sem_args("b" * 16, wait=bad)),
    ),
    "semaphore release grace, a waiter to wake": ScriptCase(
        _sem_waiter,
        lambda c, bad: _run(c, sem_base.RELEASE, SEM, ("a" * 16, bad, "1", "10000", "")),
        writes_first=True,  # the release's own: the permit goes
    ),
    "permit refresh ttl": ScriptCase(
        lambda c: _run(c, sem_base.ACQUIRE, SEM, _sem_args("a" * 16)),
        lambda c, bad: _run(c, scripts.HOLDERS_REFRESH, SEM, ("a" * 16, bad, "10000")),
    ),
    "read-write acquire ttl": ScriptCase(
        lambda c: None,
        lambda c, bad: _run(
            c, rw_base.ACQUIRE, RW, ("a" * 16, bad, "bare", "{}", "0", "-", "2000", "10000", "w")
        ),
    ),
    "idempotency record ttl": ScriptCase(
        lambda c: None,
        lambda c, bad: calls.run(c, RECORD, (b"bare-record",), (bad, "state", "done")),
    ),
}
RECORD = scripts.load("record_replace", prelude=None)


@pytest.mark.parametrize("bad", BAD_MS)
@pytest.mark.parametrize("case", SCRIPT_CASES, ids=str)
def test_a_script_refuses_a_bad_duration_before_it_writes(
    case: str, bad: str, r: redis.Redis
) -> None:
    script = SCRIPT_CASES[case]
    script.setup(r)
    before = {key: r.dump(key) for key in r.scan_iter()}
    with pytest.raises(RedisUnavailable, match="a duration must be a whole number of ms"):
        script.call(r, bad)
    assert [key for key in r.scan_iter() if r.pttl(key) == -1] == []
    if not script.writes_first:
        assert {key: r.dump(key) for key in r.scan_iter()} == before  # nothing written


def test_the_maxima_are_the_documented_ones() -> None:
    """docs/settings.rst, Maxima: a year, a million, 512 MiB; the scripts' 12 digits of ms."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "settings.rst").read_text()
    assert (MAX_SECONDS, MAX_COUNT, MAX_BYTES) == (31_536_000, 1_000_000, 512 * 2**20)
    for shown in ("31,536,000 (a year)", "1,000,000", "536,870,912", "12 digits of milliseconds"):
        assert shown in page
    # A year of milliseconds, with the state's keep time, is well within 12 digits.
    assert len(str(int(MAX_SECONDS * 1000) + 10_000)) <= 12
