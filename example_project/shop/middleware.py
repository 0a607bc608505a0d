"""Stamp each request with its arrival time, so views can report lock waits."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.utils.decorators import sync_and_async_middleware


@sync_and_async_middleware
def arrival_time(get_response: Callable[..., Any]) -> Callable[..., Any]:
    if iscoroutinefunction(get_response):

        async def async_middleware(request: Any) -> Any:
            request.arrived = time.monotonic()
            return await get_response(request)

        return async_middleware

    def middleware(request: Any) -> Any:
        request.arrived = time.monotonic()
        return get_response(request)

    return middleware
