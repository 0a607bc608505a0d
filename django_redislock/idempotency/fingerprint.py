"""What a request says: its ``Idempotency-Key``, and the fingerprint of what it asks."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import weakref
from collections.abc import Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http.request import UnreadablePostError

from .settings import Policy

__all__ = ["BadKey", "fingerprint", "fingerprint_async", "key_of"]

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


# Bytes hashed (and spooled) at a time.
CHUNK = 64 * 1024


def fingerprint(request: Any) -> str:
    """SHA-256 of the method, the path with its query string, and the body.

    The body is read from the request's stream a chunk at a time, and left
    for the view to read as if nobody had: never through ``request.body``,
    which Django refuses above ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (an upload a
    view may well accept, parsing it into files on disk) and which would
    otherwise hold the whole body in memory.
    """
    # A DRF Request wraps Django's: the bytes are the same.
    http_request = getattr(request, "_request", request)
    digest = hashlib.sha256()
    for part in (request.method or "", http_request.get_full_path()):
        digest.update(part.encode("utf-8", "surrogatepass") + b"\0")
    if hasattr(http_request, "_body"):  # read already: in memory anyway
        digest.update(http_request._body)
    elif getattr(http_request, "_read_started", False):
        # A multipart body already parsed (CsrfViewMiddleware reads
        # request.POST): its fields and files stand in for the bytes.
        _parts(http_request, digest)
    else:
        _stream(http_request, digest)
    return digest.hexdigest()


async def fingerprint_async(request: Any) -> str:
    """``fingerprint`` from the event loop: a body of more than a chunk is hashed
    in a thread, so that the loop does not wait on a large upload (on disk,
    once Django's spool has rolled over)."""
    if _size(getattr(request, "_request", request)) <= CHUNK:
        return fingerprint(request)
    return await sync_to_async(fingerprint, thread_sensitive=False)(request)


def _size(http_request: Any) -> int:
    """How much of the body is left to read, as far as can be told cheaply."""
    if hasattr(http_request, "_body"):
        return 0
    try:
        size = int(http_request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        size = 0
    stream = getattr(http_request, "_stream", None)
    if stream is not None and _seekable(stream):  # ASGI: spooled already, whatever the header says
        here = stream.tell()
        size = max(size, stream.seek(0, os.SEEK_END) - here)
        stream.seek(here)
    return size


def _seekable(stream: Any) -> bool:
    seekable = getattr(stream, "seekable", None)
    return callable(seekable) and bool(seekable())


def _chunks(stream: Any) -> Iterator[bytes]:
    while True:
        try:
            chunk = stream.read(CHUNK)
        except OSError as exc:  # as HttpRequest.read() says it
            raise UnreadablePostError(*exc.args) from exc
        if not chunk:
            return
        yield chunk


def _stream(http_request: Any, digest: Any) -> None:
    """Hash the unread body and leave it unread.

    ``_stream`` is what ``HttpRequest.read()``, ``body`` and the upload parser
    read from, and ``_read_started`` stays False, so the view (and Django's
    size check, and DRF's parsers) see the request as it came. A seekable
    stream (an ASGI request's body, spooled by Django) is hashed and wound
    back. Any other (a WSGI request's socket, behind ``LimitedStream``) is
    copied, as it is hashed, into a spool that keeps at most
    ``FILE_UPLOAD_MAX_MEMORY_SIZE`` in memory, the rest on disk, as Django
    spools an ASGI body; the spool becomes the request's stream.
    """
    stream = getattr(http_request, "_stream", None)
    if stream is None:  # a request class of its own: all it offers is body
        digest.update(http_request.body)
        return
    if _seekable(stream):
        start = stream.tell()
        for chunk in _chunks(stream):
            digest.update(chunk)
        stream.seek(start)
        return
    # Not closed here: it becomes the request's stream, which the view reads.
    spool = tempfile.SpooledTemporaryFile(max_size=settings.FILE_UPLOAD_MAX_MEMORY_SIZE)  # noqa: SIM115
    try:
        for chunk in _chunks(stream):
            digest.update(chunk)
            spool.write(chunk)
        spool.seek(0)
    except BaseException:
        spool.close()
        raise
    http_request._stream = spool
    # Closed with the request (Django closes it sooner if the view reads body).
    weakref.finalize(http_request, spool.close)


def _parts(http_request: Any, digest: Any) -> None:
    digest.update(b"multipart\0" + json.dumps(sorted(http_request.POST.lists())).encode())
    for field, files in sorted(http_request.FILES.lists()):
        for upload in files:
            digest.update(f"\0{field}\0{upload.name}\0{upload.size}\0".encode())
            for chunk in upload.chunks():
                digest.update(chunk)
            upload.seek(0)
