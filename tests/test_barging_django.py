"""``fair=False`` through the Django layer: get_lock, get_async_lock,
``redis_locked`` and ``redis_lock`` pass the barging order to the lock."""

from __future__ import annotations

from typing import Any

import pytest

from django_redislock import (
    current_lock,
    get_async_lock,
    get_lock,
    redis_lock,
    redis_locked,
)
from django_redislock.core.engine import scripts


def test_get_lock_passes_it_on() -> None:
    assert get_lock("dj-fair").fair is True
    lock = get_lock("dj-fair", fair=False)
    assert lock.fair is False and lock._acquire_script is scripts.ACQUIRE_BARGING
    assert lock.acquire(wait=0)
    lock.release()


async def test_get_async_lock_passes_it_on() -> None:
    lock = get_async_lock("dj-fair", fair=False)
    assert lock.fair is False
    assert await lock.acquire(wait=0)
    await lock.release()


def test_decorator_takes_the_lock_barging() -> None:
    seen: list[Any] = []

    @redis_locked("dj-job:{n}", fair=False)
    def job(n: int) -> int:
        seen.append(current_lock())
        return n

    assert job(3) == 3
    assert seen[0].fair is False and seen[0].name == "dj-job:3"

    @redis_locked("dj-job:{n}")
    def default(n: int) -> int:
        seen.append(current_lock())
        return n

    default(4)
    assert seen[1].fair is True


async def test_async_decorator_takes_the_lock_barging() -> None:
    seen: list[Any] = []

    @redis_locked("dj-ajob:{n}", fair=False)
    async def job(n: int) -> int:
        seen.append(current_lock())
        return n

    assert await job(5) == 5
    assert seen[0].fair is False


def test_block_takes_the_lock_barging() -> None:
    with redis_lock("dj-block", fair=False) as lock:
        assert lock.fair is False
        assert lock.owned()


async def test_async_block_takes_the_lock_barging() -> None:
    async with redis_lock("dj-ablock", fair=False) as lock:
        assert lock.fair is False


@pytest.mark.parametrize("bad", ["fifo", 0, None])
def test_bad_values_say_what_to_pass(bad: Any) -> None:
    with pytest.raises(TypeError, match=r"redis_locked\(\): fair must be True .* or False"):
        redis_locked("x", fair=bad)
    with pytest.raises(TypeError, match=r"redis_lock\(\): fair must be True .* or False"):
        redis_lock("x", fair=bad)
    with pytest.raises(TypeError, match=r"fair must be True .* or False"):
        get_lock("x", fair=bad)


def test_several_names_are_refused() -> None:
    with pytest.raises(TypeError, match=r"fair=False applies to one lock name"):
        redis_lock(["a", "b"], fair=False)

    @redis_locked(lambda n: [f"a:{n}", f"b:{n}"], fair=False)
    def cart(n: int) -> int:
        return n

    with pytest.raises(TypeError, match=r"fair=False applies to one lock name"):
        cart(1)
