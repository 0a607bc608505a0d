"""A key template is filled from a call's arguments exactly as ``Signature.bind``
would bind them, whichever way the namer binds them."""

from __future__ import annotations

import inspect
import itertools
from typing import Any

import pytest

from django_redislock.locking.naming import Namer


def positional(a: Any, b: Any = "B", c: Any = "C") -> None: ...


def keyword_only(a: Any, *, b: Any, c: Any = "C") -> None: ...


def positional_only(a: Any, /, b: Any = "B", *, c: Any = "C") -> None: ...


def var_args(a: Any, *rest: Any, c: Any = "C") -> None: ...


def var_kwargs(a: Any, b: Any = "B", **c: Any) -> None: ...


SHAPES = [positional, keyword_only, positional_only, var_args, var_kwargs]

# Arguments of every kind, good and bad: too many, too few, unknown, twice,
# a positional-only one by name.
ARGS: list[tuple[Any, ...]] = [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)]
KWARGS: list[dict[str, Any]] = [{}, {"a": 9}, {"b": 8}, {"c": 7}, {"b": 8, "c": 7}, {"z": 6}]


def expected(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | type:
    """The name the template ``{a}|{b}|{c}`` gets from ``Signature.bind``, or
    the exception type of the call."""
    try:
        bound = inspect.signature(func).bind(*args, **kwargs)
    except TypeError:
        return TypeError
    bound.apply_defaults()
    values = dict(bound.arguments)
    if func is var_kwargs:
        # Names in **kwargs count too, below the parameters' own.
        for key, value in values["c"].items():
            values.setdefault(key, value)
    try:
        return ("{a}|{rest}|{c}" if func is var_args else "{a}|{b}|{c}").format_map(values)
    except KeyError:
        return TypeError


@pytest.mark.parametrize("func", SHAPES, ids=lambda f: f.__name__)
def test_a_template_is_filled_as_signature_bind_fills_it(func: Any) -> None:
    template = "{a}|{rest}|{c}" if func is var_args else "{a}|{b}|{c}"
    namer = Namer(template, func)
    quick = 0
    for args, kwargs in itertools.product(ARGS, KWARGS):
        want = expected(func, args, kwargs)
        if want is TypeError:
            with pytest.raises(TypeError):
                namer(args, dict(kwargs))
            continue
        assert namer(args, dict(kwargs)) == want, (args, kwargs)
        quick += namer._fast is not None and namer._fast.values(args, kwargs) is not None
    # Signatures without *args or **kwargs bind every good call the quick way
    # (so the comparison above covers it); the others always bind the full way.
    assert (quick > 0) == (func not in (var_args, var_kwargs))


def test_the_quick_way_refuses_what_it_cannot_bind() -> None:
    fast = Namer("{a}{b}{c}", positional_only)._fast
    assert fast is not None
    assert fast.values((1,), {}) == {"a": 1, "b": "B", "c": "C"}
    assert fast.values((1, 2, 3), {}) is None  # c is keyword-only
    assert fast.values((), {"a": 1}) is None  # a is positional-only
    assert fast.values((1,), {"b": 2, "z": 0}) is None
    assert fast.values((1, 2), {"b": 2}) is None  # b twice
    assert fast.values((), {}) is None  # a missing


def test_a_call_leaves_the_defaults_as_they_were() -> None:
    namer = Namer("{a}|{b}", positional)
    assert namer((1,), {"b": 2}) == "1|2"
    assert namer((1, 3), {}) == "1|3"
    assert namer((1,), {}) == "1|B"


def test_a_constant_name_is_made_once() -> None:
    namer = Namer("jobs:{{all}}", positional)
    assert namer((1,), {}) == "jobs:{all}"
    assert namer._constant == "jobs:{all}"
