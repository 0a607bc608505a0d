"""The lock keeps the database consistent: transactions, concurrent purchases, fencing.

Purchases run in real threads, each with its own database connection, against
SQLite (a file), PostgreSQL (the "postgres" alias, and "postgres_pool"
through Django's connection pool) and MariaDB or MySQL at READ COMMITTED and
REPEATABLE READ ("mysql", "mysql_repeatable_read"), the servers when they
answer (tests/settings.py). The unprotected and naively
protected variants must oversell, or the tests that pass for the decorator
would prove nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connections, transaction
from django.db.models import F, Q, Value
from django.db.transaction import TransactionManagementError
from django.test import Client, override_settings

from django_redislock import LockLost, current_lock, get_lock, redis_lock, redis_locked
from django_redislock.fencing import FencedQuerySet, StaleFence, fenced_get, fenced_update
from django_redislock.signals import lock_lost, lock_released
from tests.helpers import is_free
from tests.test_decorators import force_release, make_get
from tests.testapp import views_locked
from tests.testapp.models import GiftCard, Order, Product

pytestmark = pytest.mark.urls("tests.urls_locked")


def _alias(alias: str) -> Any:
    server = "PostgreSQL" if alias.startswith("postgres") else "MariaDB/MySQL"
    return pytest.param(
        alias,
        marks=pytest.mark.skipif(alias not in settings.DATABASES, reason=f"{server} not reachable"),
    )


# The databases every consistency test runs on: "postgres_pool" is PostgreSQL
# through Django's connection pool; a MySQL alias is one isolation level.
ALIASES = [
    "default",
    *map(_alias, ["postgres", "postgres_pool", "mysql", "mysql_repeatable_read"]),
]
# Those that let a second connection commit while a transaction is open (not SQLite's file).
SERVERS = ALIASES[1:]
# Every isolation level Django supports on MySQL (tests/settings.py).
MYSQL_LEVELS = [_alias(alias) for alias in settings.MYSQL_ISOLATION_LEVELS]
ALL_DBS = list(settings.DATABASES)
db_all = pytest.mark.django_db(transaction=True, databases=ALL_DBS)

STOCK = 5
BUYERS = 10


@pytest.fixture(params=["client", "async_client"])
def get(request: pytest.FixtureRequest) -> Any:
    """GET through the WSGI test client or the ASGI one."""
    return make_get(request)


@pytest.fixture
def atomic_requests(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, bool], None]:
    def set_for(alias: str, on: bool) -> None:
        monkeypatch.setitem(connections.settings[alias], "ATOMIC_REQUESTS", on)

    return set_for


@pytest.fixture
def unlocked_meeting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The unlocked control's buyers all read the stock before any of them writes."""
    monkeypatch.setattr(views_locked, "UNLOCKED_MEETING", threading.Barrier(BUYERS, timeout=30))


def buy_concurrently(path: str, alias: str) -> tuple[list[Any], int, int]:
    """BUYERS threads buy one unit each, released at one instant.

    Returns (statuses, orders, stock left).
    """
    product = Product.objects.using(alias).create(name="widget", stock=STOCK)
    url = f"/{path}/{alias}/{product.pk}/"
    start = threading.Barrier(BUYERS, timeout=30)
    statuses: list[Any] = []
    mutex = threading.Lock()

    def buyer() -> None:
        try:
            client = Client()
            start.wait()
            status: Any = client.get(url).status_code
        except Exception as exc:  # recorded, so a failure shows what happened
            status = repr(exc)
        finally:
            connections.close_all()
        with mutex:
            statuses.append(status)

    threads = [threading.Thread(target=buyer) for _ in range(BUYERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a buyer hung"
    orders = Order.objects.using(alias).filter(product_id=product.pk).count()
    stock = Product.objects.using(alias).get(pk=product.pk).stock
    return statuses, orders, stock


# -- concurrent purchases ------------------------------------------------------------------
@db_all
@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("atomic", [False, True], ids=["autocommit", "atomic_requests"])
@pytest.mark.parametrize("path", ["purchase", "purchase-own-atomic", "purchase-fenced"])
def test_locked_purchases_never_oversell(
    alias: str, atomic: bool, path: str, atomic_requests: Any
) -> None:
    atomic_requests(alias, atomic)
    statuses, orders, stock = buy_concurrently(path, alias)
    assert sorted(statuses) == [200] * STOCK + [410] * (BUYERS - STOCK)
    assert (orders, stock) == (STOCK, 0)


@db_all
@pytest.mark.parametrize("alias", ALIASES)
def test_locked_async_purchases_never_oversell(alias: str) -> None:
    # Async views: Django refuses ATOMIC_REQUESTS for them; the ORM work runs
    # (and commits) in sync_to_async before the lock is released.
    statuses, orders, stock = buy_concurrently("apurchase", alias)
    assert sorted(statuses) == [200] * STOCK + [410] * (BUYERS - STOCK)
    assert (orders, stock) == (STOCK, 0)


@db_all
@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.usefixtures("unlocked_meeting")
def test_unlocked_purchases_oversell(alias: str, atomic_requests: Any) -> None:
    # The control: same view, same load, no lock. Were this not to oversell,
    # the test above could not fail. The buyers meet between read and write.
    atomic_requests(alias, False)
    statuses, orders, stock = buy_concurrently("purchase-unlocked", alias)
    assert orders == BUYERS > STOCK, (statuses, orders, stock)


@db_all
@pytest.mark.parametrize("alias", SERVERS)
@pytest.mark.usefixtures("unlocked_meeting")
def test_unlocked_purchases_oversell_under_atomic_requests(
    alias: str, atomic_requests: Any
) -> None:
    atomic_requests(alias, True)
    statuses, orders, stock = buy_concurrently("purchase-unlocked", alias)
    assert orders == BUYERS > STOCK, (statuses, orders, stock)


@db_all
@pytest.mark.parametrize("alias", SERVERS)
def test_lock_released_before_commit_oversells(alias: str, atomic_requests: Any) -> None:
    # A lock taken inside the view and released before Django commits the
    # request's transaction: the next holder reads stock not yet committed.
    atomic_requests(alias, True)
    statuses, orders, stock = buy_concurrently("purchase-naive", alias)
    assert orders > STOCK, (statuses, orders, stock)


# -- commit before release ------------------------------------------------------------------
def _orders_seen_by_another_connection(alias: str) -> int:
    seen: list[int] = []

    def look() -> None:
        try:
            seen.append(Order.objects.using(alias).count())
        finally:
            connections.close_all()

    thread = threading.Thread(target=look)
    thread.start()
    thread.join(30)
    return seen[0]


@db_all
@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize(
    ("path", "visible"), [("purchase", 1), ("purchase-naive", 0)], ids=["decorator", "naive"]
)
def test_release_happens_after_commit(
    alias: str, path: str, visible: int, atomic_requests: Any, get: Any
) -> None:
    atomic_requests(alias, True)
    product = Product.objects.using(alias).create(name="widget", stock=1)
    at_release: list[int] = []

    def receiver(sender: Any, name: str, **kwargs: Any) -> None:
        if name.startswith("purchase:"):
            at_release.append(_orders_seen_by_another_connection(alias))

    lock_released.connect(receiver)
    try:
        response = get(f"/{path}/{alias}/{product.pk}/")
    finally:
        lock_released.disconnect(receiver)
    assert response.status_code == 200
    # What another connection (the next holder) sees when the lock goes back.
    assert at_release == [visible]


@db_all
@pytest.mark.parametrize("alias", ALIASES)
def test_atomic_requests_rolls_back_a_failed_view_and_releases(
    alias: str, atomic_requests: Any, client: Any
) -> None:
    atomic_requests("default", True)
    with pytest.raises(views_locked.Boom):
        client.post("/cbv/dispatch/4/")
    assert not Product.objects.filter(name="cbv-4").exists()
    assert is_free("cbv:4")


@db_all
def test_non_atomic_requests_view_is_respected(atomic_requests: Any, rf: Any) -> None:
    atomic_requests("default", True)
    seen = []

    @redis_locked("x", wait=0)
    @transaction.non_atomic_requests
    def view(request: Any) -> Any:
        seen.append(connections["default"].in_atomic_block)

    @redis_locked("x", wait=0)
    def atomic_view(request: Any) -> Any:
        seen.append(connections["default"].in_atomic_block)

    view(rf.get("/"))
    atomic_view(rf.get("/"))
    assert seen == [False, True]


@db_all
def test_handler_method_under_atomic_requests_releases_at_commit(
    atomic_requests: Any, get: Any
) -> None:
    # Django wraps the whole view in atomic (a handler method's marks are not
    # copied to the view): the decorator sees the outer transaction and
    # releases when it commits.
    atomic_requests("default", True)
    at_release: list[bool] = []

    def receiver(sender: Any, name: str, **kwargs: Any) -> None:
        at_release.append(connections["default"].in_atomic_block)

    lock_released.connect(receiver)
    try:
        assert get("/cbv/self/5/").status_code == 200
    finally:
        lock_released.disconnect(receiver)
    assert at_release == [False]
    assert is_free("cbv:5")


@db_all
def test_request_rolled_back_after_a_locked_handler_releases_at_once(
    atomic_requests: Any, get: Any
) -> None:
    # Django's ATOMIC_REQUESTS transaction wraps the handler and rolls back
    # when the view fails after it: the lock goes then, not after 30 s.
    atomic_requests("default", True)
    with pytest.raises(views_locked.Boom):
        get("/cbv/self-then-fails/6/")
    assert is_free("cbv:6")
    assert not Product.objects.filter(name="cbv-6").exists()


# -- functions inside someone else's transaction ------------------------------------------
@redis_locked("account:{n}", wait=0)
def credit(n: int, *, fail: bool = False) -> int:
    Product.objects.create(name=f"credit-{n}", stock=1)
    if fail:
        raise ValueError("declined")
    lock = current_lock()
    assert lock is not None and lock.fence is not None
    return lock.fence


@pytest.mark.django_db(transaction=True)
def test_release_waits_for_the_outer_commit() -> None:
    with transaction.atomic():
        credit(1)
        assert not is_free("account:1")
        credit(1)  # the same lock again in this transaction: re-entered
        assert not is_free("account:1")
    assert is_free("account:1")
    assert Product.objects.filter(name="credit-1").count() == 2


@pytest.mark.django_db(transaction=True)
def test_failed_second_call_keeps_the_first_calls_lock_until_commit() -> None:
    with transaction.atomic():
        credit(4)
        with pytest.raises(ValueError):
            credit(4, fail=True)
        # The first call's write still waits for the commit, and so does the lock.
        assert not is_free("account:4")
    assert is_free("account:4")
    assert Product.objects.filter(name="credit-4").count() == 1


@pytest.mark.django_db(transaction=True)
def test_failed_call_inside_outer_transaction_is_undone_and_released() -> None:
    with transaction.atomic():
        Product.objects.create(name="before", stock=1)
        with pytest.raises(ValueError):
            credit(2, fail=True)
        # Its savepoint rolled back: nothing of it can commit, so the lock is free.
        assert is_free("account:2")
    assert set(Product.objects.values_list("name", flat=True)) == {"before"}


# -- a lock waiting for someone else's transaction ----------------------------------------
# A lease short enough that a test outlives several, long enough that what a
# loaded CI host does (a pause of the renewing thread, a step of the wall clock
# by which Redis expires keys) does not end it between renewals, every third of
# it: at 0.6 s, a renewed lease had 0.4 s to spare, and one rehearsal lost it.
@redis_locked("ledger:{alias}:{n}", timeout=1.0, renew=True, wait=0)
def post_entry(alias: str, n: int) -> None:
    Product.objects.using(alias).create(name=f"entry-{n}", stock=1)


def entries(alias: str) -> int:
    return Product.objects.using(alias).filter(name__startswith="entry-").count()


def never_free_for(name: str, seconds: float) -> bool:
    """Whether another handle fails to take ``name`` throughout ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if is_free(name):
            return False
        time.sleep(0.05)
    return True


@db_all
@pytest.mark.parametrize("alias", ALIASES)
def test_deferred_lock_stays_held_past_its_lease_until_commit(alias: str) -> None:
    # The call returns long before the outer transaction commits: its lock
    # must keep renewing until then, or a second holder would read around
    # writes not committed yet.
    with transaction.atomic(using=alias):
        post_entry(alias, 1)
        assert never_free_for(f"ledger:{alias}:1", 3.5)  # more than three leases
        assert entries(alias) == 1
    assert is_free(f"ledger:{alias}:1")
    assert entries(alias) == 1


@db_all
@pytest.mark.parametrize("alias", ALIASES)
def test_outer_rollback_releases_at_once(alias: str) -> None:
    @redis_locked("long:{alias}", timeout=30, wait=0)
    def work(alias: str) -> None:
        Product.objects.using(alias).create(name="long", stock=1)

    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        work(alias)
        assert not is_free(f"long:{alias}")
        raise RuntimeError("outer rollback")
    # Not after the 30 s lease: at the rollback.
    assert is_free(f"long:{alias}")
    assert not Product.objects.using(alias).filter(name="long").exists()


@db_all
@pytest.mark.parametrize("alias", ALIASES)
def test_savepoint_rollback_around_the_call_releases_at_once(alias: str) -> None:
    with transaction.atomic(using=alias):
        Product.objects.using(alias).create(name="kept", stock=1)
        with pytest.raises(RuntimeError), transaction.atomic(using=alias):
            post_entry(alias, 2)
            raise RuntimeError("inner rollback")
        assert is_free(f"ledger:{alias}:2")
    assert entries(alias) == 0
    assert Product.objects.using(alias).filter(name="kept").exists()


@db_all
@pytest.mark.parametrize("alias", ALIASES)
def test_rolled_back_transactions_leave_nothing_behind(alias: str) -> None:
    from django_redislock.locking.deferred import _pending

    for n in range(20):
        with pytest.raises(RuntimeError), transaction.atomic(using=alias):
            post_entry(alias, n)
            raise RuntimeError("rollback")
    assert _pending() == {}
    assert all(is_free(f"ledger:{alias}:{n}") for n in range(20))


@db_all
@pytest.mark.parametrize("alias", ALIASES)
def test_closing_the_connection_mid_transaction_releases(alias: str) -> None:
    with transaction.atomic(using=alias):
        post_entry(alias, 3)
        connections[alias].close()  # the database rolls the transaction back
        assert is_free(f"ledger:{alias}:3")
    assert entries(alias) == 0


@db_all
@pytest.mark.parametrize("robust", [True, False])
def test_a_failing_on_commit_hook_does_not_strand_the_lock(robust: bool) -> None:
    def fail() -> None:
        raise ValueError("hook failed")

    def commit_with_failing_hook() -> None:
        with transaction.atomic():
            transaction.on_commit(fail, robust=robust)
            post_entry("default", 4)

    if robust:
        commit_with_failing_hook()
        assert is_free("ledger:default:4")
    else:
        # The commit happened; the hooks after the failing one did not run,
        # and the exception's frames still hold them. The lock's hook ran
        # first (tests/test_deferred_release.py).
        with pytest.raises(ValueError, match="hook failed") as info:
            commit_with_failing_hook()
        assert is_free("ledger:default:4")
        # A new transaction is not taken for the old one.
        with transaction.atomic():
            post_entry("default", 4)
        assert is_free("ledger:default:4")
        del info
    assert entries("default") == (1 if robust else 2)


@db_all
def test_a_call_inside_an_execute_wrapper_block_leaves_django_s_stack_intact() -> None:
    def spy(execute: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
        return execute(sql, params, many, context)

    conn = connections["default"]
    before = list(conn.execute_wrappers)
    with transaction.atomic():
        with conn.execute_wrapper(spy):
            post_entry("default", 8)
        # The block popped its own wrapper, not the library's.
        assert spy not in conn.execute_wrappers
    assert conn.execute_wrappers == before


@pytest.fixture
def heard_lost() -> Iterator[Callable[[str], bool]]:
    """``heard_lost(name)`` waits (bounded) for ``lock_lost`` about ``name``."""
    events: dict[str, threading.Event] = {}
    mutex = threading.Lock()

    def event(name: str) -> threading.Event:
        with mutex:
            return events.setdefault(name, threading.Event())

    def receiver(sender: Any, name: str, **kwargs: Any) -> None:
        event(name).set()

    lock_lost.connect(receiver)
    yield lambda name: event(name).wait(10)
    lock_lost.disconnect(receiver)


@db_all
@pytest.mark.parametrize("alias", ALIASES)
def test_loss_before_commit_raises_at_the_next_statement_and_rolls_back(
    alias: str, heard_lost: Callable[[str], bool]
) -> None:
    name = f"ledger:{alias}:5"
    with pytest.raises(LockLost, match="marked for rollback"), transaction.atomic(using=alias):
        post_entry(alias, 5)
        force_release(name)
        other = get_lock(name, wait=0)
        assert other.acquire()  # a second holder is in: our writes must not commit
        assert heard_lost(name)
        Product.objects.using(alias).create(name="after", stock=1)
    other.release()
    assert entries(alias) == 0
    assert not Product.objects.using(alias).filter(name="after").exists()


@db_all
@pytest.mark.parametrize("alias", ALIASES)
def test_loss_before_commit_rolls_back_without_another_statement(
    alias: str, heard_lost: Callable[[str], bool]
) -> None:
    name = f"ledger:{alias}:6"
    with transaction.atomic(using=alias):
        post_entry(alias, 6)
        force_release(name)
        assert heard_lost(name)
        deadline = time.monotonic() + 10
        while not connections[alias].needs_rollback and time.monotonic() < deadline:
            time.sleep(0.01)
    # No exception (Django has no hook before commit), but nothing committed,
    # and the connection is fit for the next transaction.
    assert entries(alias) == 0
    assert not connections[alias].needs_rollback
    assert Product.objects.using(alias).count() == 0


@db_all
@pytest.mark.parametrize("alias", ALIASES)
def test_loss_inside_a_nested_block_still_dooms_the_whole_transaction(
    alias: str, heard_lost: Callable[[str], bool]
) -> None:
    name = f"ledger:{alias}:7"
    with pytest.raises(LockLost), transaction.atomic(using=alias):
        post_entry(alias, 7)
        with transaction.atomic(using=alias):
            force_release(name)
            assert heard_lost(name)
            # Leaving this block would roll back only its savepoint; the
            # loss concerns the outer writes, so it does not stop here.
    assert entries(alias) == 0


@db_all
def test_a_later_call_in_a_doomed_transaction_does_not_run(
    heard_lost: Callable[[str], bool],
) -> None:
    ran: list[int] = []

    @redis_locked("ledger:doomed", timeout=0.6, renew=True, wait=0)
    def again() -> None:
        ran.append(1)

    with pytest.raises(LockLost), transaction.atomic():
        post_entry("default", 9)
        again()  # the same thread, another name: runs
        force_release("ledger:default:9")
        assert heard_lost("ledger:default:9")
        post_entry("default", 9)
    assert ran == [1]
    assert entries("default") == 0
    assert is_free("ledger:doomed")


@db_all
@pytest.mark.parametrize("alias", ALIASES)
def test_lease_run_out_without_renewal_dooms_the_transaction(alias: str) -> None:
    @redis_locked("brief:{alias}", timeout=0.3, wait=0)
    def work(alias: str) -> None:
        Product.objects.using(alias).create(name="brief", stock=1)

    with pytest.raises(LockLost), transaction.atomic(using=alias):
        work(alias)
        deadline = time.monotonic() + 10
        while not is_free(f"brief:{alias}") and time.monotonic() < deadline:
            time.sleep(0.05)
        Product.objects.using(alias).count()
    assert not Product.objects.using(alias).filter(name="brief").exists()


@pytest.mark.django_db
def test_a_testcase_transaction_does_not_delay_release() -> None:
    credit(3)
    assert is_free("account:3")


# -- fencing --------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True, databases=ALL_DBS)
@pytest.mark.parametrize("alias", ALIASES)
def test_stale_holder_write_is_refused(alias: str) -> None:
    product = Product.objects.using(alias).create(name="f", stock=10)
    qs = Product.objects.using(alias).filter(pk=product.pk)
    old = get_lock("fence:f", timeout=0.2, wait=0)
    assert old.acquire()
    assert fenced_update(qs, old.fence) == 1  # claim the row
    deadline = time.monotonic() + 10
    while old.held and time.monotonic() < deadline:  # the old holder stalls...
        time.sleep(0.01)
    new = get_lock("fence:f", timeout=10, wait=5)
    assert new.acquire()  # ...its lease runs out and a new holder takes over
    assert new.fence is not None and old.fence is not None and new.fence > old.fence
    assert fenced_update(qs, new.fence, stock=9) == 1
    assert fenced_update(qs, new.fence, stock=8) == 1  # the same holder may write again
    with pytest.raises(StaleFence) as info:
        fenced_update(qs, old.fence, stock=0)
    assert isinstance(info.value, LockLost)
    assert info.value.fence == old.fence
    assert qs.get().stock == 8
    new.release()
    with pytest.raises(LockLost):
        old.release()


@pytest.mark.django_db(transaction=True, databases=ALL_DBS)
@pytest.mark.parametrize("alias", ALIASES)
def test_fenced_update_is_all_or_nothing(alias: str) -> None:
    products = Product.objects.using(alias)
    a = products.create(name="a", stock=1, fence=5)
    b = products.create(name="b", stock=1, fence=9)
    both = products.filter(pk__in=[a.pk, b.pk])
    with pytest.raises(StaleFence):  # on its own: one transaction
        fenced_update(both, 7, stock=0)
    assert list(products.order_by("pk").values_list("stock", "fence")) == [(1, 5), (1, 9)]
    with pytest.raises(StaleFence), transaction.atomic(using=alias):  # inside the caller's
        products.filter(pk=a.pk).update(name="a2")
        fenced_update(both, 7, stock=0)
    assert list(products.order_by("pk").values_list("name", "stock")) == [("a", 1), ("b", 1)]
    assert fenced_update(products.filter(pk=-1), 7, stock=0) == 0


@pytest.mark.django_db(transaction=True, databases=ALL_DBS)
@pytest.mark.parametrize("alias", ALIASES)
def test_a_stale_fence_dooms_the_callers_transaction(alias: str) -> None:
    """Caught or not, StaleFence leaves nothing of the stale holder's to commit."""
    products = Product.objects.using(alias)
    a = products.create(name="a", stock=1, fence=9)
    with transaction.atomic(using=alias):
        products.filter(pk=a.pk).update(name="written by a stale holder")
        with pytest.raises(StaleFence):
            fenced_update(products.filter(pk=a.pk), 7, stock=0)
        with pytest.raises(TransactionManagementError):
            products.count()  # Django refuses: the transaction must roll back
    assert products.get(pk=a.pk).name == "a"


def newer_holder_commits(write: Callable[[], Any]) -> None:
    """A newer holder, on a connection of its own (another thread), runs ``write`` and commits."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            write()
        except BaseException as exc:  # recorded, so a failure shows what happened
            failed.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the newer holder hung"
    assert not failed, failed


# What a stale holder tries, with the fence 7, on rows a and b of which the
# newer holder (fence 9) wrote b: each must raise StaleFence.
STALE_WRITES: dict[str, Callable[[Any, Any, Any], Any]] = {
    "fenced_update_one_row": lambda products, a, b: fenced_update(
        products.filter(pk=b.pk), 7, stock=0
    ),
    "fenced_update_several_rows": lambda products, a, b: fenced_update(
        products.filter(pk__in=[a.pk, b.pk]), 7, stock=0
    ),
    "fenced_get": lambda products, a, b: fenced_get(products.filter(pk=b.pk), 7),
    "fenced_get_values": lambda products, a, b: fenced_get(
        products.filter(pk=b.pk).values("stock"), 7
    ),
}


@pytest.mark.django_db(transaction=True, databases=ALL_DBS)
@pytest.mark.parametrize("alias", [SERVERS[0], *MYSQL_LEVELS])
@pytest.mark.parametrize("read_first", [True, False], ids=["read_before", "no_read_before"])
@pytest.mark.parametrize("attempt", list(STALE_WRITES))
def test_a_stale_holder_inside_a_transaction_is_refused_at_every_isolation_level(
    alias: str, read_first: bool, attempt: str
) -> None:
    """The newer holder commits while the stale holder's transaction is open.

    With ``read_before`` that transaction read something first: under
    REPEATABLE READ its reads see a snapshot from before the newer holder's
    commit. The refusal must not depend on it, and nothing of the stale
    holder's (its own order, half of a several-row update) may commit.
    """
    products = Product.objects.using(alias)
    a = products.create(name="a", stock=5)
    b = products.create(name="b", stock=5)
    with pytest.raises(StaleFence), transaction.atomic(using=alias):
        if read_first:
            # Another table, so that SERIALIZABLE (reads lock) lets the newer holder in.
            assert not Order.objects.using(alias).exists()
        newer_holder_commits(lambda: fenced_update(products.filter(pk=b.pk), 9, stock=4))
        Order.objects.using(alias).create(product_id=a.pk)
        STALE_WRITES[attempt](products, a, b)
    assert not Order.objects.using(alias).exists()
    assert list(products.order_by("pk").values_list("stock", "fence")) == [(5, 0), (4, 9)]


@pytest.mark.django_db(transaction=True, databases=ALL_DBS)
@pytest.mark.parametrize("alias", [SERVERS[0], *MYSQL_LEVELS])
@pytest.mark.parametrize("shape", ["instance", "values"])
def test_fenced_get_of_a_row_a_newer_holder_deleted_raises_does_not_exist(
    alias: str, shape: str
) -> None:
    products = Product.objects.using(alias)
    a = products.create(name="a", stock=5)
    queryset = products.filter(pk=a.pk)
    with pytest.raises(Product.DoesNotExist), transaction.atomic(using=alias):
        assert not Order.objects.using(alias).exists()  # the snapshot, under REPEATABLE READ
        newer_holder_commits(lambda: products.filter(pk=a.pk).delete())
        fenced_get(queryset if shape == "instance" else queryset.values("stock"), 7)
    assert not products.exists()


def _statements(alias: str, call: Callable[[], Any]) -> list[str]:
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connections[alias]) as seen:
        call()
    return [q["sql"].split()[0].upper() for q in seen.captured_queries]


@pytest.mark.django_db(transaction=True, databases=ALL_DBS)
@pytest.mark.parametrize("alias", ALIASES)
def test_a_fenced_update_that_succeeds_is_one_statement(alias: str) -> None:
    """One UPDATE, in the caller's transaction or on its own: no check, no BEGIN."""
    products = Product.objects.using(alias)
    a = products.create(name="a", stock=2)

    def claim_then_write() -> None:
        assert fenced_update(products.filter(pk=a.pk), 7) == 1  # the claim
        assert fenced_update(products.filter(pk=a.pk), 7, stock=1) == 1

    with transaction.atomic(using=alias):
        assert _statements(alias, claim_then_write) == ["UPDATE", "UPDATE"]
    assert _statements(alias, claim_then_write) == ["UPDATE", "UPDATE"]
    assert products.get(pk=a.pk).fence == 7
    # Updating nothing takes the check that tells a missing row from a newer holder.
    assert _statements(alias, lambda: fenced_update(products.filter(pk=-1), 7)) == [
        "UPDATE",
        "SELECT",
    ]


@pytest.mark.django_db(transaction=True, databases=ALL_DBS)
@pytest.mark.parametrize("alias", ALIASES)
def test_a_fenced_update_of_several_rows_checks_after_the_update(alias: str) -> None:
    """Several rows: the UPDATE, then the check for newer tokens, in one transaction."""
    products = Product.objects.using(alias)
    a = products.create(name="a", stock=1)
    b = products.create(name="b", stock=1)
    both = products.filter(pk__in=[a.pk, b.pk])
    with transaction.atomic(using=alias):
        assert _statements(alias, lambda: fenced_update(both, 7, stock=0)) == [
            "UPDATE",
            "SELECT",
        ]
    assert list(products.order_by("pk").values_list("stock", "fence")) == [(0, 7), (0, 7)]


@pytest.mark.django_db(transaction=True, databases=ALL_DBS)
@pytest.mark.parametrize("alias", ALIASES)
def test_a_unique_field_compared_with_a_column_is_not_one_row(alias: str) -> None:
    """``pk=F("stock")`` can match every row: all or nothing still holds."""
    products = Product.objects.using(alias)
    a = products.create(name="a", fence=5)
    b = products.create(name="b", fence=9)
    products.filter(pk__in=[a.pk, b.pk]).update(stock=F("pk"))
    with pytest.raises(StaleFence):
        fenced_update(products.filter(pk=F("stock")), 7, name="x")
    assert list(products.order_by("pk").values_list("name", "fence")) == [("a", 5), ("b", 9)]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("make", "one"),
    [
        (lambda qs: qs.filter(pk=1), True),
        (lambda qs: qs.filter(id=1, stock__gt=0), True),
        (lambda qs: qs.filter(stock__gt=0).filter(pk=1), True),
        (lambda qs: qs.filter(pk__in=[1]), False),
        (lambda qs: qs.filter(name="a"), False),
        (lambda qs: qs.filter(Q(pk=1) | Q(pk=2)), False),
        (lambda qs: qs.exclude(pk=1), False),
        (lambda qs: qs.filter(order__pk=1), False),  # a unique field, through a join
        (lambda qs: qs.filter(pk=F("stock")), False),  # each row against itself
        (lambda qs: qs.filter(pk=Value(1)), False),  # expressions are not read
        (lambda qs: qs.all(), False),
    ],
)
def test_which_querysets_name_one_row(make: Callable[[Any], Any], one: bool) -> None:
    from django_redislock.locking.fence_shapes import names_one_row

    assert names_one_row(make(Product.objects.all())) is one


@pytest.mark.django_db(transaction=True)
def test_a_fenced_update_through_multi_table_inheritance_stays_one_transaction() -> None:
    """A parent's field and a child's in one call: the fences locked first, all or nothing."""
    from django.test.utils import CaptureQueriesContext

    from django_redislock.locking.fence_shapes import Route, route

    card = GiftCard.objects.create(name="card", stock=1, fence=5)
    cards = GiftCard.objects.filter(pk=card.pk)
    assert route(cards, "fence", {"stock": 0, "code": "used"}, "fenced_update") is Route.LOCKED
    with CaptureQueriesContext(connections["default"]) as seen:
        assert fenced_update(cards, 7, stock=0, code="used") == 1
    assert [q["sql"].split()[0].upper() for q in seen.captured_queries][0] == "BEGIN"
    card.refresh_from_db()
    assert (card.stock, card.fence, card.code) == (0, 7, "used")
    with pytest.raises(StaleFence):
        fenced_update(cards, 6, stock=5, code="again")
    card.refresh_from_db()
    assert (card.stock, card.fence, card.code) == (0, 7, "used")


@pytest.mark.django_db
def test_fenced_queryset_and_argument_errors() -> None:
    p = Product.objects.create(name="q", stock=3)
    qs = FencedQuerySet(model=Product).filter(pk=p.pk)
    assert qs.fenced_update(4, stock=2) == 1
    assert Product.objects.get(pk=p.pk).fence == 4
    with pytest.raises(TypeError, match="current_fence"):
        fenced_update(qs, None, stock=1)
    with pytest.raises(TypeError, match="set from fence="):
        fenced_update(qs, 5, field="stock", stock=6)
    with pytest.raises(TypeError, match="must be an int"):
        fenced_update(qs, "5")  # type: ignore[arg-type]
    with override_settings(REDISLOCK={"ENABLED": False}):
        assert fenced_update(qs, None, stock=1) == 1
    assert Product.objects.get(pk=p.pk).stock == 1


@pytest.mark.django_db(transaction=True)
def test_fence_from_the_context_manager() -> None:
    p = Product.objects.create(name="cm", stock=3)
    with redis_lock("cm:fence") as lock:
        assert lock is not None and lock.fence is not None
        assert fenced_update(Product.objects.filter(pk=p.pk), lock.fence, stock=2) == 1
    assert Product.objects.get(pk=p.pk).fence == lock.fence


@pytest.fixture(autouse=True)
def _no_leftover_pending() -> Iterator[None]:
    yield
    from django_redislock.locking import deferred

    deferred._pending().clear()


@db_all
def test_django_leaves_the_transaction_to_the_decorator(atomic_requests: Any) -> None:
    from django.core.handlers.base import BaseHandler

    atomic_requests("default", True)
    handler = BaseHandler()
    # Sync view: not wrapped by Django; the decorator opens atomic inside the lock.
    assert handler.make_view_atomic(views_locked.purchase) is views_locked.purchase
    # Async view: Django's own refusal of ATOMIC_REQUESTS is kept.
    with pytest.raises(RuntimeError, match="ATOMIC_REQUESTS with async views"):
        handler.make_view_atomic(views_locked.aitem)
