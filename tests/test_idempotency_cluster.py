"""``@idempotent`` on a Redis Cluster: the record shares the lock's slot, and it all works.

The record and the lease are read in one pipeline; on a Cluster that only
works because both keys carry the lock's hash tag. Keys whose lock lands on
each of the three primaries are used, hostile ones among them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from django.test import AsyncClient, Client, override_settings
from redis.cluster import RedisCluster

from django_redislock import connection
from django_redislock.contrib.cluster import cluster_client_factory
from django_redislock.idempotency import REPLAYED_HEADER
from tests import test_idempotency as views
from tests.test_idempotency import WAIT, gate, in_thread, post, runs
from tests.topologies import ClusterTopology

pytestmark = [pytest.mark.cluster, pytest.mark.urls("tests.test_idempotency")]


@pytest.fixture
def rc(rc: RedisCluster) -> Iterator[RedisCluster]:
    """conftest's client, with the views' records cleared and their gate open after."""
    runs.clear()
    yield rc
    gate.open.set()


@pytest.fixture
def on_cluster(topology: ClusterTopology, rc: RedisCluster) -> Iterator[None]:
    with override_settings(REDISLOCK={"CLIENT": cluster_client_factory(topology.url)}):
        connection.reset()
        yield
    connection.reset()


def records(rc: RedisCluster) -> list[bytes]:
    return sorted(
        key
        for node in rc.get_primaries()
        for key in rc.scan_iter(match="redislock:I:*", target_nodes=node)
    )


def keys_on_every_primary(rc: RedisCluster) -> list[bytes]:
    """Idempotency keys whose records land on three different primaries."""
    found: dict[str, bytes] = {}
    seen: set[bytes] = set()
    for i in range(1000):
        key = f"{{k}}*?[{i}]"  # braces and glob characters, hashed away
        assert post(Client(), "/plain/", key=key).status_code == 200
        (record,) = set(records(rc)) - seen
        seen.add(record)
        found.setdefault(rc.get_node_from_key(record).name, record)
        if len(found) == 3:
            break
    return sorted(found.values())


@pytest.mark.usefixtures("on_cluster")
def test_replay_and_reuse_on_every_primary(rc: RedisCluster) -> None:
    assert len(keys_on_every_primary(rc)) == 3
    before = len(runs)
    for i in range(before):
        key = f"{{k}}*?[{i}]"
        again = post(Client(), "/plain/", key=key)
        assert again[REPLAYED_HEADER] == "true", key
        assert post(Client(), "/plain/", key=key, body="{}").status_code == 422
    assert len(runs) == before


@pytest.mark.usefixtures("on_cluster")
@pytest.mark.django_db(transaction=True)
def test_duplicate_during_the_run_gets_409_on_a_cluster(coffee_db: None) -> None:
    gate.hold()
    first, out = in_thread(lambda: post(Client(), "/charge/default/"))
    assert gate.entered.wait(WAIT)
    busy = post(Client(), "/charge/default/")
    assert busy.status_code == 409
    assert int(busy["Retry-After"]) >= 1
    gate.open.set()
    first.join(WAIT)
    assert out[0].status_code == 201
    assert post(Client(), "/charge/default/").content == out[0].content
    assert runs == ["charge"]


@pytest.fixture
def coffee_db() -> None:
    from tests.testapp.models import Product

    Product.objects.create(name="coffee", stock=10)


@pytest.mark.usefixtures("on_cluster")
def test_async_view_on_a_cluster() -> None:
    async def scenario() -> None:
        views.agate["entered"], views.agate["open"] = asyncio.Event(), asyncio.Event()
        client = AsyncClient()
        first = asyncio.ensure_future(post(client, "/acharge/"))
        await asyncio.wait_for(views.agate["entered"].wait(), WAIT)  # type: ignore[union-attr]
        assert (await post(client, "/acharge/")).status_code == 409
        views.agate["open"].set()  # type: ignore[union-attr]
        original = await asyncio.wait_for(first, WAIT)
        replay = await post(client, "/acharge/")
        assert replay.content == original.content
        assert replay[REPLAYED_HEADER] == "true"
        # This loop's clients and wake-up readers go with it.
        for task in asyncio.all_tasks():
            if task.get_name().startswith("redislock-notify"):
                task.cancel()
        await connection.get_async_client().aclose()

    try:
        asyncio.run(scenario())
    finally:
        views.agate["entered"] = views.agate["open"] = None
    assert runs == ["acharge"]
