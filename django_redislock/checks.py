"""System checks for ``REDISLOCK``. They read settings only, never the network."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.core.checks import CheckMessage, Error, Tags, Warning, register

from .conf import Problem, problems

__all__ = ["check_settings", "register_problems"]

# Other modules (the throttling rules, for one) add their own validators here.
_extra: list[Callable[[], list[Problem]]] = []


def register_problems(validator: Callable[[], list[Problem]]) -> Callable[[], list[Problem]]:
    _extra.append(validator)
    return validator


@register(Tags.compatibility)
def check_settings(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    found = problems()
    for validator in _extra:
        found.extend(validator())
    messages: list[CheckMessage] = []
    for p in found:
        cls = Warning if ".W" in p.id else Error
        messages.append(cls(p.msg, hint=p.hint, id=p.id))
    return messages
