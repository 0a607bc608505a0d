"""docs/operating.rst, Capacity and How listing works: the figures, measured on a private Redis.

``MEMORY USAGE`` of what a released name leaves, the bytes an acquire and
release put on the wire (``INFO stats``), and the ``SCAN`` calls a listing
makes (``INFO commandstats``). Bands are wide enough for Redis 6.2 to Valkey
8.1; the docs state the Redis 7.0 figures.
"""

from __future__ import annotations

from pathlib import Path

import redis

from django_redislock.core import KeySpace, Lock
from django_redislock.core.ops.inspection import list_locks
from django_redislock.core.ops.scan import SCAN_COUNT

KS = KeySpace("redislock")
OPERATING = " ".join(
    (Path(__file__).resolve().parents[1] / "docs" / "operating.rst").read_text().split()
)


def test_a_released_name_keeps_its_state_for_ttl_plus_10s(r: redis.Redis) -> None:
    """docs: "a released name keeps about 130 bytes plus one per character of its
    name for TIMEOUT + 10 seconds (136 bytes for cart:1, MEMORY USAGE on Redis 7.0)"."""
    assert "about 130 bytes plus one per character of its name" in OPERATING
    assert "(136 bytes for ``cart:1``, ``MEMORY USAGE`` on Redis 7.0)" in OPERATING
    sizes = {}
    for name in ("cart:1", "cart:" + "x" * 51):
        lock = Lock(r, name, ttl=30, wait=0, keyspace=KS)
        assert lock.acquire()
        lock.release()
        (left,) = list(r.scan_iter(match=f"{KS.prefix}:*{name}"))
        assert left == KS.lock(name).state  # only the state stays
        assert 30_000 < r.pttl(left) <= 40_000  # TIMEOUT + 10 s
        sizes[name] = int(r.memory_usage(left, samples=0) or 0)
    assert 136 * 0.75 <= sizes["cart:1"] <= 136 * 1.25
    # 50 more characters: about 50 more bytes (the allocator rounds up).
    assert 35 <= sizes["cart:" + "x" * 51] - sizes["cart:1"] <= 75


def test_bytes_on_the_wire_per_acquire_and_release(r: redis.Redis, redis_server: object) -> None:
    """ "an uncontended acquire and release send about 600 bytes to Redis and get 27 back"."""
    assert "send about 600 bytes to Redis and get 27 back" in OPERATING
    observer = redis.Redis(unix_socket_path=r.connection_pool.connection_kwargs["path"])

    def totals() -> tuple[int, int]:
        stats = observer.info("stats")
        return int(stats["total_net_input_bytes"]), int(stats["total_net_output_bytes"])

    warm = Lock(r, "wire:0", ttl=30, wait=0, keyspace=KS)
    assert warm.acquire()
    warm.release()  # the scripts are loaded, the connection made
    a, b = totals(), totals()
    overhead = (b[0] - a[0], b[1] - a[1])  # what one INFO itself costs
    pairs = 100
    before = totals()
    for i in range(pairs):
        lock = Lock(r, f"cart:{i}", ttl=30, wait=0, keyspace=KS)
        assert lock.acquire()
        lock.release()
    after = totals()
    sent = (after[0] - before[0] - overhead[0]) / pairs
    got = (after[1] - before[1] - overhead[1]) / pairs
    observer.close()
    assert 450 <= sent <= 750, sent
    assert 20 <= got <= 40, got


def test_a_listing_scans_once_per_kind_and_reads_each_held_name_once(r: redis.Redis) -> None:
    """ "one SCAN call per 500 keys ... then one read per held name"; "--kind lock
    walks it once instead of three times"."""
    assert "one ``SCAN`` call per 500 keys" in OPERATING
    assert SCAN_COUNT == 500
    with r.pipeline(transaction=False) as pipe:
        for i in range(20_000):
            pipe.set(f"app:cache:{i}", "x")
        pipe.execute()
    held = [Lock(r, f"cart:{i}", ttl=300, wait=0, keyspace=KS) for i in range(30)]
    for lock in held:
        assert lock.acquire()

    def calls(**kwargs: object) -> tuple[int, int]:
        r.config_resetstat()
        rows = list_locks(r, KS, **kwargs)  # type: ignore[arg-type]
        assert len(rows) == 30
        stats = r.info("commandstats")
        scans = int(stats.get("cmdstat_scan", {}).get("calls", 0))
        reads = int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
        return scans, reads

    scans, reads = calls()
    # 20,030 keys, 500 a call, three kinds: about 3 x 40 calls.
    assert 3 * 35 <= scans <= 3 * 50, scans
    assert reads == 30
    scans, reads = calls(kinds=("lock",))
    assert 35 <= scans <= 50, scans
    assert reads == 30
    assert "``--kind lock`` walks it once instead of three times" in OPERATING
