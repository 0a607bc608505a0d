"""``redis_locked`` on views (through ``client`` and ``async_client``), CBVs and functions."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connections
from django.http import HttpResponse
from django.test import override_settings
from django.utils.decorators import method_decorator

from django_redislock import (
    LockLost,
    LockNotAcquired,
    RedisUnavailable,
    current_lock,
    get_lock,
    redis_lock,
    redis_locked,
)
from django_redislock import connection as rl_connection
from django_redislock.core.io import wakeups_async
from django_redislock.signals import (
    lock_acquired,
    lock_busy,
    lock_lost,
    lock_released,
    redis_unavailable,
)
from tests.helpers import is_free
from tests.helpers_oracles import signal_sent
from tests.servers import free_port
from tests.testapp import views_locked
from tests.testapp.models import Product

pytestmark = pytest.mark.urls("tests.urls_locked")

Get = Callable[..., Any]


@pytest.fixture(params=["client", "async_client"])
def get(request: pytest.FixtureRequest) -> Get:
    """GET through the WSGI test client or, run to completion, the ASGI one."""
    return make_get(request)


def make_get(request: pytest.FixtureRequest) -> Get:
    if request.param == "client":
        client = request.getfixturevalue("client")
        return lambda url, **extra: client.get(url, **extra)
    aclient = request.getfixturevalue("async_client")

    async def aget(url: str, **extra: Any) -> Any:
        try:
            return await aclient.get(url, **extra)
        finally:
            await close_async_clients()

    return lambda url, **extra: async_to_sync(aget)(url, **extra)


async def close_async_clients() -> None:
    """Close the library's asyncio clients of the running loop before it ends.

    The library keeps one client per event loop; a test's loop ends with the
    test, and its open sockets would otherwise be reported as leaked.
    """
    loop = asyncio.get_running_loop()
    # Wake-up listeners first: they hold a connection of the client.
    for _pool, notifier in wakeups_async._notifiers.pop(loop, {}).values():
        task = notifier._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    for value in rl_connection._async_clients.pop(loop, {}).values():
        if inspect.isasyncgen(value):
            await value.aclose()  # the loop-shutdown closer: closes its client
        else:
            await value.aclose(close_connection_pool=True)


@pytest.fixture
def held(redislock_hold: Callable[..., Any]) -> Callable[..., Any]:
    """Hold named locks from elsewhere for the test's duration (the test kit's
    hold, with the callers' waits left as they are)."""
    return lambda name, timeout=30: redislock_hold(name, timeout=timeout, wait=None)


def force_release(name: str) -> None:
    """Take ``name`` away from its holder as an operator would (``redislocks clear``)."""
    from django_redislock.core.ops import force
    from django_redislock.locking.factories import keyspace

    result = force.clear(get_lock(name).client, keyspace(), names=[name])
    assert [row.name for row in result.released] == [name]


@pytest.fixture
def dead_redis(redis_factory: Any) -> Iterator[None]:
    """CACHES pointed at a private Redis that has been stopped."""
    server = redis_factory(port=free_port(), unix=False).start()
    url = server.url
    server.stop()
    caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url}}
    with override_settings(
        CACHES=caches, REDISLOCK={"CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2}
    ):
        rl_connection.reset()
        try:
            yield
        finally:
            rl_connection.reset()


# -- views ---------------------------------------------------------------------------------
VIEWS = ["item", "aitem"]


@pytest.mark.parametrize("view", VIEWS)
def test_view_runs_under_its_lock_and_releases(get: Get, view: str) -> None:
    response = get(f"/{view}/apple/")
    assert response.status_code == 200
    body = response.json()
    assert body["name"] == "item:apple"
    assert isinstance(body["fence"], int)
    assert is_free("item:apple")
    assert current_lock() is None


@pytest.mark.parametrize("view", VIEWS)
def test_busy_view_gets_409_with_retry_after(get: Get, view: str, held: Any) -> None:
    held("item:apple", timeout=30)
    response = get(f"/{view}/apple/")
    assert response.status_code == 409
    assert 1 <= int(response["Retry-After"]) <= 30
    # A client that accepts anything (the test client sends no Accept) gets JSON.
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "lock_busy"
    assert response["Cache-Control"] == "no-store"


@pytest.mark.parametrize("view", VIEWS)
def test_busy_view_answers_json_when_asked(get: Get, view: str, held: Any) -> None:
    held("item:apple", timeout=20)
    response = get(f"/{view}/apple/", headers={"accept": "application/json"})
    assert response.status_code == 409
    body = response.json()
    assert body["error"] == "busy"
    assert body["retry_after"] == int(response["Retry-After"])
    assert 1 <= body["retry_after"] <= 20


def custom_busy(request: Any, *, status: int, retry_after: Any, reason: str, name: str) -> Any:
    return HttpResponse(f"{reason}:{name}", status=status)


@pytest.mark.parametrize("view", VIEWS)
def test_busy_status_and_response_are_settings(get: Get, view: str, held: Any) -> None:
    held("item:apple")
    with override_settings(
        REDISLOCK={"BUSY_STATUS": 423, "BUSY_RESPONSE": "tests.test_decorators.custom_busy"}
    ):
        response = get(f"/{view}/apple/")
    assert response.status_code == 423
    assert response.content == b"busy:item:apple"
    assert response.has_header("Retry-After")


@pytest.mark.parametrize("view", ["item-custom-busy", "aitem-custom-busy"])
def test_on_busy_callable_answers_for_the_view(get: Get, view: str, held: Any) -> None:
    held("item:apple")
    response = get(f"/{view}/apple/")
    assert (response.status_code, response.content) == (423, b"come back later")


@pytest.mark.parametrize("view", ["item-boom", "aitem-boom"])
def test_view_exception_passes_through_and_releases(get: Get, view: str) -> None:
    with pytest.raises(views_locked.Boom, match="apple"):
        get(f"/{view}/apple/")
    assert is_free("item:apple")


@pytest.mark.parametrize("view", VIEWS)
def test_redis_down_fails_closed_with_503(
    get: Get, view: str, dead_redis: None, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        signal_sent(redis_unavailable) as seen,
        caplog.at_level(logging.WARNING, logger="django_redislock.unavailable"),
    ):
        response = get(f"/{view}/apple/", headers={"accept": "application/json"})
    assert response.status_code == 503
    assert int(response["Retry-After"]) >= 1
    assert response.json()["error"] == "unavailable"
    assert [(s["name"], s["fail_open"]) for s in seen] == [("item:apple", False)]
    assert "not running" in caplog.text


@pytest.mark.parametrize("view", ["item-fail-open", "aitem-fail-open"])
def test_redis_down_fail_open_argument_runs_unlocked(
    get: Get, view: str, dead_redis: None, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        signal_sent(redis_unavailable) as sent,
        caplog.at_level(logging.WARNING, logger="django_redislock.unavailable"),
    ):
        response = get(f"/{view}/apple/")
    assert response.status_code == 200
    assert response.json() == {"name": None, "fence": None}
    assert [fields["fail_open"] for fields in sent] == [True]
    assert "running unlocked" in caplog.text


@pytest.mark.parametrize("view", VIEWS)
def test_redis_down_fail_open_setting(get: Get, view: str, dead_redis: None) -> None:
    with override_settings(
        REDISLOCK={"FAIL_OPEN": True, "CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2}
    ):
        response = get(f"/{view}/apple/")
    assert response.status_code == 200
    assert response.json()["name"] is None


@pytest.mark.parametrize("view", VIEWS)
def test_disabled_runs_unlocked(get: Get, view: str, held: Any) -> None:
    held("item:apple")
    with override_settings(REDISLOCK={"ENABLED": False}):
        response = get(f"/{view}/apple/")
    assert response.status_code == 200
    assert response.json() == {"name": None, "fence": None}


@pytest.mark.django_db(transaction=True)
def test_async_view_key_may_load_the_user(async_client: Any, django_user_model: Any) -> None:
    user = django_user_model.objects.create_user("ann", password="pw")
    async_client.force_login(user)
    response = async_to_sync(async_client.get)("/acart/")
    assert response.status_code == 200
    assert response.json()["name"] == f"cart:{user.pk}"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("atomic_requests", [True, False])
def test_lease_run_out_before_commit(
    get: Get,
    atomic_requests: bool,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setitem(connections.settings["default"], "ATOMIC_REQUESTS", atomic_requests)
    with caplog.at_level(logging.WARNING, logger="django_redislock.lost"):
        response = get("/item-outlives-lease/pear/")
    if atomic_requests:
        # The decorator owns the transaction: it refuses to commit without the lock.
        assert response.status_code == 503
        assert not Product.objects.filter(name="pear").exists()
    else:
        # Autocommitted already: nothing to undo, the loss is reported.
        assert response.status_code == 200
        assert Product.objects.filter(name="pear").exists()
        assert "lost 'item:pear'" in caplog.text


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("view", "atomic_requests"),
    # Django refuses ATOMIC_REQUESTS for async views: that one opens its own block.
    [("item-lost-midway", True), ("aitem-lost-midway", False)],
    ids=["sync", "async"],
)
def test_lock_taken_away_mid_view_rolls_back_and_answers_503(
    get: Get, view: str, atomic_requests: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(connections.settings["default"], "ATOMIC_REQUESTS", atomic_requests)
    views_locked.lost_inside.clear()
    views_locked.lost_proceed.clear()
    name = f"{view}-fig"
    lock_name = f"item:{name}"
    heard = threading.Event()

    def receiver(sender: Any, name: str, **kwargs: Any) -> None:
        if name == lock_name:
            heard.set()

    lock_lost.connect(receiver)
    responses: list[Any] = []

    def request() -> None:
        try:
            responses.append(get(f"/{view}/{name}/"))
        finally:
            # The view's database connection was made in this thread.
            connections.close_all()

    thread = threading.Thread(target=request)
    thread.start()
    try:
        assert views_locked.lost_inside.wait(10)
        force_release(lock_name)
        other = get_lock(lock_name, wait=0)
        assert other.acquire()  # a second holder is in while the view still runs
        assert heard.wait(10)  # the view's renewal has found its lease gone
    finally:
        views_locked.lost_proceed.set()
        thread.join(30)
        lock_lost.disconnect(receiver)
    other.release()
    assert not thread.is_alive()
    (response,) = responses
    assert response.status_code == 503
    assert response["Retry-After"] == "1"
    assert not Product.objects.filter(name=name).exists()


def test_concurrent_holder_keeps_others_out(client: Any) -> None:
    views_locked.inside.clear()
    views_locked.proceed.clear()
    results: list[int] = []
    thread = threading.Thread(
        target=lambda: results.append(client.get("/item-gated/plum/").status_code)
    )
    thread.start()
    try:
        assert views_locked.inside.wait(10)
        assert client.get("/item/plum/").status_code == 409
    finally:
        views_locked.proceed.set()
        thread.join(10)
    assert results == [200]
    assert client.get("/item/plum/").status_code == 200


# -- class-based views ---------------------------------------------------------------------
CBVS = [
    "/cbv/dispatch/7/",
    "/cbv/self/7/",
    "/cbv/method-decorator/7/",
    "/cbv/method-decorator-self/7/",
    "/cbv/async/7/",
]


@pytest.mark.parametrize("url", CBVS)
def test_class_based_views(get: Get, url: str, held: Any) -> None:
    response = get(url)
    assert response.status_code == 200
    assert response.json()["name"] == "cbv:7"
    holder = held("cbv:7")
    busy = get(url)
    assert busy.status_code == 409
    assert busy.has_header("Retry-After")
    holder.release()
    assert get(url).status_code == 200


def test_method_decorator_checks_the_template_on_first_call(rf: Any) -> None:
    # method_decorator applies decorators per call, to a partial of the bound
    # method: the template is checked then (decorate the method directly to
    # have it checked when the class is defined).
    @method_decorator(redis_locked("x:{nope}"), name="get")
    class V(views_locked.View):
        def get(self, request: Any) -> HttpResponse:
            return HttpResponse()

    with pytest.raises(ValueError, match=r"\{nope\}, which is not a parameter"):
        V.as_view()(rf.get("/"))


# -- plain functions -------------------------------------------------------------------------
def test_template_binds_positional_keyword_and_default_arguments() -> None:
    names = []

    @redis_locked("job:{kind}:{n:03d}:{opts[mode]}", wait=0)
    def job(kind: str, n: int = 5, *, opts: dict[str, str]) -> None:
        lock = current_lock()
        assert lock is not None
        names.append(lock.name)

    job("a", opts={"mode": "x"})
    job("b", 7, opts={"mode": "y"})
    job(kind="c", n=12, opts={"mode": "z"})
    assert names == ["job:a:005:x", "job:b:007:y", "job:c:012:z"]


def test_var_keyword_arguments_may_be_named() -> None:
    @redis_locked("kw:{pk}:{kwargs[pk]}", wait=0)
    def f(*args: Any, **kwargs: Any) -> str:
        lock = current_lock()
        assert lock is not None
        return lock.name

    assert f(pk=3) == "kw:3:3"
    with pytest.raises(TypeError, match=r"needs \{pk\}"):
        f(other=1)


def test_callable_key_gets_the_same_arguments() -> None:
    seen = []

    def name_of(a: int, b: int = 0) -> str:
        seen.append((a, b))
        return f"sum:{a + b}"

    @redis_locked(name_of, wait=0)
    def add(a: int, b: int = 0) -> str | None:
        lock = current_lock()
        return lock.name if lock else None

    assert add(1, b=2) == "sum:3"
    assert seen == [(1, 2)]

    @redis_locked(lambda: 42, wait=0)
    def bad() -> None:
        pass

    with pytest.raises(TypeError, match="must return a non-empty str"):
        bad()


def test_methods_can_name_self() -> None:
    class Account:
        def __init__(self, pk: int) -> None:
            self.pk = pk

        @redis_locked("account:{self.pk}", wait=0)
        def touch(self) -> str | None:
            lock = current_lock()
            return lock.name if lock else None

    assert Account(9).touch() == "account:9"


def test_busy_raises_by_default_for_functions(held: Any) -> None:
    held("report:1", timeout=25)

    @redis_locked("report:{n}", wait=0)
    def report(n: int) -> str:
        return "ran"

    with pytest.raises(LockNotAcquired) as info:
        report(1)
    assert info.value.name == "report:1"
    assert info.value.retry_after is not None and 0 < info.value.retry_after <= 25


def test_on_busy_skip_and_callable(held: Any) -> None:
    held("report:1")
    ran = []

    @redis_locked("report:{n}", wait=0, on_busy="skip")
    def skipped(n: int) -> str:
        ran.append(n)
        return "ran"

    @redis_locked("report:{n}", wait=0, on_busy=lambda n: f"busy {n}")
    def fallback(n: int) -> str:
        ran.append(n)
        return "ran"

    assert skipped(1) is None
    assert fallback(1) == "busy 1"
    assert ran == []
    assert skipped(2) == "ran"


def test_on_busy_raise_applies_to_views_too(rf: Any, held: Any) -> None:
    @redis_locked("v", wait=0, on_busy="raise")
    def view(request: Any) -> HttpResponse:
        return HttpResponse()

    held("v")
    with pytest.raises(LockNotAcquired):
        view(rf.get("/"))


def test_function_waits_for_a_holder_then_runs() -> None:
    order = []
    inside = threading.Event()
    go = threading.Event()

    @redis_locked("seq", wait=10)
    def work(tag: str) -> None:
        order.append(f"{tag}-in")
        if tag == "first":
            inside.set()
            go.wait(10)
        order.append(f"{tag}-out")

    first = threading.Thread(target=work, args=("first",))
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=work, args=("second",))
    second.start()
    go.set()
    first.join(10)
    second.join(10)
    assert order == ["first-in", "first-out", "second-in", "second-out"]


def test_function_exception_passes_and_releases() -> None:
    @redis_locked("fails", wait=0)
    def fails() -> None:
        raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        fails()
    assert is_free("fails")


def test_lost_lease_raises_lock_lost_for_functions(r: Any) -> None:
    @redis_locked("short", wait=0)
    def work() -> str:
        # Another party clears the lease while we work.
        for key in r.scan_iter(match="*short*"):
            if b":L:" in key:
                r.delete(key)
        return "done"

    with pytest.raises(LockLost):
        work()


def test_redis_down_raises_for_functions(dead_redis: None) -> None:
    @redis_locked("x", wait=0)
    def f() -> str:
        return "ran"

    @redis_locked("x", wait=0, fail_open=True)
    def g() -> str:
        return "ran"

    with signal_sent(redis_unavailable) as sent:
        with pytest.raises(RedisUnavailable):
            f()
        assert g() == "ran"
    # As for async callables (tests/test_decorators_async.py): one signal each, saying which.
    assert [fields["fail_open"] for fields in sent] == [False, True]


def test_disabled_functions_run_unlocked(held: Any) -> None:
    held("x")

    @redis_locked("x", wait=0)
    def f() -> Any:
        return current_lock()

    with override_settings(REDISLOCK={"ENABLED": False}):
        assert f() is None


def test_nested_calls_see_the_innermost_lock_and_reenter_their_own() -> None:
    seen: list[tuple[str, ...]] = []

    @redis_locked("inner:{n}", wait=0)
    def inner(n: int) -> None:
        lock = current_lock()
        assert lock is not None
        seen.append(("inner", lock.name))

    @redis_locked("outer:{n}", wait=0)
    def outer(n: int) -> None:
        lock = current_lock()
        assert lock is not None
        seen.append(("outer", lock.name))
        inner(n)
        again(n)  # same name as this call: re-entered, not deadlocked
        after = current_lock()
        assert after is lock

    @redis_locked("outer:{n}", wait=0)
    def again(n: int) -> None:
        lock = current_lock()
        assert lock is not None
        seen.append(("again", lock.name))

    outer(1)
    assert seen == [("outer", "outer:1"), ("inner", "inner:1"), ("again", "outer:1")]
    assert is_free("outer:1") and is_free("inner:1")
    assert current_lock() is None


def test_redis_lock_blocks_reenter_a_lock_their_thread_holds() -> None:
    @redis_locked("order:{oid}", wait=0)
    def decorated(oid: int) -> Any:
        outer = current_lock()
        # A block inside the decorated call: the same lock, not a self-deadlock.
        with redis_lock(f"order:{oid}", wait=0) as inner:
            assert inner is outer
        assert outer is not None and outer.held  # the block did not release it
        return outer.fence

    assert decorated(7) is not None
    assert is_free("order:7")

    # And the other way round: a decorated call inside a block.
    with redis_lock("order:8", wait=0) as block:
        assert decorated(8) == block.fence
        assert block.held
    assert is_free("order:8")


async def test_async_redis_lock_blocks_reenter_a_lock_their_task_holds() -> None:
    async with redis_lock("order:9", wait=0) as outer:
        async with redis_lock("order:9", wait=0) as inner:
            assert inner is outer
        assert outer.held
    assert is_free("order:9")


def test_current_lock_is_per_thread() -> None:
    barrier = threading.Barrier(3, timeout=10)
    seen: dict[str, str | None] = {}

    @redis_locked("t:{tag}", wait=0)
    def work(tag: str) -> None:
        barrier.wait()  # all three hold their locks at once
        lock = current_lock()
        seen[tag] = lock.name if lock else None
        barrier.wait()

    threads = [threading.Thread(target=work, args=(t,)) for t in "abc"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == {"a": "t:a", "b": "t:b", "c": "t:c"}


def test_signals_carry_name_and_times(held: Any) -> None:
    events: list[tuple[str, str, float]] = []

    def on(kind: str, field: str) -> Callable[..., None]:
        def receiver(sender: Any, **kwargs: Any) -> None:
            events.append((kind, kwargs["name"], kwargs[field]))

        return receiver

    receivers = [
        (lock_acquired, on("acquired", "waited")),
        (lock_released, on("released", "held")),
        (lock_busy, on("busy", "waited")),
    ]
    for signal, receiver in receivers:
        signal.connect(receiver)
    try:

        @redis_locked("sig", wait=0, on_busy="skip")
        def f() -> None:
            pass

        f()
        held("sig")
        f()
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver)
    kinds = [(k, n) for k, n, _ in events]
    assert kinds == [
        ("acquired", "sig"),
        ("released", "sig"),
        ("acquired", "sig"),  # the test's own hold
        ("busy", "sig"),
    ]
    assert all(t >= 0 for _, _, t in events)


# -- the context manager ---------------------------------------------------------------------
def test_redis_lock_context_manager(held: Any) -> None:
    with redis_lock("cm:1", wait=0) as lock:
        assert lock is not None
        assert lock.name == "cm:1"
        assert isinstance(lock.fence, int)
        assert current_lock() is lock
        assert not is_free("cm:1")
    assert is_free("cm:1")
    assert current_lock() is None
    held("cm:1", timeout=12)
    with pytest.raises(LockNotAcquired) as info, redis_lock("cm:1", wait=0):
        pass
    assert info.value.retry_after is not None


def test_redis_lock_shared_object_across_threads() -> None:
    guard = redis_lock("cm:shared", wait=10)
    active = []
    overlap = []
    mutex = threading.Lock()

    def work() -> None:
        for _ in range(5):
            with guard as lock:
                with mutex:
                    active.append(lock)
                    if len(active) > 1:
                        overlap.append(1)
                with mutex:
                    active.remove(lock)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert overlap == []
    assert is_free("cm:shared")


def test_redis_lock_disabled_gives_none() -> None:
    with override_settings(REDISLOCK={"ENABLED": False}), redis_lock("cm:off") as lock:
        assert lock is None
        assert current_lock() is None


# -- misuse is reported when decorating ------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"key": "x:{nope}"}, ValueError, r"\{nope\}, which is not a parameter of .*use one of a"),
        ({"key": "x:{}"}, ValueError, "positional placeholder.*name the parameter"),
        ({"key": "x:{0}"}, ValueError, "positional placeholder"),
        ({"key": "x:{a"}, ValueError, "not a valid str.format template"),
        ({"key": ""}, ValueError, "lock key is empty"),
        ({"key": 42}, TypeError, "str.format template .* or a callable"),
        ({"key": "x", "on_busy": "ignore"}, ValueError, "on_busy must be None, 'raise', 'skip'"),
        ({"key": "x", "wait": -1}, ValueError, "wait must be a finite number of seconds, 0 or"),
        ({"key": "x", "timeout": 0}, ValueError, "timeout must be .* more than 0"),
        ({"key": "x", "timeout": "5"}, TypeError, "timeout must be a number of seconds"),
        ({"key": "x", "renew": "yes"}, TypeError, "renew must be True, False or None"),
        ({"key": "x", "fail_open": 1}, TypeError, "fail_open must be True, False or None"),
        ({"key": "x", "alias": 3}, TypeError, "alias must name a CACHES entry"),
    ],
)
def test_bad_arguments_fail_at_decoration(kwargs: dict[str, Any], error: type, match: str) -> None:
    key = kwargs.pop("key")
    with pytest.raises(error, match=match):

        @redis_locked(key, **kwargs)
        def f(a: int) -> None:
            pass


def test_bad_targets_fail_at_decoration() -> None:
    with pytest.raises(TypeError, match="decorate its dispatch"):
        redis_locked("x")(views_locked.DispatchLocked)
    with pytest.raises(TypeError, match="generator"):

        @redis_locked("x")
        def gen() -> Iterator[int]:
            yield 1

    with pytest.raises(TypeError, match="below @classmethod"):
        redis_locked("x")(classmethod(lambda cls: None))
    with pytest.raises(TypeError, match="only decorate a callable"):
        redis_locked("x")(42)  # type: ignore[arg-type]


def test_json_fence_is_an_int(client: Any) -> None:
    body = json.loads(client.get("/item/fig/").content)
    first = body["fence"]
    assert client.get("/item/fig/").json()["fence"] > first


# -- Django REST framework ------------------------------------------------------------------
def _drf_views() -> dict[str, Any]:
    pytest.importorskip("rest_framework")
    from rest_framework.response import Response
    from rest_framework.views import APIView

    from django_redislock.contrib.drf import LockErrorsMixin

    class Mixed(LockErrorsMixin, APIView):
        @redis_locked("api:{pk}", wait=0, on_busy="raise")
        def get(self, request: Any, pk: int) -> Response:
            lock = current_lock()
            return Response({"name": lock.name if lock else None})

    class Plain(APIView):
        @redis_locked("api:{pk}", wait=0, on_busy="raise")
        def get(self, request: Any, pk: int) -> Response:
            return Response({"ok": True})

    class Default(APIView):
        @redis_locked("api:{pk}", wait=0)
        def get(self, request: Any, pk: int) -> Response:
            return Response({"ok": True})

    return {"mixin": Mixed.as_view(), "plain": Plain.as_view(), "default": Default.as_view()}


def _api_get(view: Any, pk: int = 1) -> Any:
    from rest_framework.test import APIRequestFactory

    response = view(APIRequestFactory().get("/", HTTP_ACCEPT="application/json"), pk=pk)
    if hasattr(response, "render"):
        response.render()
    return response


def test_drf_mixin_turns_busy_into_a_drf_response(held: Any) -> None:
    views = _drf_views()
    assert json.loads(_api_get(views["mixin"]).content) == {"name": "api:1"}
    held("api:1", timeout=15)
    response = _api_get(views["mixin"])
    assert response.status_code == 409
    assert 1 <= int(response["Retry-After"]) <= 15
    assert json.loads(response.content) == {"detail": "This resource is busy; try again shortly."}


def test_drf_exception_handler_setting(held: Any) -> None:
    views = _drf_views()
    held("api:1")
    handler = {"EXCEPTION_HANDLER": "django_redislock.contrib.drf.exception_handler"}
    with override_settings(REST_FRAMEWORK=handler, REDISLOCK={"BUSY_STATUS": 423}):
        response = _api_get(views["plain"])
    assert response.status_code == 423
    assert response.has_header("Retry-After")
    assert json.loads(response.content)["detail"].startswith("This resource is busy")


def test_drf_redis_down_is_503(dead_redis: None) -> None:
    views = _drf_views()
    response = _api_get(views["mixin"])
    assert response.status_code == 503
    assert int(response["Retry-After"]) >= 1


def test_drf_default_on_busy_still_answers_409(held: Any) -> None:
    views = _drf_views()
    held("api:1")
    response = _api_get(views["default"])
    assert response.status_code == 409
    assert response.has_header("Retry-After")
