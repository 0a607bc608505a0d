"""One body for a sync path and its asyncio twin: a generator stepped by two thin shells.

The body is a generator that yields each Redis call it needs as a call of no
arguments (``lock.acquire``, ``functools.partial(lock.adopt, ...)``) and gets
its result back, or its exception thrown in. ``run_steps`` makes each call
and blocks; ``run_steps_async`` makes it and awaits what it returns. So the
decisions between the calls are written once, and only the waiting differs.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Generic, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.core.exceptions import SynchronousOnlyOperation

__all__ = ["Steps", "run_steps", "run_steps_async", "sync_from_loop"]

P = ParamSpec("P")
T = TypeVar("T")

# Yields calls of no arguments; receives their results (or their exceptions,
# thrown in); returns T.
Steps = Generator[Callable[[], Any], Any, T]


class _Stepper(Generic[T]):
    """Where a body is: the call it waits on, or, once ``done``, what it returned."""

    def __init__(self, steps: Steps[T]) -> None:
        self.steps = steps
        self.done = False
        self.result: Any = None
        self.call: Callable[[], Any] = _no_call
        self.resume(True, None)

    def resume(self, ok: bool, value: Any) -> None:
        """Give the body the last call's result (``ok``) or exception. What
        the body raises goes on up from here."""
        try:
            self.call = self.steps.send(value) if ok else self.steps.throw(value)
        except StopIteration as stop:
            self.done, self.result, self.call = True, stop.value, _no_call


def _no_call() -> None:
    raise AssertionError("a finished body has no call to make")


def _made(call: Callable[[], Any]) -> tuple[bool, Any]:
    try:
        return True, call()
    except BaseException as exc:  # thrown into the body, which decides
        return False, exc


async def _made_async(call: Callable[[], Any]) -> tuple[bool, Any]:
    try:
        return True, await call()
    except BaseException as exc:  # thrown into the body, which decides
        return False, exc


def run_steps(steps: Steps[T]) -> T:
    """Run ``steps`` to its end, making each call it yields in this thread."""
    stepper = _Stepper(steps)
    while not stepper.done:
        stepper.resume(*_made(stepper.call))
    return stepper.result


async def run_steps_async(steps: Steps[T]) -> T:
    """``run_steps`` on the event loop: what each call returns is awaited."""
    stepper = _Stepper(steps)
    while not stepper.done:
        stepper.resume(*await _made_async(stepper.call))
    return stepper.result


def sync_from_loop(func: Callable[P, T]) -> Callable[P, Awaitable[T]]:
    """``func`` for the event loop: run there, unless it needs the database.

    What reads the request (a lock name template, an idempotency scope) is
    cheap and runs on the loop, until it touches the ORM (``request.user``
    loads the session and the user): then Django refuses, and the call is
    made again in a thread, where sync database access is allowed.
    """

    @functools.wraps(func)
    async def on_loop(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return func(*args, **kwargs)
        except SynchronousOnlyOperation:
            return await sync_to_async(func)(*args, **kwargs)

    return on_loop
