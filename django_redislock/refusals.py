"""What a refusal is, whatever shape its answer takes (``http.py`` renders it,
``contrib/drf.py`` raises it for DRF): its status, stable code, title, detail
and when a retry may succeed."""

from __future__ import annotations

import dataclasses
import math

__all__ = ["TYPE_BASE", "UNAVAILABLE_RETRY_AFTER", "Refusal", "retry_after_header"]

# Redis down says nothing about when it will be back: ask clients to pause a
# little rather than retry at once and pile onto a recovering server.
UNAVAILABLE_RETRY_AFTER = 5.0

# Each problem type is documented under this address, one anchor per code
# (docs/views.rst, "Refusals"): RFC 9457 wants a type a person can look up.
TYPE_BASE = "https://django-redislock.readthedocs.io/en/latest/views.html#"


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A request the library does not serve, whatever shape its answer takes."""

    status: int
    code: str  # stable and machine-readable: "lock_busy", "idempotency_key_in_use", ...
    title: str  # the same for every refusal with this code
    detail: str  # this occurrence, for people
    # Whole seconds until a retry may succeed (Retry-After); None: a retry will not.
    retry_after: int | None = None
    # The "error" member of the JSON answers before problem+json, kept for
    # clients that read it: "busy", "unavailable", "throttled", or the code.
    error: str = ""

    @property
    def type(self) -> str:
        return TYPE_BASE + self.code.replace("_", "-")


def retry_after_header(seconds: float | None) -> str:
    """Whole seconds, at least 1 (RFC 9110 allows no fractions)."""
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        return "1"
    return str(max(1, math.ceil(seconds)))
