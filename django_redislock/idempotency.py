"""``idempotent``: a retried unsafe request runs its view once, and the retry gets the answer.

A client that sends ``Idempotency-Key: <key>`` with a ``POST`` (or another
method of ``METHODS``) may send the same request again, after a timeout or a
dropped connection, without doing the work twice (the IETF httpapi
"Idempotency-Key" draft; payment APIs work this way). Per key, scoped to the
user (or client IP, or what a callable says):

* the **first** request takes a lock on the key (``redis_locked``, so the
  lease, fencing, signals and transaction handling are the ones every locked
  view gets) and runs the view;
* a **duplicate while it runs** gets ``409`` with ``Retry-After``;
* a **duplicate after it completed** gets the stored response replayed
  (status, ``Content-Type`` and the headers of ``REPLAY_HEADERS``, body),
  marked ``Idempotent-Replayed: true``, without running the view;
* the key **reused for another request** (method, path or body differ) gets
  ``422``;
* a request that **failed** (an exception, a 5xx, a retryable 4xx such as
  409 or 429, a rolled-back transaction) stores nothing, so its retry runs.

The response is stored after the view's transaction commits (``on_commit``
of every database it wrote in, ``ATOMIC_REQUESTS`` included) and before the
lock is released, so a duplicate never sees a response whose writes could
still roll back, and never runs while the first is between its commit and
its store.

``IdempotencyMiddleware`` gives the same answers for the paths of
``IDEMPOTENCY["PATHS"]``, holding the lock around the rest of the chain (so
``ATOMIC_REQUESTS`` has ended before it stores); a decorated view it serves
is not served again by its decorator.

Keys, for a request whose scope and key hash to ``<d>`` (SHA-256 hex, so a
key's own characters never reach Redis) under ``REDISLOCK["PREFIX"]`` ``P``::

    P:L:{T}:=idempotency:<d>   the lock's keys (core/keys.py), while it runs
    P:I:{T}:=idempotency:<d>   hash   the record: fingerprint, state, response

``{T}`` is the lock's own hash tag, so the record shares the lock's Redis
Cluster slot and both are read in one round trip. The record expires after
``TTL`` seconds.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import hashlib
import json
import logging
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.core.exceptions import SynchronousOnlyOperation
from django.db import connections, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.http.request import RawPostDataException
from django.utils.module_loading import import_string
from redis.exceptions import RedisError

from .checks import AUTH_MIDDLEWARE_PATH, _index, _middleware, register_problems
from .conf import Problem, conf
from .connection import get_async_client, get_client
from .core import scripts
from .core.base import is_seconds
from .core.exceptions import RedisUnavailable
from .decorators import _request_in, redis_locked
from .http import error_response, retry_after_header, wants_json
from .locks import get_async_lock, get_lock, keyspace
from .middleware import _ip, _user_key
from .outcomes import UNAVAILABLE_RETRY_AFTER, _arelease, _release
from .transactions import _EVERY_ALIAS, _in_user_transaction

__all__ = ["REPLAYED_HEADER", "SETTINGS", "IdempotencyMiddleware", "idempotent"]

MIDDLEWARE_PATH = "django_redislock.idempotency.IdempotencyMiddleware"

F = TypeVar("F", bound=Callable[..., Any])

logger = logging.getLogger("django_redislock.idempotency")

REPLAYED_HEADER = "Idempotent-Replayed"
OMITTED_HEADER = "Idempotent-Body-Omitted"

# REDISLOCK["IDEMPOTENCY"]: each key optional, each overridable per decorator.
SETTINGS: dict[str, Any] = {
    # Methods whose requests honour the header; others run as if undecorated.
    "METHODS": ["POST", "PATCH"],
    "HEADER": "Idempotency-Key",
    # True: a request without the header gets 400 instead of running.
    "REQUIRED": False,
    # Whose keys are whose: "user" (anonymous: per IP), "ip", or a callable
    # (or dotted path) of the request returning a non-empty str.
    "SCOPE": "user",
    # How long a completed response is replayed (seconds; the draft and Stripe: 24 h).
    "TTL": 86400,
    "MAX_KEY_LENGTH": 255,
    # Largest response body kept (bytes); a larger one is stored without it.
    "MAX_BODY": 65536,
    # Replayed besides Content-Type. Never Set-Cookie: a replay must not hand
    # a session to whoever repeats the key.
    "REPLAY_HEADERS": ["Location"],
    # Whether a 4xx the view answered is stored (as Stripe does) or retried.
    "STORE_CLIENT_ERRORS": True,
    # IdempotencyMiddleware: regular expressions (re.search on path_info) of
    # the paths it serves; views it does not reach can use the decorator.
    "PATHS": [],
}

# Never stored: they ask the client to try again (a retry must run).
RETRYABLE_STATUSES = frozenset({408, 409, 425, 429})

# The draft sends the key as a structured-field string ("..."); many clients
# send it bare. Visible ASCII without quote or backslash: a UUID, a ULID, a
# base64 token all fit; nothing of it reaches Redis unhashed anyway.
_KEY_RE = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")
_TOKEN_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token

# What a failed call to Redis raises: redis-py's errors, and the library's
# own for the scripts it runs.
_FAILED = (RedisError, RedisUnavailable)

_RECORD_FIELDS = (b"fp", b"state", b"status", b"headers", b"body", b"omitted")


# -- settings -------------------------------------------------------------------------
def _raw_settings() -> dict[str, Any]:
    return conf.IDEMPOTENCY


def _method_error(value: object) -> str | None:
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)) or not value:
        return f"must be a non-empty list of HTTP methods such as ['POST', 'PATCH']; got {value!r}"
    for method in value:
        if (
            not isinstance(method, str)
            or not _TOKEN_RE.fullmatch(method)
            or method.upper() != method
        ):
            return f"must hold upper-case method names such as 'POST'; got {method!r}"
    return None


def _seconds_error(value: object) -> str | None:
    if not is_seconds(value, allow_zero=False):
        return f"must be a finite number of seconds, more than 0; got {value!r}"
    return None


def _count_error(value: object, *, allow_zero: bool) -> str | None:
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        return f"must be a whole number, {low} or more; got {value!r}"
    return None


def _scope_error(value: object) -> str | None:
    if value in ("user", "ip") or callable(value) or (isinstance(value, str) and "." in value):
        return None
    return f"must be 'user', 'ip', a callable or a dotted path to one; got {value!r}"


def _bool_error(value: object) -> str | None:
    return None if isinstance(value, bool) else f"must be True or False; got {value!r}"


def _paths_error(value: object) -> str | None:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        return f"must be a list of regular expressions such as [r'^/api/payments/']; got {value!r}"
    for pattern in value:
        if not isinstance(pattern, str):
            return f"must hold regular expression strings; got {pattern!r}"
        try:
            re.compile(pattern)
        except re.error as exc:
            return f"has {pattern!r}, which is not a regular expression ({exc})"
    return None


def _header_error(value: object) -> str | None:
    if isinstance(value, str) and _TOKEN_RE.fullmatch(value):
        return None
    return f"must be an HTTP header name such as 'Idempotency-Key'; got {value!r}"


def _headers_error(value: object) -> str | None:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        return f"must be a list of header names such as ['Location']; got {value!r}"
    for name in value:
        if not isinstance(name, str) or not _TOKEN_RE.fullmatch(name):
            return f"must hold header names such as 'Location'; got {name!r}"
        if name.lower() in ("set-cookie", "content-length"):
            return f"must not name {name!r}: a replay never hands out cookies, and sets its length"
    return None


# key -> (check ID, validator, hint)
_VALIDATORS: dict[str, tuple[str, Callable[[Any], str | None], str]] = {
    "METHODS": ("django_redislock.E061", _method_error, "Use e.g. ['POST', 'PATCH']."),
    "TTL": ("django_redislock.E062", _seconds_error, "Use seconds, e.g. 86400 for a day."),
    "MAX_KEY_LENGTH": (
        "django_redislock.E062",
        lambda v: _count_error(v, allow_zero=False),
        "Use 255 (the default).",
    ),
    "MAX_BODY": (
        "django_redislock.E062",
        lambda v: _count_error(v, allow_zero=True),
        "Use a size in bytes such as 65536 (0 keeps no bodies).",
    ),
    "SCOPE": (
        "django_redislock.E063",
        _scope_error,
        "Use 'user', 'ip', or 'myapp.idempotency.scope' (a function of the request).",
    ),
    "REQUIRED": ("django_redislock.E064", _bool_error, "Write True or False."),
    "STORE_CLIENT_ERRORS": ("django_redislock.E064", _bool_error, "Write True or False."),
    "HEADER": ("django_redislock.E065", _header_error, "Use 'Idempotency-Key'."),
    "REPLAY_HEADERS": ("django_redislock.E065", _headers_error, "Use e.g. ['Location']."),
    "PATHS": (
        "django_redislock.E066",
        _paths_error,
        "Use a list such as [r'^/api/payments/'], or [] for no middleware rule.",
    ),
}


@register_problems
def idempotency_problems() -> list[Problem]:
    """What is wrong with ``REDISLOCK["IDEMPOTENCY"]`` (system checks, no network)."""
    raw = conf.raw.get("IDEMPOTENCY", {})
    if not isinstance(raw, dict):
        return [
            Problem(
                "django_redislock.E060",
                f"REDISLOCK['IDEMPOTENCY'] must be a dict, not {type(raw).__name__}.",
                "Write REDISLOCK['IDEMPOTENCY'] = {'TTL': 86400, ...}, or remove it.",
            )
        ]
    found: list[Problem] = []
    unknown = sorted(set(raw) - set(SETTINGS), key=repr)
    if unknown:
        found.append(
            Problem(
                "django_redislock.E060",
                f"Unknown REDISLOCK['IDEMPOTENCY'] key(s): {', '.join(map(repr, unknown))}.",
                "Remove them or fix the spelling; valid keys: " + ", ".join(sorted(SETTINGS)) + ".",
            )
        )
    for key, (check_id, validate, hint) in _VALIDATORS.items():
        if key in raw:
            error = validate(raw[key])
            if error is not None:
                found.append(Problem(check_id, f"REDISLOCK['IDEMPOTENCY'][{key!r}] {error}.", hint))
    found.extend(_middleware_problems(raw))
    return found


def _middleware_problems(raw: dict[str, Any]) -> list[Problem]:
    entries = _middleware()
    ours = _index(entries, MIDDLEWARE_PATH)
    if raw.get("PATHS") and ours is None:
        return [
            Problem(
                "django_redislock.E067",
                "REDISLOCK['IDEMPOTENCY']['PATHS'] is set, but IdempotencyMiddleware is not in "
                "MIDDLEWARE: no path is ever served.",
                f"Add {MIDDLEWARE_PATH!r} to MIDDLEWARE (after AuthenticationMiddleware), "
                "or remove PATHS.",
            )
        ]
    auth = _index(entries, AUTH_MIDDLEWARE_PATH)
    if ours is not None and raw.get("SCOPE", "user") == "user" and (auth is None or auth > ours):
        where = "is not in MIDDLEWARE" if auth is None else "comes after IdempotencyMiddleware"
        return [
            Problem(
                "django_redislock.W060",
                f"Idempotency keys are per user, but AuthenticationMiddleware {where}: "
                "request.user is not set when IdempotencyMiddleware runs, so every key is "
                "scoped per IP address instead.",
                f"Put {MIDDLEWARE_PATH!r} after {AUTH_MIDDLEWARE_PATH!r} in MIDDLEWARE, or set "
                "REDISLOCK['IDEMPOTENCY']['SCOPE'] = 'ip' if that is what you want.",
            )
        ]
    return []


@dataclasses.dataclass(frozen=True)
class _Policy:
    methods: frozenset[str]
    header: str
    required: bool
    scope: Any
    ttl: float
    max_key_length: int
    max_body: int
    replay_headers: tuple[str, ...]
    store_client_errors: bool
    paths: tuple[re.Pattern[str], ...]


def _policy(overrides: dict[str, Any]) -> _Policy:
    """Settings, then the decorator's arguments; read per request (``override_settings``)."""
    raw = _raw_settings()
    value = {key: overrides.get(key, raw.get(key, default)) for key, default in SETTINGS.items()}
    for key, (_, validate, hint) in _VALIDATORS.items():
        if key in raw and key not in overrides and validate(raw[key]) is not None:
            # manage.py check reports it; a request must not become a 500.
            logger.error(
                "REDISLOCK['IDEMPOTENCY'][%r] is invalid (%s); using the default", key, hint
            )
            value[key] = SETTINGS[key]
    return _Policy(
        methods=frozenset(value["METHODS"]),
        header=value["HEADER"],
        required=value["REQUIRED"],
        scope=value["SCOPE"],
        ttl=float(value["TTL"]),
        max_key_length=value["MAX_KEY_LENGTH"],
        max_body=value["MAX_BODY"],
        replay_headers=tuple(value["REPLAY_HEADERS"]),
        store_client_errors=value["STORE_CLIENT_ERRORS"],
        paths=_compiled(tuple(value["PATHS"])),
    )


@functools.lru_cache(maxsize=16)
def _compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(pattern) for pattern in patterns)


# -- one request ----------------------------------------------------------------------
@dataclasses.dataclass
class _Call:
    request: Any
    policy: _Policy
    name: str  # the lock's name
    record: bytes  # the record's key
    lease: bytes  # the lock's lease key (for Retry-After)
    fingerprint: str
    is_async: bool
    alias: str | None  # the CACHES entry, None for REDISLOCK["CACHE"]


# The call being served, for the lock's key callable and busy callable, which
# redis_locked calls with the view's arguments only.
_current: contextvars.ContextVar[_Call] = contextvars.ContextVar("django_redislock.idempotency")


class _BadKey(Exception):
    pass


def _key_of(request: Any, policy: _Policy) -> str | None:
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
        raise _BadKey(f"The {policy.header} header is empty; send {shape}.")
    if len(value) > policy.max_key_length:
        raise _BadKey(f"The {policy.header} header is {len(value)} characters long; send {shape}.")
    if not _KEY_RE.fullmatch(value):
        raise _BadKey(f"The {policy.header} header has characters not allowed; send {shape}.")
    return value


def _scope_sync(request: Any, policy: _Policy) -> str:
    scope = policy.scope
    if scope == "ip":
        return f"ip:{_ip(request)}"
    if scope == "user":
        return _user_key(getattr(request, "user", None), request)
    func = import_string(scope) if isinstance(scope, str) else scope
    value = func(request)
    if not isinstance(value, str) or not value:
        raise TypeError(
            f"the idempotency scope callable {scope!r} returned {value!r}: it must return a "
            "non-empty str naming whose keys these are (a user id, an account, a client)"
        )
    return f"c:{value}"


def _fingerprint(request: Any) -> str:
    """SHA-256 of the method, the path with its query string, and the body."""
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


def _new_call(
    request: Any, policy: _Policy, scope: str, key: str, is_async: bool, alias: str | None
) -> _Call:
    digest = hashlib.sha256(
        scope.encode("utf-8", "surrogatepass") + b"\0" + key.encode("ascii")
    ).hexdigest()
    name = f"idempotency:{digest}"
    keys = keyspace().lock(name)
    record = f"{keyspace().prefix}:I:".encode() + keys.tag + b":=" + name.encode()
    return _Call(request, policy, name, record, keys.lease, _fingerprint(request), is_async, alias)


# -- answers --------------------------------------------------------------------------
def _problem(request: Any, status: int, code: str, detail: str) -> HttpResponse:
    response: HttpResponse
    if wants_json(request):
        response = JsonResponse({"error": code, "detail": detail}, status=status)
    else:
        response = HttpResponse(
            detail + "\n", status=status, content_type="text/plain; charset=utf-8"
        )
    response["Cache-Control"] = "no-store"
    return response


def _mismatch(call: _Call) -> HttpResponse:
    logger.info("%s reused for another request: 422", call.policy.header)
    return _problem(
        call.request,
        422,
        "idempotency_key_reused",
        f"This {call.policy.header} was already used for a different request (another method, "
        "path or body); use a new key for a new request.",
    )


def _in_progress(call: _Call, pttl: int | None) -> HttpResponse:
    logger.info("%s duplicate while the first request runs: 409", call.policy.header)
    seconds = None if pttl is None or pttl < 0 else pttl / 1000
    response = _problem(
        call.request,
        409,
        "idempotency_key_in_use",
        f"A request with this {call.policy.header} is still being processed; retry after "
        "Retry-After seconds to get its response.",
    )
    response["Retry-After"] = retry_after_header(seconds)
    return response


def _replay(call: _Call, record: dict[bytes, bytes]) -> HttpResponse:
    status = int(record[b"status"])
    response = HttpResponse(record.get(b"body", b""), status=status)
    for name, value in json.loads(record.get(b"headers", b"[]")):
        response[name] = value
    response[REPLAYED_HEADER] = "true"
    if record.get(b"omitted") == b"1":
        response[OMITTED_HEADER] = "true"
    logger.info("%s duplicate after completion: replayed %s", call.policy.header, status)
    return response


def _answer(call: _Call, record: dict[bytes, bytes], pttl: int | None) -> HttpResponse | None:
    """What a request gets from the record and the lease alone (None: it may run)."""
    if not record:
        return None
    if record.get(b"fp", b"").decode() != call.fingerprint:
        if record.get(b"state") == b"done" or pttl is not None and pttl >= 0:
            return _mismatch(call)
        return None  # an attempt that ended without storing: the key is free
    if record.get(b"state") == b"done":
        return _replay(call, record)
    return None


def _unavailable(call: _Call, exc: Exception) -> HttpResponse:
    logger.warning("Redis unavailable for %s, not running the view: %s", call.policy.header, exc)
    return error_response(
        call.request,
        status=503,
        retry_after=UNAVAILABLE_RETRY_AFTER,
        reason="unavailable",
        name=call.name,
        handler=conf.UNAVAILABLE_RESPONSE,
    )


# -- what is stored -------------------------------------------------------------------
def _storable_status(status: int, policy: _Policy) -> bool:
    if status >= 500 or status in RETRYABLE_STATUSES:
        return False
    return status < 400 or policy.store_client_errors


def _snapshot(response: HttpResponseBase, call: _Call) -> dict[bytes, bytes] | None:
    """The record of a completed response, or None if it must not be stored."""
    if not _storable_status(response.status_code, call.policy):
        return None
    render = getattr(response, "render", None)
    if callable(render) and not getattr(response, "is_rendered", True):
        response = render()
    names = ("Content-Type", *call.policy.replay_headers)
    headers = [[name, response[name]] for name in dict.fromkeys(names) if response.has_header(name)]
    record = {
        b"fp": call.fingerprint.encode(),
        b"state": b"done",
        b"status": str(response.status_code).encode(),
        b"headers": json.dumps(headers).encode(),
    }
    content = None if response.streaming else response.content  # type: ignore[attr-defined]
    if content is None or len(content) > call.policy.max_body:
        # The view ran: a duplicate must not run it again, even though its
        # body cannot be given back. It gets the status and headers.
        record[b"omitted"] = b"1"
        record[b"body"] = b""
    else:
        record[b"body"] = content
    return record


def _ttl_ms(call: _Call) -> int:
    return max(1, math.ceil(call.policy.ttl * 1000))


# Replaces the record in one step (DEL, HSET, PEXPIRE), on a Cluster too.
_REPLACE = scripts.load("record_replace", prelude=None, repeatable=True)


def _replace_args(call: _Call, record: dict[bytes, bytes]) -> tuple[Any, ...]:
    return (_ttl_ms(call), *(part for item in record.items() for part in item))


def _write(client: Any, call: _Call, record: dict[bytes, bytes]) -> None:
    scripts.run(client, _REPLACE, (call.record,), _replace_args(call, record))


async def _awrite(client: Any, call: _Call, record: dict[bytes, bytes]) -> None:
    await scripts.run_async(client, _REPLACE, (call.record,), _replace_args(call, record))


def _running(call: _Call) -> dict[bytes, bytes]:
    return {b"fp": call.fingerprint.encode(), b"state": b"running"}


def _store_now(call: _Call, record: dict[bytes, bytes]) -> None:
    try:
        _write(get_client(call.alias), call, record)
    except _FAILED as exc:
        logger.warning(
            "could not store the response for %s (%s): a duplicate will run the view again",
            call.name,
            exc,
        )


def _after_commit(action: Callable[[], None]) -> None:
    """``action`` once every transaction open here has committed; now if none is.

    A rollback of any of them drops its hook, so ``action`` never runs: a
    response whose writes were undone is never replayed.
    """
    aliases = [alias for alias in connections if _in_user_transaction(alias)]
    if not aliases:
        action()
        return
    waiting = set(aliases)

    def committed(alias: str) -> None:
        waiting.discard(alias)
        if not waiting:
            action()

    for alias in aliases:
        transaction.on_commit(functools.partial(committed, alias), using=alias)


def _forget(client: Any, call: _Call) -> None:
    try:
        client.delete(call.record)
    except RedisError as exc:  # the marker says "not completed": harmless
        logger.debug("could not remove the in-progress marker %r: %s", call.record, exc)


# -- the views ------------------------------------------------------------------------
def _read(client: Any, call: _Call) -> tuple[dict[bytes, bytes], int | None]:
    # One slot, one round trip, on a Cluster too.
    with client.pipeline(transaction=False) as pipe:
        pipe.hgetall(call.record)
        pipe.pttl(call.lease)
        record, pttl = pipe.execute()
    return record, pttl


async def _aread(client: Any, call: _Call) -> tuple[dict[bytes, bytes], int | None]:
    async with client.pipeline(transaction=False) as pipe:
        pipe.hgetall(call.record)
        pipe.pttl(call.lease)
        record, pttl = await pipe.execute()
    return record, pttl


def _busy(*args: Any, **kwargs: Any) -> Any:
    """The idempotency lock is held: by the first request with this key."""
    call = _current.get()
    if call.is_async:
        return _abusy(call)
    return _busy_now(call, get_client(call.alias))


async def _abusy(call: _Call) -> HttpResponse:
    try:
        record, pttl = await _aread(get_async_client(call.alias), call)
    except RedisError as exc:
        return _unavailable(call, exc)
    return _answer(call, record, pttl) or _in_progress(call, pttl)


def _name(*args: Any, **kwargs: Any) -> str:
    return _current.get().name


def _serve(call: _Call, run: Callable[[], Any]) -> Any:
    """Under the lock: look again, mark the key in progress, run, store or forget."""
    client = get_client(call.alias)
    try:
        # Again under the lock: the first request may have finished between
        # the look before the lock and its acquisition.
        record, _ = _read(client, call)
        answer = _answer(call, record, None)
        if answer is not None:
            return answer
        _write(client, call, _running(call))
    except _FAILED as exc:
        return _unavailable(call, exc)
    try:
        response = run()
    except BaseException:
        _forget(client, call)
        raise
    done = _snapshot(response, call) if isinstance(response, HttpResponseBase) else None
    if done is None:
        _forget(client, call)
    else:
        _after_commit(functools.partial(_store_now, call, done))
    return response


async def _aserve(call: _Call, run: Callable[[], Awaitable[Any]]) -> Any:
    """``_serve`` for async views and middleware."""
    client = get_async_client(call.alias)
    try:
        record, _ = await _aread(client, call)
        answer = _answer(call, record, None)
        if answer is not None:
            return answer
        await _awrite(client, call, _running(call))
    except _FAILED as exc:
        return _unavailable(call, exc)
    try:
        response = await run()
    except BaseException:
        await _aforget(client, call)
        raise
    done = _snapshot(response, call) if isinstance(response, HttpResponseBase) else None
    try:
        if done is None:
            await client.delete(call.record)
        else:
            # An async view has no ATOMIC_REQUESTS: its own atomic blocks
            # (in sync_to_async) have committed by the time it returns.
            await _awrite(client, call, done)
    except _FAILED as exc:
        logger.warning(
            "could not store the response for %s (%s): a duplicate will run the view again",
            call.name,
            exc,
        )
    return response


def _run_sync(view: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(view)
    def under_lock(*args: Any, **kwargs: Any) -> Any:
        return _serve(_current.get(), lambda: view(*args, **kwargs))

    return under_lock


def _run_async(view: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(view)
    async def under_lock(*args: Any, **kwargs: Any) -> Any:
        return await _aserve(_current.get(), lambda: view(*args, **kwargs))

    return under_lock


async def _aforget(client: Any, call: _Call) -> None:
    try:
        await client.delete(call.record)
    except RedisError as exc:
        logger.debug("could not remove the in-progress marker %r: %s", call.record, exc)


def _prepare(
    request: Any, policy: _Policy, scope: str | None, alias: str | None
) -> _Call | HttpResponse | None:
    """The call to serve, a 400, or None (run the view as if undecorated).

    ``scope`` is computed by the async caller (None: compute it here).
    """
    if (request.method or "").upper() not in policy.methods:
        return None
    try:
        key = _key_of(request, policy)
    except _BadKey as exc:
        logger.info("bad %s: 400", policy.header)
        return _problem(request, 400, "idempotency_key_invalid", str(exc))
    if key is None:
        if not policy.required:
            return None
        return _problem(
            request,
            400,
            "idempotency_key_missing",
            f"This endpoint needs an {policy.header} header: send a new unique key (a UUID) "
            "with each new request, and the same key when you retry it.",
        )
    is_async = scope is not None
    if scope is None:
        scope = _scope_sync(request, policy)
    return _new_call(request, policy, scope, key, is_async, alias)


def _wrap(view: Callable[..., Any], overrides: dict[str, Any], lock_kwargs: dict[str, Any]) -> Any:
    label = f"idempotent:{getattr(view, '__module__', '')}.{getattr(view, '__qualname__', view)}"
    options = {"wait": 0, **lock_kwargs, "on_busy": _busy, "label": label}

    if iscoroutinefunction(view):
        locked_async = redis_locked(_name, **options)(_run_async(view))

        @functools.wraps(view)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            request = _need_request(view, args)
            if not conf.ENABLED or _served_by_middleware(request):
                return await view(*args, **kwargs)
            policy = _policy(overrides)
            if (request.method or "").upper() not in policy.methods:
                return await view(*args, **kwargs)
            scope = await _ascope(request, policy)
            prepared = _prepare(request, policy, scope, overrides.get("alias"))
            if not isinstance(prepared, _Call):
                return await view(*args, **kwargs) if prepared is None else prepared
            try:
                record, pttl = await _aread(get_async_client(prepared.alias), prepared)
            except RedisError as exc:
                return _unavailable(prepared, exc)
            answer = _answer(prepared, record, pttl)
            if answer is not None:
                return answer
            token = _current.set(prepared)
            try:
                return await locked_async(*args, **kwargs)
            finally:
                _current.reset(token)

        return async_wrapper

    locked = redis_locked(_name, **options)(_run_sync(view))

    @functools.wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        request = _need_request(view, args)
        if not conf.ENABLED or _served_by_middleware(request):
            return view(*args, **kwargs)
        prepared = _prepare(request, _policy(overrides), None, overrides.get("alias"))
        if not isinstance(prepared, _Call):
            return view(*args, **kwargs) if prepared is None else prepared
        try:
            record, pttl = _read(get_client(prepared.alias), prepared)
        except RedisError as exc:
            return _unavailable(prepared, exc)
        answer = _answer(prepared, record, pttl)
        if answer is not None:
            return answer
        token = _current.set(prepared)
        try:
            return locked(*args, **kwargs)
        finally:
            _current.reset(token)

    # As redis_locked does: ATOMIC_REQUESTS is opened inside the lock (by the
    # redis_locked within), so the response is stored after the commit.
    wrapper._non_atomic_requests = _EVERY_ALIAS  # type: ignore[attr-defined]
    return wrapper


async def _ascope(request: Any, policy: _Policy) -> str:
    try:
        return _scope_sync(request, policy)
    except SynchronousOnlyOperation:
        # request.user loads the session and the user from the database.
        return await sync_to_async(_scope_sync)(request, policy)


def _need_request(view: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    request = _request_in(args)
    if request is None:
        raise TypeError(
            f"idempotent() decorates views: {getattr(view, '__qualname__', view)!r} was called "
            "without a request as its first argument (or second, after self). Use redis_locked "
            "for functions and tasks."
        )
    return request


def _check_arguments(overrides: dict[str, Any]) -> None:
    for key, value in overrides.items():
        if key == "alias":
            if not isinstance(value, str) or not value:
                raise TypeError(f"idempotent(): alias must name a CACHES entry, not {value!r}")
            continue
        error = _VALIDATORS[key][1](value)
        if error is not None:
            raise (TypeError if "True or False" in error else ValueError)(
                f"idempotent(): {key.lower()} {error}"
            )


def idempotent(
    view: F | None = None,
    *,
    methods: list[str] | tuple[str, ...] | None = None,
    scope: str | Callable[[HttpRequest], str] | None = None,
    ttl: float | None = None,
    required: bool | None = None,
    max_body: int | None = None,
    replay_headers: list[str] | tuple[str, ...] | None = None,
    store_client_errors: bool | None = None,
    header: str | None = None,
    wait: float | None = None,
    timeout: float | None = None,
    renew: bool | None = None,
    alias: str | None = None,
) -> Any:
    """Honour the ``Idempotency-Key`` header on the decorated view.

    Every argument defaults to ``REDISLOCK["IDEMPOTENCY"]`` (``docs/idempotency.rst``):
    ``methods``, ``scope`` (``"user"``, ``"ip"`` or a callable of the request
    returning a str), ``ttl`` (seconds a completed response is replayed),
    ``required`` (400 without the header), ``max_body`` (bytes of body kept),
    ``replay_headers``, ``store_client_errors`` and ``header``. ``wait``
    (default 0: a duplicate gets 409 at once), ``timeout`` and ``renew`` are
    those of the lock on the key, as for ``redis_locked``; ``alias`` names the
    ``CACHES`` entry. Works on sync and async function views and on view
    methods (``dispatch``, ``post``), as ``@idempotent`` or ``@idempotent(...)``.
    """
    given = {
        "METHODS": methods,
        "SCOPE": scope,
        "TTL": ttl,
        "REQUIRED": required,
        "MAX_BODY": max_body,
        "REPLAY_HEADERS": replay_headers,
        "STORE_CLIENT_ERRORS": store_client_errors,
        "HEADER": header,
        "alias": alias,
    }
    overrides = {key: value for key, value in given.items() if value is not None}
    _check_arguments(overrides)
    lock_kwargs = {
        key: value
        for key, value in {"wait": wait, "timeout": timeout, "renew": renew, "alias": alias}.items()
        if value is not None
    }

    def decorate(func: F) -> F:
        if isinstance(func, type):
            raise TypeError(
                f"idempotent() cannot decorate the class {func.__qualname__}: decorate its "
                "dispatch() (or a handler such as post()) instead"
            )
        if not callable(func):
            raise TypeError(f"idempotent() can only decorate a view, not {func!r}")
        return _wrap(func, overrides, lock_kwargs)

    if view is not None:
        return decorate(view)
    return decorate


# -- the middleware rule --------------------------------------------------------------------
_SERVED = "_redislock_idempotency"


def _served_by_middleware(request: Any) -> bool:
    """Whether IdempotencyMiddleware holds this request's key: the decorator steps aside."""
    return getattr(request, _SERVED, False) is True


class IdempotencyMiddleware:
    """``@idempotent`` for every request whose path matches ``IDEMPOTENCY["PATHS"]``.

    For views you cannot decorate (another app's). It holds the key's lock
    around the rest of the chain, so ``ATOMIC_REQUESTS`` has committed (or
    rolled back, and the answer is a 500) before it stores the response.
    Place it after ``AuthenticationMiddleware`` (``SCOPE = "user"``).
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def _applies(self, request: HttpRequest) -> _Policy | None:
        if not conf.ENABLED:
            return None
        policy = _policy({})
        if (request.method or "").upper() not in policy.methods:
            return None
        if not any(pattern.search(request.path_info) for pattern in policy.paths):
            return None
        return policy

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        policy = self._applies(request)
        if policy is None:
            return self.get_response(request)
        prepared = _prepare(request, policy, None, None)
        if not isinstance(prepared, _Call):
            return self.get_response(request) if prepared is None else prepared
        call = prepared
        client = get_client()
        try:
            answer = _answer(call, *_read(client, call))
            if answer is not None:
                return answer
            lock = get_lock(call.name, wait=0, label=_LABEL, metric_name="idempotency")
            acquired = lock.acquire()
        except (RedisError, RedisUnavailable) as exc:
            return _unavailable(call, exc)
        if not acquired:
            return _busy_now(call, client)
        setattr(request, _SERVED, True)
        try:
            return _serve(call, lambda: self.get_response(request))
        finally:
            _release(lock, quiet=True)

    async def __acall__(self, request: HttpRequest) -> Any:
        policy = self._applies(request)
        if policy is None:
            return await self.get_response(request)
        prepared = _prepare(request, policy, await _ascope(request, policy), None)
        if not isinstance(prepared, _Call):
            return await self.get_response(request) if prepared is None else prepared
        call = prepared
        try:
            answer = _answer(call, *await _aread(get_async_client(), call))
            if answer is not None:
                return answer
            lock = get_async_lock(call.name, wait=0, label=_LABEL, metric_name="idempotency")
            acquired = await lock.acquire()
        except (RedisError, RedisUnavailable) as exc:
            return _unavailable(call, exc)
        if not acquired:
            return await _abusy(call)
        setattr(request, _SERVED, True)
        try:
            return await _aserve(call, lambda: self.get_response(request))
        finally:
            await _arelease(lock, quiet=True)


_LABEL = "IdempotencyMiddleware"


def _busy_now(call: _Call, client: Any) -> HttpResponse:
    try:
        record, pttl = _read(client, call)
    except RedisError as exc:
        return _unavailable(call, exc)
    return _answer(call, record, pttl) or _in_progress(call, pttl)
