"""Lock names from a call's arguments: a ``str.format`` template or a callable.

A template is checked when the decorator is applied: its placeholders must
name parameters of the decorated callable (or may arrive in its ``**kwargs``).
"""

from __future__ import annotations

import functools
import inspect
import re
import string
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from ..core import lock_names

_formatter = string.Formatter()
_ROOT = re.compile(r"[^.\[]*")


def _template_fields(template: str) -> Iterator[str]:
    for _literal, field, spec, _conversion in _formatter.parse(template):
        if field is None:
            continue
        yield field
        if spec:
            # "{amount:{width}}": nested fields are arguments too.
            yield from _template_fields(spec)


def parse_template(template: str) -> list[str]:
    """The root names a template uses, checked for syntax; raises ValueError."""
    try:
        fields = list(_template_fields(template))
    except ValueError as exc:
        raise ValueError(
            f"redis_locked(): lock key {template!r} is not a valid str.format template "
            f"({exc}); write placeholders as {{name}} and double literal braces ({{{{ }}}})"
        ) from None
    roots = []
    for field in fields:
        match = _ROOT.match(field)
        root = match.group() if match else ""
        if not root or root.isdigit():
            raise ValueError(
                f"redis_locked(): lock key {template!r} has a positional placeholder "
                f"{{{field}}}; name the parameter instead, as in 'purchase:{{product_id}}'"
            )
        roots.append(root)
    return roots


def describe(func: Callable[..., Any]) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)


class Namer:
    """Computes the lock name of one call of one callable."""

    def __init__(self, key: str | Callable[..., Any], func: Callable[..., Any]) -> None:
        self.key = key
        self.where = describe(func)
        self.extra: dict[str, Any] = {}
        target = func
        if isinstance(func, functools.partial) and inspect.ismethod(func.func):
            # method_decorator hands decorators a partial of the bound method:
            # it is called without self, but self is still worth naming.
            target = func.func
            self.extra["self"] = func.func.__self__
        self.signature: inspect.Signature | None = None
        self.var_keyword: str | None = None
        self._fast: _FastBind | None = None
        self._constant: str | None = None
        if not isinstance(key, str):
            return
        roots = parse_template(key)
        if not roots:
            self._constant = key.format()  # a constant name: nothing to bind
            return
        try:
            self.signature = inspect.signature(target)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"redis_locked(): cannot read the signature of {self.where} ({exc}); "
                "pass a callable key instead of a template"
            ) from None
        params = self.signature.parameters
        for param in params.values():
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                self.var_keyword = param.name
        self._fast = _FastBind.of(self.signature)
        known = set(params) | set(self.extra)
        for root in roots:
            if root in known or self.var_keyword is not None:
                # With **kwargs, a name may arrive there (URL kwargs in dispatch).
                continue
            raise ValueError(
                f"redis_locked(): lock key {key!r} uses {{{root}}}, which is not a "
                f"parameter of {self.where}{self.signature}; use one of "
                f"{', '.join(sorted(known)) or '(none)'}, or pass a callable key"
            )

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | tuple[str, ...]:
        key = self.key
        if not isinstance(key, str):
            name = key(*args, **kwargs)
            if isinstance(name, (list, tuple, set, frozenset)) and name:
                try:
                    return lock_names(name)  # several names: all locked, or none
                except TypeError as exc:
                    raise TypeError(f"the lock key callable of {self.where}: {exc}") from None
            if not isinstance(name, str) or not name:
                raise TypeError(
                    f"the lock key callable of {self.where} returned {name!r}; "
                    "it must return a non-empty str, or a non-empty list of them"
                )
            return name
        if self._constant is not None:
            return self._constant
        fast = self._fast
        values = fast.values(args, kwargs) if fast is not None else None
        if values is None:
            values = self._bound(args, kwargs)
        if self.extra:
            values.update(self.extra)
        try:
            # str.format_map fills a template as string.Formatter does, in C.
            return key.format_map(values)
        except KeyError as exc:
            raise TypeError(
                f"lock key {key!r} of {self.where} needs {{{exc.args[0]}}}, but this call "
                f"has no such argument (only {', '.join(sorted(values))})"
            ) from None

    def _bound(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments by name, as ``Signature.bind`` sees them (a call
        that does not fit the signature raises its ``TypeError``)."""
        assert self.signature is not None
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        if self.var_keyword is not None:
            for k, v in values.get(self.var_keyword, {}).items():
                values.setdefault(k, v)
        return values


class _FastBind:
    """``Signature.bind`` and ``apply_defaults`` for a call that fits a
    signature without ``*args`` or ``**kwargs``: its arguments by name, or
    None for anything else (too many, unknown or repeated, a required one
    missing), which ``Namer._bound`` then binds, or refuses, as Python would.
    The common case (a view's or a task's named parameters) costs a few
    dict operations instead of a pure-Python bind per call."""

    __slots__ = ("defaults", "keywords", "positional", "required")

    def __init__(
        self,
        positional: tuple[str, ...],
        keywords: frozenset[str],
        required: frozenset[str],
        defaults: dict[str, Any],
    ) -> None:
        self.positional = positional
        self.keywords = keywords
        self.required = required
        self.defaults = defaults

    @classmethod
    def of(cls, signature: inspect.Signature) -> _FastBind | None:
        kinds = inspect.Parameter
        positional, keywords, required, defaults = [], set(), set(), {}
        for param in signature.parameters.values():
            if param.kind in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD):
                return None
            if param.kind is not kinds.KEYWORD_ONLY:
                positional.append(param.name)
            if param.kind is not kinds.POSITIONAL_ONLY:
                keywords.add(param.name)
            if param.default is kinds.empty:
                required.add(param.name)
            else:
                defaults[param.name] = param.default
        return cls(tuple(positional), frozenset(keywords), frozenset(required), defaults)

    def values(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        positional = self.positional
        given = len(args)
        if given > len(positional):
            return None
        values = dict(self.defaults)
        values.update(zip(positional, args, strict=False))  # the rest by name, or defaults
        if kwargs:
            # An unknown name, a positional-only one by name, or one given twice.
            if not self.keywords.issuperset(kwargs):
                return None
            if any(name in kwargs for name in positional[:given]):
                return None
            values.update(kwargs)
        if not self.required.issubset(values):
            return None
        return values


# Decorators applied through method_decorator are applied again on every call:
# keep the checked template per underlying function.
_namers: weakref.WeakKeyDictionary[Any, dict[Any, Namer]] = weakref.WeakKeyDictionary()


def namer_for(key: str | Callable[..., Any], func: Callable[..., Any]) -> Namer:
    if not (isinstance(func, functools.partial) and inspect.ismethod(func.func)):
        return Namer(key, func)
    per_method = _namers.setdefault(func.func.__func__, {})
    checked = per_method.get(key)
    if checked is None:
        checked = per_method[key] = Namer(key, func)
    # A copy per call: ``extra`` holds this call's ``self``.
    namer = object.__new__(Namer)
    namer.__dict__.update(checked.__dict__)
    namer.extra = {"self": func.func.__self__}
    return namer
