"""Lock names to Redis keys.

Layout, for a lock called ``name`` under the prefix ``P`` (default ``redislock``)::

    P:L:{T}:<n>   hash   the lease: token, fence, name, owner; exists only while held
    P:Q:{T}:<n>   list   FIFO queue of waiting tokens
    P:H:{T}:<n>   hash   lock state: last fence, reservation, each waiter's deadline
    P:S:{T}:<n>   zset   semaphore holders (token -> expiry), see ``semaphore.py``
    P:RW:{T}:<n>  zset   read-write lock holders (token -> expiry), see ``rwlock.py``;
                         its queue is ``P:RQ:{T}:<n>`` and its state ``P:RH:{T}:<n>``
    P:I:{T}:<n>   hash   an idempotency record (``KeySpace.idempotency``): the
                         request's fingerprint, its state and its stored response
    P:F:{T}:<n>   hash   force-release marks of the name, any kind: token ->
                         {"by", "at"}, for the holder to find (``loss.py``);
                         written only by a force-release, kept an hour
    P:N:<id>      channel a process's wake-up channel (pub/sub, not a key)
    P:N:{T}:<id>  channel the same on a Cluster: sharded, in the slot of tag T

``T`` is a hash tag (16 hex digits of SHA-256 of the name), so every key of one
lock lives in one Redis Cluster slot whatever the name contains. ``<n>`` is
``=`` followed by the name itself when its UTF-8 form is at most
``READABLE_LIMIT`` bytes, so ``redis-cli`` shows something a person recognises,
and ``#`` followed by the full SHA-256 hex digest otherwise. The two forms
cannot be confused (different first byte), two short names differ in their
bytes, and two long names would need a SHA-256 collision: the mapping is
injective for every practical purpose, and keys stay bounded in length.

An ``Idempotency-Key`` is a lock too: its name is ``idempotency:`` and the
SHA-256 of the scope and the key (so nothing a client sends reaches Redis
unhashed), and its record uses the lock's tag, so the record and the lease
share a Cluster slot and are read in one round trip.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache

__all__ = [
    "IdempotencyKeys",
    "KeySpace",
    "LockKeys",
    "encode_name",
    "shows_name",
    "validate_prefix",
]

# Long enough for any name a person types, short enough that a key stays cheap.
READABLE_LIMIT = 120

_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


def validate_prefix(prefix: str) -> str:
    """Return ``prefix`` or raise ``ValueError`` saying what is wrong with it.

    Braces would move the Cluster hash tag and glob characters would make the
    inspection SCAN match foreign keys, so the prefix is kept to a plain set.
    """
    if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix):
        raise ValueError(
            f"invalid key prefix {prefix!r}: use 1 to 64 characters from A-Z a-z 0-9 _ . : -"
        )
    return prefix


def encode_name(name: str) -> bytes:
    """UTF-8 bytes of a lock name; lone surrogates are kept, not rejected."""
    if not isinstance(name, str):
        raise TypeError(f"lock name must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError("lock name must not be empty")
    return name.encode("utf-8", "surrogatepass")


def shows_name(raw: bytes) -> bool:
    """Whether the keys of the name ``raw`` (encoded) hold it readably; longer
    names are hashed, and their lease stores the name itself for operators."""
    return len(raw) <= READABLE_LIMIT


def decode_name(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogatepass")


@dataclass(frozen=True, slots=True)
class LockKeys:
    lease: bytes
    queue: bytes
    state: bytes
    tag: bytes


@dataclass(frozen=True, slots=True)
class IdempotencyKeys:
    name: str  # the lock's name
    lease: bytes  # the lock's lease: while it exists, the first request runs
    record: bytes  # the record: fingerprint, state, response


class KeySpace:
    """Maps names to keys under one prefix. Cheap to create; memoises names."""

    __slots__ = ("prefix", "_prefix_b", "_lock_keys")

    def __init__(self, prefix: str = "redislock") -> None:
        self.prefix = validate_prefix(prefix)
        self._prefix_b = prefix.encode()
        # Hot paths build the same keys over and over; hashing once is enough.
        self._lock_keys = lru_cache(maxsize=4096)(self._build_lock_keys)

    def __repr__(self) -> str:
        return f"KeySpace({self.prefix!r})"

    def _suffix(self, raw: bytes) -> tuple[bytes, bytes]:
        digest = hashlib.sha256(raw).hexdigest().encode()
        tag = b"{" + digest[:16] + b"}"
        if shows_name(raw):
            return tag, tag + b":=" + raw
        return tag, tag + b":#" + digest

    def _keys(self, name: str, lease: bytes, queue: bytes, state: bytes) -> LockKeys:
        """The keys of ``name`` for one kind, whose key types are ``lease`` etc."""
        tag, suffix = self._suffix(encode_name(name))
        p = self._prefix_b + b":"
        return LockKeys(p + lease + suffix, p + queue + suffix, p + state + suffix, tag)

    def _build_lock_keys(self, name: str) -> LockKeys:
        return self._keys(name, b"L:", b"Q:", b"H:")

    def lock(self, name: str) -> LockKeys:
        if isinstance(name, str) and len(name) > 4 * READABLE_LIMIT:
            # The memo keeps its names alive: thousands of huge ones would pin
            # gigabytes. Hashing a long name again is cheap by comparison.
            return self._build_lock_keys(name)
        return self._lock_keys(name)

    @staticmethod
    def default(prefix: str = "redislock") -> KeySpace:
        """One shared ``KeySpace`` per prefix: handles made per call (a
        decorator makes one each time) share its memo instead of hashing
        every name again into a memo of their own."""
        return _shared(prefix)

    def semaphore(self, name: str) -> LockKeys:
        """Keys of a semaphore: holders zset in ``lease``, then queue and state."""
        return self._keys(name, b"S:", b"SQ:", b"SH:")

    def rwlock(self, name: str) -> LockKeys:
        """Keys of a read-write lock: holders zset in ``lease``, then queue and state."""
        return self._keys(name, b"RW:", b"RQ:", b"RH:")

    def forced(self, name: str) -> bytes:
        """The key of the force-release marks of ``name`` (every kind: tokens
        are unique), in the slot of its other keys."""
        _, suffix = self._suffix(encode_name(name))
        return self._prefix_b + b":F:" + suffix

    def idempotency(self, scope: str, key: str) -> IdempotencyKeys:
        """Keys of one ``Idempotency-Key`` sent in ``scope`` (whose keys these are).

        A NUL separates scope and key: a scope cannot end where a key begins.
        """
        digest = hashlib.sha256(
            scope.encode("utf-8", "surrogatepass") + b"\0" + key.encode("utf-8", "surrogatepass")
        ).hexdigest()
        name = f"idempotency:{digest}"
        _, suffix = self._suffix(encode_name(name))
        return IdempotencyKeys(
            name=name, lease=self.lock(name).lease, record=self._prefix_b + b":I:" + suffix
        )

    def channel(self, process_id: str, tag: bytes = b"") -> bytes:
        """The wake-up channel of one process (and one hash slot, on a Cluster).

        ``P:N:<id>`` on one server; ``P:N:{T}:<id>`` for the sharded channel
        that shares the slot of the locks tagged ``{T}``.
        """
        if tag:
            return self._prefix_b + b":N:" + tag + b":" + process_id.encode()
        return self._prefix_b + b":N:" + process_id.encode()

    def scan_pattern(self, kind: bytes) -> bytes:
        """SCAN MATCH pattern for every key of one kind (``b"L"``, ``b"S"``, ``b"RW"``)."""
        return self._prefix_b + b":" + kind + b":{*}:*"


@lru_cache(maxsize=64)
def _shared(prefix: str) -> KeySpace:
    return KeySpace(prefix)
