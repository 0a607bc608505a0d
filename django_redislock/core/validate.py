"""Seconds and counts the library accepts, with their maxima: checked once, at the edge.

Every duration and count a caller hands the library (a handle's constructor
and call arguments, the decorators' and factories' arguments, the
``REDISLOCK`` settings through the system checks, throttling rules,
idempotency and unique-task TTLs) is tested here, so that no value reaches
Redis, or a timer of Python's, that either would refuse half-way: Redis
refuses an expiry that overflows its clock only after the script wrote the
key, and ``threading`` refuses a wait beyond its ``TIMEOUT_MAX`` in whatever
thread asks. The maxima are far above any use and far below those limits:

* ``MAX_SECONDS``, one year: a lease, a permit, a wait, a record's TTL, a
  socket timeout. A lease that must last longer is renewed (``renew=True``).
* ``MAX_COUNT``, a million: a semaphore's or throttling rule's permits,
  replicas to wait for.
* ``MAX_BYTES``, 512 MiB, the largest value Redis stores: a size in bytes
  (an idempotency record's body, the length of its key).

The Lua scripts check the durations they write into an expiry as well
(at most 12 digits of milliseconds, over 31 years), before they write:
a value from elsewhere than this library is refused, and leaves no key
without a TTL (``core/engine/lua/_prelude.lua``).

``*_problem`` says what is wrong with a value (None when nothing is), in
words a system check or an error message can use; ``check_*`` raises
``TypeError`` (not a number) or ``ValueError`` (out of range) naming the
argument, or returns the value.
"""

from __future__ import annotations

import math

__all__ = [
    "MAX_BYTES",
    "MAX_COUNT",
    "MAX_SECONDS",
    "check_count",
    "check_limit",
    "check_replicas",
    "check_seconds",
    "count_problem",
    "is_seconds",
    "seconds_problem",
    "seconds_range",
]

#: The longest duration the library takes, in seconds: a year.
MAX_SECONDS = 365 * 24 * 3600.0
#: The largest count: permits of a semaphore or a throttling rule, replicas.
MAX_COUNT = 1_000_000
#: The largest size in bytes: 512 MiB, the largest value Redis stores.
MAX_BYTES = 512 * 1024 * 1024


def seconds_range(*, allow_zero: bool) -> str:
    """The accepted range, in words: "more than 0 and at most 31536000 (a year)"."""
    low = "0 or more" if allow_zero else "more than 0"
    return f"{low} and at most {MAX_SECONDS:.0f} (a year)"


def is_seconds(value: object, *, allow_zero: bool) -> bool:
    """Whether ``value`` is a number of seconds the library takes: finite, more
    than 0 (or 0 when ``allow_zero``), at most ``MAX_SECONDS``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if not math.isfinite(value) or value > MAX_SECONDS:
        return False
    return value > 0 or (allow_zero and value == 0)


def seconds_problem(value: object, *, allow_zero: bool) -> str | None:
    """What is wrong with ``value`` as seconds ("must be ...; got ..."), or None."""
    if is_seconds(value, allow_zero=allow_zero):
        return None
    return (
        f"must be a finite number of seconds, {seconds_range(allow_zero=allow_zero)}; got {value!r}"
    )


def check_seconds(what: str, value: object, *, allow_zero: bool) -> float:
    """``value`` as float seconds; ``TypeError`` or ``ValueError`` naming ``what``."""
    # Every handle checks several durations: the common case costs two tests
    # (a float, or an int such as ttl=30, in range).
    if type(value) is float and 0.0 < value <= MAX_SECONDS:
        return value
    if type(value) is int and 0 < value <= MAX_SECONDS:
        return float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {value!r}")
    problem = seconds_problem(value, allow_zero=allow_zero)
    if problem is not None:
        raise ValueError(f"{what} {problem}")
    return float(value)


def count_problem(value: object, *, low: int, high: int, unit: str = "") -> str | None:
    """What is wrong with ``value`` as a whole number from ``low`` to ``high``, or None."""
    if not isinstance(value, bool) and isinstance(value, int) and low <= value <= high:
        return None
    kind = f"a whole number of {unit}" if unit else "a whole number"
    return f"must be {kind}, {low} or more and at most {high}; got {value!r}"


def check_count(what: str, value: object, *, low: int, high: int, unit: str = "") -> int:
    """``value`` as an int; ``TypeError`` or ``ValueError`` naming ``what``."""
    if type(value) is int and low <= value <= high:
        return value  # the common case: one test (bool is not int here)
    if isinstance(value, bool) or not isinstance(value, int):
        kind = f"a whole number of {unit}" if unit else "a whole number"
        raise TypeError(f"{what} must be {kind}, not {value!r}")
    problem = count_problem(value, low=low, high=high, unit=unit)
    if problem is not None:
        raise ValueError(f"{what} {problem}")
    return value


def check_limit(limit: object) -> int:
    """A semaphore's limit: 1 to ``MAX_COUNT`` permits."""
    return check_count("limit", limit, low=1, high=MAX_COUNT, unit="permits")


def check_replicas(replicas: object) -> int:
    """How many replicas must acknowledge a grant: 0 (none) to ``MAX_COUNT``."""
    return check_count("replicas", replicas, low=0, high=MAX_COUNT)
