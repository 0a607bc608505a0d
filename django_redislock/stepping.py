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
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.core.exceptions import SynchronousOnlyOperation

__all__ = ["Steps", "run_steps", "run_steps_async", "sync_from_loop"]

P = ParamSpec("P")
T = TypeVar("T")

# Yields calls of no arguments; receives their results (or their exceptions,
# thrown in); returns T.
Steps = Generator[Callable[[], Any], Any, T]


def run_steps(steps: Steps[T]) -> T:
    """Run ``steps`` to its end, making each call it yields in this thread."""
    resume: Callable[[Any], Callable[[], Any]] = steps.send
    value: Any = None
    while True:
        try:
            call = resume(value)
        except StopIteration as done:
            return done.value
        try:
            value, resume = call(), steps.send
        except BaseException as exc:  # thrown in: what the body does not catch goes on up
            value, resume = exc, steps.throw


async def run_steps_async(steps: Steps[T]) -> T:
    """``run_steps`` on the event loop: what each call returns is awaited."""
    resume: Callable[[Any], Callable[[], Any]] = steps.send
    value: Any = None
    while True:
        try:
            call = resume(value)
        except StopIteration as done:
            return done.value
        try:
            value, resume = await call(), steps.send
        except BaseException as exc:  # thrown in: what the body does not catch goes on up
            value, resume = exc, steps.throw


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
