"""An interrupt stays an interrupt: a lock call cut short while it waits for Redis's reply.

Sync: a timer signal whose handler raises ``KeyboardInterrupt`` or
``SystemExit`` lands while the call waits for the reply of a private Redis
paused with SIGSTOP (the client arms the timer as it starts to read, so it
lands there every time; the handler lets Redis go on before it raises).
Asyncio: the task is cancelled there. For a lock, a semaphore, the decorator
and the throttling decorator (failing open and closed), mid-acquire and
mid-release, every cell of one table asserts the same: the interrupt goes on
as itself, no body runs because of it, the connection that waited is closed
(the next call on the pool gets its own reply), and the name is free again
within its lease.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from django.http import HttpResponse
from django.test import RequestFactory, override_settings

from django_redislock import connection, redis_locked
from django_redislock.core import AsyncLock, Lock
from django_redislock.core.drivers.base import Observer
from django_redislock.core.drivers.semaphore import Semaphore
from django_redislock.core.drivers.semaphore_async import AsyncSemaphore
from django_redislock.throttling.middleware import concurrency_limited
from tests.drive import Drive
from tests.helpers import gen_sync
from tests.servers import RedisServer

LEASE = 5.0  # every lease and permit; also the bound on each wait for a name
NAME = "interrupted"
INTERRUPTS = [KeyboardInterrupt, SystemExit]
PHASES = ["acquire", "release"]


class Trap:
    """A private Redis, paused on demand, and a timer signal that lands while
    a client of it waits for a reply."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.armed = False
        self.interrupt: type[BaseException] = KeyboardInterrupt
        self.fired = 0
        self.socket: Any = None  # the socket that waited for the reply (sync)
        self.writer: Any = None  # the stream that waited for the reply (asyncio)
        self.waiting: asyncio.Event | None = None

    def arm(self, interrupt: type[BaseException] = KeyboardInterrupt) -> None:
        """Pause Redis: the next reply a trapped client reads never comes by itself."""
        self.server.pause()
        self.interrupt = interrupt
        self.armed = True

    def spring(self, conn: Any) -> None:
        """Called by a trapped sync connection as it starts to read the reply."""
        self.armed = False
        self.socket = conn._sock
        signal.setitimer(signal.ITIMER_REAL, 0.01)

    def handler(self, signum: int, frame: Any) -> None:
        self.fired += 1
        self.server.resume()  # what the interrupted call gives back can reach it
        raise self.interrupt("a timer signal")


@pytest.fixture
def trap(redis_factory: type[RedisServer]) -> Iterator[Trap]:
    trap = Trap(redis_factory().start())
    # pytest-timeout's own timer signal, put back afterwards.
    previous = signal.signal(signal.SIGALRM, trap.handler)
    left, interval = signal.getitimer(signal.ITIMER_REAL)
    started = time.monotonic()
    try:
        yield trap
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if left:
            remaining = max(left - (time.monotonic() - started), 0.001)
            signal.setitimer(signal.ITIMER_REAL, remaining, interval)
        trap.server.resume()


def _runs_a_script(command: Any) -> bool:
    data = command if isinstance(command, (bytes, bytearray)) else b"".join(command)
    return b"EVALSHA" in data


def sync_client(trap: Trap) -> redis.Redis:
    """A client of the trap's Redis whose next script call, once the trap is
    armed, meets the timer signal while it waits for the reply."""

    class Connection(redis.UnixDomainSocketConnection):
        trapped = False

        def send_packed_command(self, command: Any, *args: Any, **kwargs: Any) -> None:
            # The test's own thread and a script: not a check the library
            # makes on a thread of its own (the eviction policy, say).
            if trap.armed and threading.current_thread() is threading.main_thread():
                self.trapped = _runs_a_script(command)
            super().send_packed_command(command, *args, **kwargs)

        def read_response(self, *args: Any, **kwargs: Any) -> Any:
            if self.trapped:
                self.trapped = False
                trap.spring(self)
            return super().read_response(*args, **kwargs)

    pool = redis.ConnectionPool(
        connection_class=Connection,
        path=trap.server.socket_path,
        socket_timeout=LEASE,
        socket_connect_timeout=LEASE,
    )
    return redis.Redis(connection_pool=pool)


def async_client(trap: Trap) -> redis.asyncio.Redis:
    class Connection(redis.asyncio.UnixDomainSocketConnection):
        trapped = False

        async def send_packed_command(self, command: Any, *args: Any, **kwargs: Any) -> None:
            if trap.armed:
                self.trapped = _runs_a_script(command)
            await super().send_packed_command(command, *args, **kwargs)

        async def read_response(self, *args: Any, **kwargs: Any) -> Any:
            if self.trapped:
                self.trapped = trap.armed = False
                trap.writer = self._writer
                assert trap.waiting is not None
                trap.waiting.set()
            return await super().read_response(*args, **kwargs)

    pool = redis.asyncio.ConnectionPool(
        connection_class=Connection,
        path=trap.server.socket_path,
        socket_timeout=LEASE,
        socket_connect_timeout=LEASE,
    )
    return redis.asyncio.Redis(connection_pool=pool)


# -- the table: what is interrupted, and how its name is taken again -------------------------
@dataclasses.dataclass(frozen=True)
class Kind:
    """A way to take ``NAME``. ``call(client, trap, phase, ran)`` takes it and
    gives it back, with the trap sprung at ``phase``; a body appends to ``ran``.
    ``again(client, ran)`` takes it again within the lease (True when it did)."""

    label: str
    call: Callable[..., Any]
    again: Callable[..., Any]
    fail_open: bool | None = None

    def __str__(self) -> str:
        return self.label


def _handle_call(make: Callable[..., Any]) -> Callable[..., Any]:
    def call(client: Any, trap: Trap, phase: str, ran: list[int], interrupt: Any = None) -> Any:
        handle = make(client, 0)
        if phase == "acquire":
            trap.arm(interrupt)
            return handle.acquire()
        assert handle.acquire()
        ran.append(1)  # the handle's holder works here
        trap.arm(interrupt)
        return handle.release()

    return call


def _handle_again(make: Callable[..., Any]) -> Callable[..., Any]:
    def again(client: Any, ran: list[int]) -> bool:
        handle = make(client, LEASE)
        if not handle.acquire():
            return False
        ran.append(1)
        handle.release()
        return True

    return again


def _lock(client: Any, wait: float) -> Any:
    return Lock(client, NAME, ttl=LEASE, wait=wait)


def _semaphore(client: Any, wait: float) -> Any:
    return Semaphore(client, NAME, 1, ttl=LEASE, wait=wait)


def _settings(client: Any, fail_open: bool | None) -> Any:
    """``REDISLOCK`` with ``client`` for the library: a trapped client of its
    kind, and the other kind's plain (the eviction check runs on the sync one)."""
    plain: dict[bool, Any] = {}

    def factory(asyncio: bool = False) -> Any:
        if asyncio is isinstance(client, redis.asyncio.Redis):
            return client
        if asyncio not in plain:
            kwargs = client.connection_pool.connection_kwargs
            kind = redis.asyncio.Redis if asyncio else redis.Redis
            plain[asyncio] = kind(unix_socket_path=kwargs["path"], socket_timeout=LEASE)
        return plain[asyncio]

    return override_settings(
        REDISLOCK={"CLIENT": factory, "FAIL_OPEN": fail_open, "THROTTLE_FAIL_OPEN": fail_open}
    )


def _decorated(fail_open: bool) -> Kind:
    def body(trap: Trap | None, phase: str, ran: list[int], interrupt: Any) -> str:
        ran.append(1)
        if trap is not None and phase == "release":
            trap.arm(interrupt)
        return "done"

    def call(client: Any, trap: Trap, phase: str, ran: list[int], interrupt: Any = None) -> Any:
        work = redis_locked(NAME, timeout=LEASE, wait=LEASE, fail_open=fail_open)(body)
        if phase == "acquire":
            trap.arm(interrupt)
        with _settings(client, fail_open):
            return work(trap, phase, ran, interrupt)

    def again(client: Any, ran: list[int]) -> bool:
        work = redis_locked(NAME, timeout=LEASE, wait=LEASE, fail_open=False)(body)
        with _settings(client, False):
            return work(None, "", ran, None) == "done"

    return Kind(f"redis_locked(fail_open={fail_open})", call, again, fail_open)


def _throttled(fail_open: bool) -> Kind:
    rule = f"interrupted-{fail_open}"

    def view(request: Any, trap: Trap | None, phase: str, ran: list[int], interrupt: Any) -> Any:
        ran.append(1)
        if trap is not None and phase == "release":
            trap.arm(interrupt)
        return HttpResponse("done")

    limited = concurrency_limited(rule, 1, wait=LEASE, timeout=LEASE)(view)

    def call(client: Any, trap: Trap, phase: str, ran: list[int], interrupt: Any = None) -> Any:
        if phase == "acquire":
            trap.arm(interrupt)
        with _settings(client, fail_open):
            return limited(RequestFactory().get("/"), trap, phase, ran, interrupt)

    def again(client: Any, ran: list[int]) -> bool:
        with _settings(client, False):
            return limited(RequestFactory().get("/"), None, "", ran, None).status_code == 200

    return Kind(f"concurrency_limited(THROTTLE_FAIL_OPEN={fail_open})", call, again, fail_open)


SYNC_KINDS = [
    Kind("Lock", _handle_call(_lock), _handle_again(_lock)),
    Kind("Semaphore", _handle_call(_semaphore), _handle_again(_semaphore)),
    _decorated(True),
    _decorated(False),
    _throttled(True),
    _throttled(False),
]


@pytest.fixture
def clients_reset() -> Iterator[None]:
    connection.reset()
    yield
    connection.reset()


@pytest.mark.parametrize("interrupt", INTERRUPTS, ids=lambda e: e.__name__)
@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("kind", SYNC_KINDS, ids=str)
def test_a_timer_signal_mid_call_stays_an_interrupt(
    kind: Kind, phase: str, interrupt: type[BaseException], trap: Trap, clients_reset: None
) -> None:
    client = sync_client(trap)
    try:
        # Pooled connections, connected (the library checks the eviction policy
        # of a new client on a thread of its own): the trap lands on the reply.
        thread = connection.check_eviction(client)
        assert thread is not None
        thread.join(LEASE)
        ran: list[int] = []
        with pytest.raises(interrupt) as raised:
            kind.call(client, trap, phase, ran, interrupt)
        assert type(raised.value) is interrupt
        assert trap.fired == 1
        # No body ran because of it: none when the acquire was cut, and the
        # one that ran before a release was cut, no other.
        assert ran == ([] if phase == "acquire" else [1])
        # The connection that waited was closed, not pooled with a reply due.
        assert trap.socket.fileno() == -1
        assert client.echo(b"its own reply") == b"its own reply"
        # Free again within its lease (the interrupted call gave it back).
        assert kind.again(client, ran)
        assert len(ran) == (1 if phase == "acquire" else 2)
    finally:
        client.close()
        client.connection_pool.disconnect()  # the client's own pool: closing leaves it open


# -- asyncio: the task is cancelled where the thread was interrupted ---------------------------
def _async_lock(client: Any, wait: float) -> Any:
    return AsyncLock(client, NAME, ttl=LEASE, wait=wait)


def _async_semaphore(client: Any, wait: float) -> Any:
    return AsyncSemaphore(client, NAME, 1, ttl=LEASE, wait=wait)


def _async_handle_call(make: Callable[..., Any], renewal: str) -> Callable[..., Any]:
    async def call(client: Any, trap: Trap, phase: str, ran: list[int]) -> Any:
        handle = make(client, 0)
        if phase == "acquire":
            trap.arm()
            return await handle.acquire()
        assert await handle.acquire()
        ran.append(1)
        if phase == "extend":
            trap.arm()
            try:
                return await getattr(handle, renewal)()
            finally:
                await handle.release()
        trap.arm()
        return await handle.release()

    return call


def _async_handle_again(make: Callable[..., Any]) -> Callable[..., Any]:
    async def again(client: Any, ran: list[int]) -> bool:
        handle = make(client, LEASE)
        if not await handle.acquire():
            return False
        ran.append(1)
        await handle.release()
        return True

    return again


def _async_decorated(fail_open: bool) -> Kind:
    async def body(trap: Trap | None, phase: str, ran: list[int]) -> str:
        ran.append(1)
        if trap is not None and phase == "release":
            trap.arm()
        return "done"

    async def call(client: Any, trap: Trap, phase: str, ran: list[int]) -> Any:
        work = redis_locked(NAME, timeout=LEASE, wait=LEASE, fail_open=fail_open)(body)
        if phase == "acquire":
            trap.arm()
        with _settings(client, fail_open):
            return await work(trap, phase, ran)

    async def again(client: Any, ran: list[int]) -> bool:
        work = redis_locked(NAME, timeout=LEASE, wait=LEASE, fail_open=False)(body)
        with _settings(client, False):
            return await work(None, "", ran) == "done"

    return Kind(f"redis_locked(fail_open={fail_open})", call, again, fail_open)


def _async_throttled(fail_open: bool) -> Kind:
    rule = f"ainterrupted-{fail_open}"

    async def view(request: Any, trap: Trap | None, phase: str, ran: list[int]) -> Any:
        ran.append(1)
        if trap is not None and phase == "release":
            trap.arm()
        return HttpResponse("done")

    limited = concurrency_limited(rule, 1, wait=LEASE, timeout=LEASE)(view)

    async def call(client: Any, trap: Trap, phase: str, ran: list[int]) -> Any:
        if phase == "acquire":
            trap.arm()
        with _settings(client, fail_open):
            return await limited(RequestFactory().get("/"), trap, phase, ran)

    async def again(client: Any, ran: list[int]) -> bool:
        with _settings(client, False):
            response = await limited(RequestFactory().get("/"), None, "", ran)
            return response.status_code == 200

    return Kind(f"concurrency_limited(THROTTLE_FAIL_OPEN={fail_open})", call, again, fail_open)


ASYNC_CASES = [
    *[
        (Kind("AsyncLock", _async_handle_call(_async_lock, "extend"), again), phase)
        for again in [_async_handle_again(_async_lock)]
        for phase in [*PHASES, "extend"]
    ],
    *[
        (Kind("AsyncSemaphore", _async_handle_call(_async_semaphore, "refresh"), again), phase)
        for again in [_async_handle_again(_async_semaphore)]
        for phase in [*PHASES, "extend"]
    ],
    *[
        (kind, phase)
        for kind in [
            _async_decorated(True),
            _async_decorated(False),
            _async_throttled(True),
            _async_throttled(False),
        ]
        for phase in PHASES
    ],
]


@pytest.mark.parametrize(
    ("kind", "phase"), ASYNC_CASES, ids=[f"{kind}-{phase}" for kind, phase in ASYNC_CASES]
)
async def test_a_cancellation_mid_call_stays_a_cancellation(
    kind: Kind, phase: str, redis_factory: type[RedisServer], clients_reset: None
) -> None:
    trap = Trap(redis_factory().start())
    trap.waiting = asyncio.Event()
    client = async_client(trap)
    try:
        await client.ping()
        ran: list[int] = []
        task = asyncio.create_task(kind.call(client, trap, phase, ran))
        await asyncio.wait_for(trap.waiting.wait(), LEASE)
        task.cancel()
        trap.server.resume()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ran == ([] if phase == "acquire" else [1])
        assert await client.echo(b"its own reply") == b"its own reply"
        if phase == "extend":
            # Cut mid-read (nothing shields an extend): its connection was closed.
            assert trap.writer.is_closing()
        assert await kind.again(client, ran)
    finally:
        trap.server.resume()
        await client.aclose()
        await client.connection_pool.disconnect()  # closing leaves a pool given to it open


# -- the rules that keep it so ----------------------------------------------------------------
PACKAGE = Path(__file__).resolve().parent.parent / "django_redislock"
# Handlers of BaseException that do not re-raise it themselves, and why.
HANDED_ON = {
    # A stepped body's call failed: the exception is thrown into the body,
    # which re-raises what it does not handle (and handles only Exceptions).
    ("stepping.py", "_made"),
    ("stepping.py", "_made_async"),
}


def _catches_base(handler: ast.ExceptHandler) -> bool:
    kinds = handler.type
    names = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
    return kinds is None or any(isinstance(n, ast.Name) and n.id == "BaseException" for n in names)


def _keepers(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.ExceptHandler) and _catches_base(node):
                last = node.body[-1]
                reraises = isinstance(last, ast.Raise) and last.exc is None
                if not reraises and (path.name, function.name) not in HANDED_ON:
                    found.append(f"{path.relative_to(PACKAGE)} line {node.lineno}")
            if isinstance(node, ast.Call) and any(
                isinstance(a, ast.Name) and a.id == "BaseException" for a in node.args
            ):
                found.append(f"{path.relative_to(PACKAGE)} line {node.lineno} (a call)")
    return found


def test_no_handler_in_the_package_keeps_an_interrupt() -> None:
    # Every handler of BaseException (or bare except) ends by raising what it
    # caught, unchanged: it may clean up, never convert, log away or swallow.
    keepers = [found for path in sorted(PACKAGE.rglob("*.py")) for found in _keepers(path)]
    assert keepers == []


REFUSED = {
    "names asyncio": "import asyncio\n",
    "asyncio's cancellation by name": (
        "async def f():\n    try:\n        await g()\n"
        "    except asyncio.CancelledError:\n        raise\n"
    ),
    "converts": (
        "async def f():\n    try:\n        await g()\n"
        "    except BaseException as exc:\n        raise Failed(exc) from exc\n"
    ),
    "swallows": (
        "async def f():\n    try:\n        await g()\n    except BaseException:\n        pass\n"
    ),
    "returns instead": (
        "async def f():\n    try:\n        await g()\n"
        "    except BaseException:\n        if h():\n            return None\n        raise\n"
    ),
    "a bare except that logs": (
        "async def f():\n    try:\n        await g()\n    except:\n        log()\n"
    ),
    "suppresses": ("async def f():\n    with suppress(BaseException):\n        await g()\n"),
}


@pytest.mark.parametrize("source", REFUSED.values(), ids=REFUSED.keys())
def test_the_generator_refuses_asyncio_meaning(source: str) -> None:
    generator = gen_sync()
    with pytest.raises(generator.Refused):
        generator.check_source(source, "x_async.py")


def test_the_generator_takes_cleanup_that_re_raises_and_every_source() -> None:
    generator = gen_sync()
    cleanup = (
        "async def f(failure: BaseException | None) -> None:\n    try:\n        await g()\n"
        "    except Cancelled:\n        pass\n"
        "    except BaseException:\n        await undo()\n        raise\n"
    )
    generator.check_source(cleanup, "x_async.py")
    for source, _target in generator.PAIRS:
        generator.check_source((PACKAGE.parent / source).read_text(encoding="utf-8"), str(source))


# -- between the grant and the return ---------------------------------------------------------
class _Interrupted(Observer):
    """Reports the grant, and is interrupted as it does (a signal landing in a
    receiver of ``lock_acquired``, say)."""

    def __init__(self, interrupt: type[BaseException]) -> None:
        self.interrupt = interrupt

    def acquired(self, lock: Any, waited: float) -> None:
        raise self.interrupt("as the grant was reported")


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, RuntimeError], ids=lambda e: e.__name__)
async def test_an_interrupt_between_the_grant_and_the_return_lets_the_lock_go(
    drive: Drive, interrupt: type[BaseException]
) -> None:
    # The caller never learns it holds the lock, so it never releases it; a
    # renewal would keep the name taken for as long as the process lives.
    lock = drive.Lock(
        drive.client, NAME, ttl=1, wait=0, renew=True, observer=_Interrupted(interrupt)
    )
    with pytest.raises(interrupt):
        await drive(lock.acquire())
    assert lock.token is None and not lock.held
    other = drive.Lock(drive.client, NAME, ttl=1, wait=LEASE)
    assert await drive(other.acquire())  # given back: free within its lease (and at once)
    assert await drive(other.owned())
    await drive(other.release())
