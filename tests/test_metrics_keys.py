"""Metrics of what is not a lock in its users' eyes, and of locks on several names.

Idempotency keys (by view) and unique tasks' keys (by template) are counted
as ``claimed``, ``replayed``, ``refused`` and ``released``; a lock on several
names counts once per name in every metric.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.test import Client, override_settings
from prometheus_client import REGISTRY

from django_redislock import connection, get_lock, redis_locked
from django_redislock.locking.factories import get_multi_lock
from tests.test_idempotency import post

PROM = {"METRICS": ["prometheus"]}


def sample(metric: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(metric, labels) or 0.0


@pytest.fixture
def prometheus() -> Iterator[None]:
    connection.reset()
    with override_settings(REDISLOCK=PROM):
        yield
    connection.reset()


@pytest.mark.django_db
@pytest.mark.urls("tests.test_idempotency")
def test_idempotency_keys_are_counted_per_view(prometheus: None) -> None:
    view = "idempotent:tests.test_idempotency.status_view"

    def count(outcome: str) -> float:
        return sample("redislock_idempotency_keys_total", name=view, outcome=outcome)

    before = {o: count(o) for o in ("claimed", "replayed", "refused", "released")}
    client = Client()
    assert post(client, "/status/201/", key="m-1").status_code == 201  # claimed, stored
    assert post(client, "/status/201/", key="m-1").status_code == 201  # replayed
    assert post(client, "/status/201/", key="m-1", body="{}").status_code == 422  # refused
    # A server error is not kept: the key is let go for a retry.
    assert post(client, "/status/500/", key="m-2").status_code == 500
    after = {o: count(o) for o in before}
    assert {o: after[o] - before[o] for o in before} == {
        "claimed": 2,
        "replayed": 1,
        "refused": 1,
        "released": 1,
    }


def test_unique_tasks_are_counted_per_template(prometheus: None, r: redis.Redis) -> None:
    unique = pytest.importorskip("tests.test_unique_tasks")
    if unique.task is None:
        pytest.skip("no django.tasks / django_tasks")
    name = "unique:report:{report_id}"

    def count(outcome: str) -> float:
        return sample("redislock_unique_tasks_total", name=name, outcome=outcome)

    before = {o: count(o) for o in ("claimed", "replayed", "refused", "released")}
    with override_settings(TASKS=unique.BACKENDS):
        assert unique.build_report.enqueue(report_id=1).status == "SUCCESSFUL"
        held = get_lock("unique:report:2", timeout=60, wait=0)
        assert held.acquire()
        with pytest.raises(unique.TaskNotUnique):
            unique.build_report.enqueue(report_id=2)  # on_duplicate="raise"
        held.release()
    after = {o: count(o) for o in before}
    assert {o: after[o] - before[o] for o in before} == {
        "claimed": 1,
        "replayed": 0,
        "refused": 1,
        "released": 1,
    }


def test_a_lock_on_several_names_counts_once_per_name(prometheus: None) -> None:
    """docs/metrics.rst: taking three names counts three acquires and three
    holds; staying busy, three busy outcomes."""
    labels = {"name": "cart", "kind": "lock"}

    def counts() -> dict[str, float]:
        return {
            "acquired": sample("redislock_outcomes_total", **labels, outcome="acquired"),
            "busy": sample("redislock_outcomes_total", **labels, outcome="busy"),
            "waits": sample("redislock_wait_seconds_count", **labels, outcome="acquired"),
            "holds": sample("redislock_hold_seconds_count", **labels, outcome="released"),
        }

    before = counts()
    multi = get_multi_lock(["cart:1", "cart:2", "cart:3"], wait=0, metric_name="cart")
    assert multi.acquire()
    multi.release()
    blocker = get_lock("cart:2", timeout=60, wait=0)
    assert blocker.acquire()
    assert not get_multi_lock(["cart:1", "cart:2", "cart:3"], wait=0, metric_name="cart").acquire()
    blocker.release()
    after = counts()
    assert {k: after[k] - before[k] for k in before} == {
        "acquired": 3,
        "busy": 3,
        "waits": 3,
        "holds": 3,
    }


def test_a_decorated_call_on_several_names_counts_once_per_name(prometheus: None) -> None:
    @redis_locked(lambda ids: [f"seat:{i}" for i in ids], wait=0)
    def book(ids: list[int]) -> None:
        pass

    name = f"{__name__}.test_a_decorated_call_on_several_names_counts_once_per_name.<locals>.book"
    before = sample("redislock_outcomes_total", name=name, kind="lock", outcome="acquired")
    book([1, 2, 3, 4])
    after = sample("redislock_outcomes_total", name=name, kind="lock", outcome="acquired")
    assert after - before == 4


@pytest.mark.parametrize("fail_open", [False, True])
def test_redis_down_counts_once_per_name(
    prometheus: None, redis_factory: Any, fail_open: bool
) -> None:
    from tests.servers import free_port

    server = redis_factory(port=free_port(), unix=False).start()
    url = server.url
    server.stop()
    caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url}}
    settings = {**PROM, "CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2, "FAIL_OPEN": fail_open}
    outcome = "fail_open" if fail_open else "unavailable"

    @redis_locked(lambda ids: [f"row:{i}" for i in ids], wait=0, label="rows")
    def touch(ids: list[int]) -> None:
        pass

    name = f"{__name__}.test_redis_down_counts_once_per_name.<locals>.touch"
    before = sample("redislock_outcomes_total", name=name, kind="lock", outcome=outcome)
    connection.reset()
    try:
        with override_settings(CACHES=caches, REDISLOCK=settings):
            if fail_open:
                touch([1, 2])
            else:
                with pytest.raises(Exception, match="Redis"):
                    touch([1, 2])
    finally:
        connection.reset()
    assert sample("redislock_outcomes_total", name=name, kind="lock", outcome=outcome) == (
        before + 2
    )
