"""Testing locked views with pytest and the django_redislock.testing fixtures.

The views are those of this repository's test app (tests/testapp/views_locked.py
and views_throttle.py); in your project, use your own URLs and lock names.
"""

from __future__ import annotations

import pytest

from django_redislock import redis_lock

pytestmark = pytest.mark.urls("tests.urls_locked")


# -- a lock busy "from elsewhere" --------------------------------------------------------
def test_purchase_answers_409_while_the_lock_is_held(client, redislock_prefix, redislock_hold):
    # The view is @redis_locked("purchase:{db}:{product_id}", wait=30): the
    # hold caps that wait to 0, so the 409 comes at once.
    redislock_hold("purchase:default:1")

    response = client.post("/purchase/default/1/")

    assert response.status_code == 409
    assert int(response.headers["Retry-After"]) >= 1


def test_a_lock_taken_in_the_test_is_reentered(client, redislock_prefix):
    # What does NOT work: the test client runs the view in the test's own
    # thread, which re-enters a lock that thread holds. The view runs.
    with redis_lock("item:shelf"):
        response = client.get("/item/shelf/")

    assert response.status_code == 200


@pytest.mark.asyncio  # pytest-asyncio runs it
async def test_async_view_answers_409_too(async_client, redislock_prefix, redislock_hold):
    redislock_hold("item:shelf")

    response = await async_client.get("/aitem/shelf/")

    assert response.status_code == 409


# -- nothing left behind -------------------------------------------------------------------
def test_the_view_gives_its_lock_back(client, redislock_no_leftovers):
    # redislock_no_leftovers gives the test its own prefix and fails the
    # test at teardown if a lock, a permit or a waiter is left.
    assert client.get("/item/shelf/").status_code == 200


# -- locks off --------------------------------------------------------------------------
def test_with_locks_off_the_view_runs_unlocked(client, redislock_disabled):
    response = client.get("/item/shelf/")

    assert response.json() == {"name": None, "fence": None}


# -- a full semaphore ------------------------------------------------------------------------
@pytest.mark.urls("tests.urls_throttle")
def test_throttled_view_answers_503_when_full(client, redislock_prefix, redislock_hold_permits):
    # @concurrency_limited("deco", 1, wait=0): its semaphore is "throttle:deco".
    redislock_hold_permits("throttle:deco", 1)

    assert client.get("/deco/").status_code == 503
