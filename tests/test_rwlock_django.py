"""Read-write locks through the Django layer: helpers, signals, ``mode=`` on decorator and block."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import django_redislock
from django_redislock import (
    LockError,
    LockNotAcquired,
    current_fence,
    current_lock,
    get_async_rw_lock,
    get_rw_lock,
    redis_lock,
    redis_locked,
)
from django_redislock.core import AsyncReadWriteLock, ReadWriteLock
from django_redislock.signals import lock_acquired, lock_busy, lock_lost, lock_released


def test_exports() -> None:
    assert django_redislock.ReadWriteLock is ReadWriteLock
    assert django_redislock.AsyncReadWriteLock is AsyncReadWriteLock
    from django_redislock import core

    assert core.ReadWriteLock is ReadWriteLock


def test_helpers_send_the_lock_signals() -> None:
    heard: list[tuple[str, Any]] = []

    def record(signal_name: str):  # noqa: ANN202
        def receiver(sender: Any, **kw: Any) -> None:
            heard.append((signal_name, kw["name"]))

        return receiver

    receivers = {
        "acquired": record("acquired"),
        "busy": record("busy"),
        "released": record("released"),
        "lost": record("lost"),
    }
    lock_acquired.connect(receivers["acquired"])
    lock_busy.connect(receivers["busy"])
    lock_released.connect(receivers["released"])
    lock_lost.connect(receivers["lost"])
    try:
        reader = get_rw_lock("doc:1", "read", timeout=0.3, metric_name="doc")
        assert isinstance(reader, ReadWriteLock) and reader.mode == "read"
        assert reader.metric_name == "doc"
        assert reader.acquire()
        assert not get_rw_lock("doc:1", "write", wait=0).acquire()
        writer = get_rw_lock("doc:1", "write", wait=5)
        assert writer.acquire()  # the reader's lease ran out
        with pytest.raises(LockError):
            reader.release()
        writer.release()
    finally:
        for signal, receiver in zip(
            (lock_acquired, lock_busy, lock_released, lock_lost), receivers.values(), strict=True
        ):
            signal.disconnect(receiver)
    assert heard == [
        ("acquired", "doc:1"),
        ("busy", "doc:1"),
        ("acquired", "doc:1"),
        ("lost", "doc:1"),
        ("released", "doc:1"),
    ]


def test_invalid_mode_fails_at_decoration_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"mode must be 'read' or 'write' .* or None"):
        redis_locked("doc:{pk}", mode="shared")
    with pytest.raises(ValueError, match=r"redis_lock\(\): mode must be 'read' or 'write'"):
        redis_lock("doc", mode="exclusive")
    with pytest.raises(TypeError, match="one lock name"):
        redis_lock(["a", "b"], mode="read")

    @redis_locked(lambda pk: [f"a:{pk}", f"b:{pk}"], mode="write")
    def several(pk: int) -> None:
        raise AssertionError("never runs")

    with pytest.raises(TypeError, match="one lock name, not several"):
        several(1)


@redis_locked("doc:{pk}", mode="read", wait=0)
def read_doc(pk: int) -> Any:
    return current_lock()


@redis_locked("doc:{pk}", mode="write", wait=0)
def write_doc(pk: int) -> Any:
    return current_fence()


def test_decorated_readers_share_writer_waits() -> None:
    holder = get_rw_lock("doc:2", "read")
    assert holder.acquire()
    lock = read_doc(2)
    assert isinstance(lock, ReadWriteLock) and lock.mode == "read"
    with pytest.raises(LockNotAcquired):
        write_doc(2)
    holder.release()
    assert isinstance(write_doc(2), int)


def test_plain_and_rw_locks_of_one_name_are_separate() -> None:
    with redis_lock("doc:3"), redis_lock("doc:3", mode="write", wait=0) as w:
        assert isinstance(w, ReadWriteLock) and current_fence() == w.fence


def test_nesting_read_in_write_runs_under_the_writer_and_upgrade_is_refused() -> None:
    with redis_lock("doc:4", mode="write") as w:
        with redis_lock("doc:4", mode="read") as inner:
            assert inner is w
        assert read_doc(4) is w
    with redis_lock("doc:4", mode="read"):
        with pytest.raises(LockError, match="not upgraded"):
            write_doc(4)
        with pytest.raises(LockError, match="not upgraded"), redis_lock("doc:4", mode="write"):
            pass


def test_readers_in_threads_overlap_under_the_decorator() -> None:
    barrier = threading.Barrier(3, timeout=10)
    errors: list[BaseException] = []

    @redis_locked("doc:{pk}", mode="read", wait=10)
    def read_and_meet(pk: int) -> None:
        barrier.wait()

    def run() -> None:
        try:
            read_and_meet(5)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors


@pytest.mark.django_db
def test_view_busy_while_a_writer_holds() -> None:
    from django.http import HttpResponse
    from django.test import RequestFactory

    @redis_locked("page:{pk}", mode="read", wait=0)
    def view(request: Any, pk: int) -> HttpResponse:
        return HttpResponse("ok")

    request = RequestFactory().get("/")
    assert view(request, pk=1).status_code == 200
    writer = get_rw_lock("page:1", "write")  # another caller's, not this call's
    assert writer.acquire()
    response = view(request, pk=1)
    writer.release()
    assert response.status_code == 409 and response["Retry-After"]


async def test_async_decorator_and_block() -> None:
    @redis_locked("doc:{pk}", mode="write", wait=0)
    async def write(pk: int) -> Any:
        return current_lock()

    lock = await write(6)
    assert isinstance(lock, AsyncReadWriteLock) and lock.fence is not None
    async with redis_lock("doc:6", mode="read") as reader:
        assert isinstance(reader, AsyncReadWriteLock) and reader.write_fence == lock.fence
        with pytest.raises(LockNotAcquired):
            await asyncio.create_task(write(6))  # another task: not this block's
        with pytest.raises(LockError, match="not upgraded"):
            await write(6)
    other = get_async_rw_lock("doc:6", "write", wait=0)
    assert await other.acquire()
    await other.release()


def test_metrics_count_under_the_metric_name() -> None:
    from django.test import override_settings

    from django_redislock.ops import metrics as rl_metrics
    from tests.test_metrics import PROM, holds, outcome

    with override_settings(REDISLOCK=PROM):
        assert rl_metrics.installed() == ["prometheus"]
        before = outcome("catalogue", "lock", "acquired"), outcome("catalogue", "lock", "busy")
        held_before = holds("catalogue", "lock")
        reader = get_rw_lock("catalogue:1", "read", metric_name="catalogue")
        assert reader.acquire()
        assert not get_rw_lock("catalogue:1", "write", wait=0, metric_name="catalogue").acquire()
        reader.release()
        assert outcome("catalogue", "lock", "acquired") == before[0] + 1
        assert outcome("catalogue", "lock", "busy") == before[1] + 1
        assert holds("catalogue", "lock") == held_before + 1


# -- views, through both request paths ---------------------------------------------------
@redis_locked("page:{pk}", mode="read", wait=0)
def read_page(request: Any, pk: int) -> Any:
    from django.http import HttpResponse

    return HttpResponse(f"read {current_fence()}")


@redis_locked("page:{pk}", mode="write", wait=0)
async def write_page(request: Any, pk: int) -> Any:
    from django.http import HttpResponse

    return HttpResponse(f"write {current_fence()}")


def _urls() -> list[Any]:
    from django.urls import path

    return [path("read/<int:pk>/", read_page), path("write/<int:pk>/", write_page)]


urlpatterns = _urls()


@pytest.fixture(params=["client", "async_client"])
def get(request: pytest.FixtureRequest) -> Any:
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient, Client

    from tests.test_decorators import close_async_clients

    if request.param == "client":
        client = Client(raise_request_exception=False)
        return lambda url: client.get(url)

    async def aget(url: str) -> Any:
        try:
            return await AsyncClient(raise_request_exception=False).get(url)
        finally:
            await close_async_clients()

    return lambda url: async_to_sync(aget)(url)


@pytest.mark.django_db
@pytest.mark.urls("tests.test_rwlock_django")
def test_views_readers_share_and_a_writer_is_refused_while_they_read(get: Any) -> None:
    reader = get_rw_lock("page:9", "read")
    assert reader.acquire()
    response = get("/read/9/")
    assert response.status_code == 200 and response.content == b"read None"
    response = get("/write/9/")
    assert response.status_code == 409 and response["Retry-After"]
    reader.release()
    response = get("/write/9/")
    assert response.status_code == 200 and int(response.content.split()[1]) > 0
    writer = get_rw_lock("page:9", "write")
    assert writer.acquire()
    assert get("/read/9/").status_code == 409
    writer.release()


def test_fenced_update_refuses_a_readers_missing_fence() -> None:
    from django_redislock.fencing import fenced_update
    from tests.testapp.models import Product

    with redis_lock("doc:10", mode="read"):
        assert current_fence() is None
        with pytest.raises(TypeError, match="needs the lock's fencing token"):
            fenced_update(Product.objects.none(), current_fence(), stock=1)
