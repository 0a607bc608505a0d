"""Options that each work alone and cannot be combined fail with a message
that names the fix: barging with a read-write lock, a read-write mode with
several names."""

from __future__ import annotations

import pytest

from django_redislock import redis_lock, redis_locked


def test_barging_read_write_lock_is_refused_when_decorating() -> None:
    with pytest.raises(TypeError, match=r"fair=False applies to an exclusive lock.*mode='read'"):
        redis_locked("report:{pk}", mode="read", fair=False)


def test_barging_read_write_block_is_refused() -> None:
    with pytest.raises(TypeError, match=r"redis_lock\(\): fair=False applies to an exclusive"):
        redis_lock("report:1", mode="write", fair=False)


def test_a_read_write_mode_with_a_key_returning_several_names_is_refused() -> None:
    @redis_locked(lambda pks: [f"doc:{pk}" for pk in pks], mode="read", wait=0)
    def read_docs(pks: list[int]) -> None:
        pass

    with pytest.raises(TypeError, match=r"mode='read' takes one lock name.*doc:1, doc:2"):
        read_docs([1, 2])


async def test_the_same_in_async_code() -> None:
    @redis_locked(lambda pks: [f"doc:{pk}" for pk in pks], mode="write", wait=0)
    async def write_docs(pks: list[int]) -> None:
        pass

    with pytest.raises(TypeError, match=r"mode='write' takes one lock name"):
        await write_docs([1, 2])


def test_barging_with_several_names_is_refused() -> None:
    with pytest.raises(TypeError, match="fair=False applies to one lock name"):
        redis_lock(["a", "b"], fair=False)
