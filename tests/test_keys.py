"""Lock names to keys: namespaced, bounded, injective, one Cluster slot per lock."""

from __future__ import annotations

import hashlib

import pytest
import redis
from redis.crc import key_slot

from django_redislock.core import KeySpace, Lock
from django_redislock.core.engine.keys import READABLE_LIMIT, shows_name, validate_prefix
from tests.helpers_oracles import audit_keyspace, plant_sentinel

HOSTILE = [
    "a",
    "x" * (1024 * 1024),
    "x" * READABLE_LIMIT,
    "x" * (READABLE_LIMIT + 1),
    "za\u017c\u00f3\u0142\u0107 g\u0119\u015bl\u0105 \U0001f980 \u30ed\u30c3\u30af",
    "\ud800",
    "lone \udfff surrogate",
    "*",
    "?",
    "[a-z]",
    "redislock:L:*",
    "{",
    "}",
    "{}",
    "{tag}rest",
    "}{",
    "line\nbreak\r\n",
    "nul\x00byte",
    "\x00",
    " ",
    "=",
    "#",
]


def _all_keys(ks: KeySpace, name: str) -> list[bytes]:
    keys = ks.lock(name)
    sem = ks.semaphore(name)
    return [keys.lease, keys.queue, keys.state, sem.lease, sem.queue, sem.state]


@pytest.mark.parametrize("name", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_names_stay_in_namespace_and_one_slot(name: str) -> None:
    ks = KeySpace("redislock")
    keys = _all_keys(ks, name)
    for key in keys:
        assert key.startswith(b"redislock:")
        # Bounded: the readable form is capped, long names are hashed.
        assert len(key) <= len(b"redislock:SQ:{0123456789abcdef}:=") + READABLE_LIMIT
    tag = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16].encode()
    for key in keys:
        # The first brace pair is ours, whatever braces the name contains.
        assert key[key.index(b"{") + 1 : key.index(b"}")] == tag
    assert len({key_slot(k) for k in keys}) == 1


def test_distinct_names_give_distinct_keys() -> None:
    ks = KeySpace()
    long_name = "y" * (READABLE_LIMIT + 50)
    digest = hashlib.sha256(long_name.encode()).hexdigest()
    tag = digest[:16]
    names = list(HOSTILE) + [
        # Short names dressed as the long form of another name, or its keys.
        "#" + digest,
        long_name,
        "{" + tag + "}:#" + digest,
        f"redislock:L:{{{tag}}}:#{digest}",
        "x" * READABLE_LIMIT + "y",
        "x" * READABLE_LIMIT + "z",
        "ab",
        "a\x00b",
        "a:b",
        "a:\x00b",
        "A",
    ]
    seen: dict[bytes, str] = {}
    for name in names:
        for key in _all_keys(ks, name):
            assert key not in seen or seen[key] == name, (name, seen.get(key))
            seen[key] = name
    assert len(seen) == 6 * len(set(names))


def test_long_form_collision_attempt_is_not_a_collision() -> None:
    ks = KeySpace()
    long_name = "q" * (READABLE_LIMIT + 1)
    long_keys = ks.lock(long_name)
    suffix = long_keys.lease.split(b":", 3)[3]  # "#<sha256>"
    short = suffix.decode()
    assert len(short.encode()) <= READABLE_LIMIT
    assert ks.lock(short).lease != long_keys.lease


def test_empty_and_non_string_names_are_rejected() -> None:
    ks = KeySpace()
    with pytest.raises(ValueError, match="empty"):
        ks.lock("")
    with pytest.raises(TypeError, match="str"):
        ks.lock(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="str"):
        ks.lock(7)  # type: ignore[arg-type]


def test_empty_name_rejected_by_lock(r: redis.Redis) -> None:
    with pytest.raises(ValueError, match="empty"):
        Lock(r, "")


@pytest.mark.parametrize(
    "prefix",
    ["", "a{b}", "a b", "a*", "a?", "a[b]", "x" * 65, "p\n", "pre\x00", "\u00e5", 5, None],
)
def test_bad_prefixes_are_rejected(prefix: object) -> None:
    with pytest.raises(ValueError, match="invalid key prefix"):
        KeySpace(prefix)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="A-Z a-z 0-9"):
        validate_prefix(prefix)  # type: ignore[arg-type]


@pytest.mark.parametrize("prefix", ["redislock", "my.app:locks", "a", "A-b_c", "x" * 64])
def test_good_prefixes(prefix: str) -> None:
    ks = KeySpace(prefix)
    assert ks.lock("n").lease.startswith(prefix.encode() + b":L:")
    assert ks.scan_pattern(b"L") == prefix.encode() + b":L:{*}:*"


def test_prefixes_separate_namespaces() -> None:
    assert KeySpace("a").lock("n").lease != KeySpace("a:b").lock("n").lease
    assert KeySpace("a").lock("b:L:n").lease != KeySpace("a:b").lock("n").lease


@pytest.mark.parametrize("name", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_names_lock_for_real(r: redis.Redis, name: str) -> None:
    plant_sentinel(r)
    a = Lock(r, name, ttl=5, wait=0)
    b = Lock(r, name, ttl=5, wait=0)
    assert a.acquire()
    assert not b.acquire()
    keys = audit_keyspace(r)
    assert a.keys.lease in keys
    raw = name.encode("utf-8", "surrogatepass")
    # The lease stores the name when the key cannot show it (long names).
    assert r.hget(a.keys.lease, "n") == (None if shows_name(raw) else raw)
    a.release()
    assert b.acquire()
    b.release()
    audit_keyspace(r)


def test_huge_names_are_not_memoised() -> None:
    ks = KeySpace()
    for i in range(50):
        ks.lock(f"{i}:" + "h" * 100_000)
    assert ks._lock_keys.cache_info().currsize == 0  # type: ignore[attr-defined]
    ks.lock("small")
    ks.lock("small")
    info = ks._lock_keys.cache_info()  # type: ignore[attr-defined]
    assert info.currsize == 1 and info.hits == 1
    assert ks.lock("h" * 100_000) == ks.lock("h" * 100_000)
