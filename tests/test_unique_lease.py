"""The core's functions for what a unique task's lease says of its task.

``core/drivers/unique_async.py`` and its generated twin write the task id and
the owner (``unique_note.lua``) and read them back; the Django layer's unique
tasks (tests/test_unique_tasks*.py) go through them only.
"""

from __future__ import annotations

import pytest

from django_redislock.core import RedisUnavailable
from django_redislock.core.drivers.unique import note_task, read_task
from django_redislock.core.drivers.unique_async import note_task_async, read_task_async
from tests.drive import Drive
from tests.servers import free_port


def _note(drive: Drive, *args: object) -> object:
    return (note_task_async if drive.is_async else note_task)(*args)  # type: ignore[arg-type]


def _read(drive: Drive, lock: object) -> object:
    return (read_task_async if drive.is_async else read_task)(lock)  # type: ignore[arg-type]


async def test_nobody_holds_a_free_key(drive: Drive) -> None:
    lock = drive.Lock(drive.client, "unique-free", ttl=10, wait=0)
    assert await drive(_read(drive, lock)) is None


async def test_the_task_id_and_the_run_are_written_for_the_token_that_holds_it(
    drive: Drive,
) -> None:
    lock = drive.Lock(drive.client, "unique-held", ttl=10, wait=0)
    assert await drive(lock.acquire())
    held = await drive(_read(drive, lock))
    assert (held.token, held.fence, held.task_id, held.ran) == (
        lock.token,
        lock.fence,
        None,
        False,
    )
    assert await drive(_note(drive, lock, lock.token, "task-1", ""))
    held = await drive(_read(drive, lock))
    assert (held.task_id, held.ran) == ("task-1", False)
    # A worker adopts it: the owner and the run are written, the id kept.
    assert await drive(_note(drive, lock, lock.token, None, '{"host": "w1"}'))
    held = await drive(_read(drive, lock))
    assert (held.task_id, held.ran) == ("task-1", True)
    await drive(lock.release())


async def test_a_token_that_no_longer_holds_the_lease_writes_nothing(drive: Drive) -> None:
    lock = drive.Lock(drive.client, "unique-other", ttl=10, wait=0)
    assert await drive(lock.acquire())
    assert not await drive(_note(drive, lock, "someone-else", "task-2", '{"host": "w2"}'))
    held = await drive(_read(drive, lock))
    assert (held.token, held.task_id, held.ran) == (lock.token, None, False)
    await drive(lock.release())


async def test_an_unreachable_redis_is_reported_as_unavailable(drive: Drive) -> None:
    async with drive.connect(f"redis://127.0.0.1:{free_port()}/0", socket_timeout=1) as client:
        lock = drive.Lock(client, "unique-down", ttl=10, wait=0)
        with pytest.raises(RedisUnavailable, match="reading unique key 'unique-down'"):
            await drive(_read(drive, lock))
        with pytest.raises(RedisUnavailable):
            await drive(_note(drive, lock, "t", "task-3", ""))
