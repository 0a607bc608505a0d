"""What a request says: its ``Idempotency-Key``, and the fingerprint of what it asks."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from django.http.request import RawPostDataException

from .settings import Policy

__all__ = ["BadKey", "fingerprint", "key_of"]

# The draft sends the key as a structured-field string ("..."); many clients
# send it bare. Visible ASCII without quote or backslash: a UUID, a ULID, a
# base64 token all fit; nothing of it reaches Redis unhashed anyway.
_KEY_RE = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")


class BadKey(Exception):
    """The header is there but is no key; the message says what a key looks like."""


def key_of(request: Any, policy: Policy) -> str | None:
    """The key the request sends, None without the header; ``BadKey`` if malformed."""
    raw = request.headers.get(policy.header)
    if raw is None:
        return None
    value = raw.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    shape = (
        f"1 to {policy.max_key_length} visible ASCII characters without quotes or "
        'backslashes (a UUID is a good key), optionally in double quotes: Idempotency-Key: "<uuid>"'
    ).replace("Idempotency-Key", policy.header)
    if not value:
        raise BadKey(f"The {policy.header} header is empty; send {shape}.")
    if len(value) > policy.max_key_length:
        raise BadKey(f"The {policy.header} header is {len(value)} characters long; send {shape}.")
    if not _KEY_RE.fullmatch(value):
        raise BadKey(f"The {policy.header} header has characters not allowed; send {shape}.")
    return value


def fingerprint(request: Any) -> str:
    """SHA-256 of the method, the path with its query string, and the body."""
    # A DRF Request wraps Django's: the bytes are the same.
    http_request = getattr(request, "_request", request)
    digest = hashlib.sha256()
    for part in (request.method or "", http_request.get_full_path()):
        digest.update(part.encode("utf-8", "surrogatepass") + b"\0")
    try:
        digest.update(http_request.body)
    except RawPostDataException:
        # A multipart body already parsed (CsrfViewMiddleware reads
        # request.POST): its fields and files stand in for the bytes.
        digest.update(b"multipart\0" + json.dumps(sorted(http_request.POST.lists())).encode())
        for field, files in sorted(http_request.FILES.lists()):
            for upload in files:
                digest.update(f"\0{field}\0{upload.name}\0{upload.size}\0".encode())
                for chunk in upload.chunks():
                    digest.update(chunk)
                upload.seek(0)
    return digest.hexdigest()
