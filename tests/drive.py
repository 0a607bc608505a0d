"""One scenario, both drivers: the harness behind the ``drive`` fixture.

A driver test is an ``async def`` that takes ``drive`` and is collected twice,
``[sync]`` and ``[asyncio]``. It builds its handles with ``drive.Lock``,
``drive.Semaphore``, ``drive.ReadWriteLock``, ``drive.MultiLock`` (the sync
classes or their asyncio twins, same arguments) on ``drive.client``, and
passes every driver call through ``await drive(...)``: the sync driver's
result is taken as it is, the asyncio driver's coroutine is awaited.

What threads and tasks do differently lives here, once, as the driver
primitives do in the library:

* ``drive.spawn(fn)`` runs the scenario's other party ``fn()`` (an ``async
  def`` written against ``drive`` too): in a thread for the sync driver, in a
  task for the asyncio one. The handle's owner is that thread or that task.
* ``drive.event()``, ``drive.sleep()``, ``drive.until()``, ``drive.join()``
  and ``drive.holding()`` are a thread's or a task's way to wait;
  ``drive.blocking(fn)`` calls a blocking helper off the loop.
* ``drive.connect(url)`` and ``drive.pooled(n)`` make a client of the
  driver's kind, ``drive.close(client)`` closes one; ``drive.sync_client``
  is the test's own look at Redis; ``drive.clear_semaphore``,
  ``drive.clear_rw_lock`` and ``drive.run_script`` are the driver's twins of
  those functions.

``cdrive`` (conftest) is the same on a private Cluster, ``adrive`` the
asyncio drivers alone, for what only a task can do: be cancelled. A helper
run in a forked child takes ``Drive("sync", client, client)`` and
``run_to_end``.

With the sync driver nothing a scenario awaits ever suspends (each call
blocks its thread instead), so a spawned coroutine runs to its end in one
step, on its own thread, with no event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import redis
import redis.asyncio

from django_redislock.core import (
    AsyncLock,
    AsyncMultiLock,
    AsyncReadWriteLock,
    Lock,
    MultiLock,
    ReadWriteLock,
)
from django_redislock.core.drivers.rwlock import clear_rw_lock
from django_redislock.core.drivers.rwlock_async import clear_rw_lock_async
from django_redislock.core.drivers.semaphore import Semaphore, clear_semaphore
from django_redislock.core.drivers.semaphore_async import AsyncSemaphore, clear_semaphore_async
from django_redislock.core.io import calls, calls_async

T = TypeVar("T")

DRIVERS = ["sync", "asyncio"]


def run_to_end(coro: Coroutine[Any, Any, T]) -> T:
    """Run a sync-driver scenario, which never suspends, without a loop."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a scenario on the sync driver awaited something that suspends")


class _Event:
    """``threading.Event`` or ``asyncio.Event``, waited for alike: a timeout fails."""

    def __init__(self, is_async: bool) -> None:
        self._event = asyncio.Event() if is_async else threading.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self, timeout: float = 20.0) -> None:
        if isinstance(self._event, asyncio.Event):
            try:
                await asyncio.wait_for(self._event.wait(), timeout)
            except asyncio.TimeoutError:
                # The built-in TimeoutError on both drivers (on Python 3.10,
                # asyncio's is a class of its own).
                raise TimeoutError(f"not set within {timeout}s") from None
        elif not self._event.wait(timeout):
            raise TimeoutError(f"not set within {timeout}s")


class _Thread:
    """A spawned party on the sync driver: its result or its exception."""

    def __init__(self, fn: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        try:
            self.result = run_to_end(fn())
        except BaseException as exc:
            self.error = exc

    def done(self) -> bool:
        return not self.thread.is_alive()


class Drive:
    """The sync or the asyncio drivers, and a thread's or a task's way to wait."""

    def __init__(
        self, name: str, client: redis.Redis | redis.asyncio.Redis, sync_client: redis.Redis
    ) -> None:
        self.name = name
        self.is_async = name == "asyncio"
        # What holds a handle, as the driver's messages name it.
        self.party = "task" if self.is_async else "thread"
        self.client: Any = client
        # The test's own look at Redis, the same for both drivers.
        self.sync_client = sync_client
        if self.is_async:
            self.Lock: Any = AsyncLock
            self.Semaphore: Any = AsyncSemaphore
            self.ReadWriteLock: Any = AsyncReadWriteLock
            self.MultiLock: Any = AsyncMultiLock
            self.clear_semaphore: Any = clear_semaphore_async
            self.clear_rw_lock: Any = clear_rw_lock_async
            self.run_script: Any = calls_async.run_async
        else:
            self.Lock = Lock
            self.Semaphore = Semaphore
            self.ReadWriteLock = ReadWriteLock
            self.MultiLock = MultiLock
            self.clear_semaphore = clear_semaphore
            self.clear_rw_lock = clear_rw_lock
            self.run_script = calls.run

    async def __call__(self, result: T | Awaitable[T]) -> T:
        """A driver call's result, whichever driver made it."""
        if self.is_async:
            return await result  # type: ignore[misc, no-any-return]
        # A coroutine here is an asyncio call in a sync scenario: truthy, and a false pass.
        assert not inspect.isawaitable(result), f"the sync driver returned {result!r}"
        return result  # type: ignore[return-value]

    def event(self) -> _Event:
        return _Event(self.is_async)

    async def sleep(self, seconds: float) -> None:
        if self.is_async:
            await asyncio.sleep(seconds)
        else:
            time.sleep(seconds)

    async def until(
        self, predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.005
    ) -> Any:
        """Poll ``predicate`` (plain or awaitable) until truthy; fail after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if self.is_async and isinstance(value, Awaitable):
                value = await value
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout}s: {predicate!r}")
            await self.sleep(interval)

    def spawn(self, fn: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        """Start the other party ``fn()``: a thread, or a task."""
        if self.is_async:
            return asyncio.ensure_future(fn())
        return _Thread(fn)

    async def join(self, *parties: Any, timeout: float = 20.0) -> list[Any]:
        """The results of spawned parties; their first error is raised."""
        if self.is_async:
            return list(await asyncio.wait_for(asyncio.gather(*parties), timeout))
        deadline = time.monotonic() + timeout
        for party in parties:
            party.thread.join(max(0.0, deadline - time.monotonic()))
            assert party.done(), f"a thread still runs after {timeout}s"
        for party in parties:
            if party.error is not None:
                raise party.error
        return [party.result for party in parties]

    @contextlib.asynccontextmanager
    async def connect(self, url: str, **options: Any) -> AsyncIterator[Any]:
        """A client of this driver's kind for another server, closed after."""
        kind = redis.asyncio if self.is_async else redis
        client = kind.Redis.from_url(url, **options)
        try:
            yield client
        finally:
            await self.close(client)

    @contextlib.asynccontextmanager
    async def pooled(self, max_connections: int, timeout: float = 30) -> AsyncIterator[Any]:
        """A client on a few pooled connections that callers queue for."""
        kind = redis.asyncio if self.is_async else redis
        path = self.sync_client.connection_pool.connection_kwargs["path"]
        pool = kind.BlockingConnectionPool(
            connection_class=kind.UnixDomainSocketConnection,
            path=path,
            max_connections=max_connections,
            timeout=timeout,
            socket_timeout=5,
        )
        client = kind.Redis(connection_pool=pool)
        try:
            yield client
        finally:
            await self.close(client)

    async def close(self, client: Any) -> None:
        """Close a client of this driver's kind."""
        await self(client.aclose() if self.is_async else client.close())

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Call the blocking ``fn``: off the loop for the asyncio driver."""
        if self.is_async:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    @contextlib.asynccontextmanager
    async def holding(self, handle: Any) -> AsyncIterator[Any]:
        """``with handle`` or ``async with handle``."""
        if self.is_async:
            async with handle:
                yield handle
        else:
            with handle:
                yield handle
