"""The sync and asyncio shells around one generator body, and what they share."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest
from django.test import override_settings

from django_redislock.checks import check_settings
from django_redislock.conf import conf
from django_redislock.locking.factories import LockKwargs, SemaphoreKwargs
from django_redislock.stepping import Steps, run_steps, run_steps_async


class Refused(Exception):
    pass


def _body(calls: list[Any]) -> Steps[list[Any]]:
    """Yields each call; a Refused one is caught, anything else goes on up."""
    seen = []
    for call in calls:
        try:
            seen.append((yield call))
        except Refused as exc:
            seen.append(f"refused: {exc}")
    return seen


def _refuse(message: str) -> None:
    raise Refused(message)


def _fail() -> None:
    raise KeyError("boom")


async def _answer(value: Any) -> Any:
    return value


async def _refuse_async(message: str) -> None:
    raise Refused(message)


def test_blocking_shell_sends_results_and_throws_exceptions_in() -> None:
    calls = [lambda: 1, functools.partial(_refuse, "no"), lambda: 3]
    assert run_steps(_body(calls)) == [1, "refused: no", 3]


def test_awaiting_shell_awaits_each_call() -> None:
    calls = [functools.partial(_answer, 1), functools.partial(_refuse_async, "no")]
    assert asyncio.run(run_steps_async(_body(calls))) == [1, "refused: no"]


def test_what_the_body_does_not_catch_goes_on_up() -> None:
    with pytest.raises(KeyError, match="boom"):
        run_steps(_body([_fail]))

    async def failing() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        asyncio.run(run_steps_async(_body([failing])))


def test_a_body_without_calls_returns_at_once() -> None:
    assert run_steps(_body([])) == []
    assert asyncio.run(run_steps_async(_body([]))) == []


@pytest.mark.parametrize("factory", ["get_lock", "get_async_lock", "get_rw_lock"])
def test_factories_refuse_an_unknown_keyword_as_a_signature_would(factory: str) -> None:
    import django_redislock

    args: tuple[Any, ...] = ("x", "read") if factory == "get_rw_lock" else ("x",)
    with pytest.raises(
        TypeError, match=rf"^{factory}\(\) got an unexpected keyword argument 'wiat'$"
    ):
        getattr(django_redislock, factory)(*args, wiat=1)


def test_semaphore_factories_take_no_lock_only_keyword() -> None:
    from django_redislock import get_semaphore

    assert "renew" in LockKwargs.__annotations__
    assert "renew" not in SemaphoreKwargs.__annotations__
    with pytest.raises(TypeError, match="unexpected keyword argument 'renew'"):
        get_semaphore("x", 2, renew=True)


def test_an_unknown_key_that_is_not_a_str_is_reported() -> None:
    with override_settings(REDISLOCK={1: True, "TIMEOUTT": 5}):
        messages = check_settings()
    assert [(m.id, m.msg) for m in messages] == [
        ("django_redislock.E002", "Unknown REDISLOCK setting(s): 'TIMEOUTT', 1.")
    ]


def test_settings_are_read_only() -> None:
    with pytest.raises(AttributeError, match="read from settings.REDISLOCK"):
        conf.WAIT = 1  # type: ignore[misc]
    with override_settings(REDISLOCK={"WAIT": 3}):
        assert conf.WAIT == 3.0
