"""``REDISLOCK['CONNECT_EARLY']``: a locked call's database connections, opened before the wait.

With Django's default ``CONN_MAX_AGE = 0`` a request connects at its first
query; for a locked view that is inside the lock, and every holder of a hot
lock pays for a connect while the others wait. With the setting on, the
connection is opened before the wait instead (``transactions.connect_early``).

Each test closes the connection first, as the end of the previous request
does with ``CONN_MAX_AGE = 0``, then records the order of two events: the
``connection_created`` signal of the alias and the ``lock_acquired`` signal.
Real SQLite and PostgreSQL (also through Django's connection pool), real Redis.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connections
from django.db.backends.signals import connection_created
from django.test import Client, override_settings

from django_redislock import redis_lock, redis_locked
from django_redislock.checks import check_settings
from django_redislock.signals import lock_acquired
from tests.testapp import views_locked
from tests.testapp.models import Product

pytestmark = pytest.mark.urls("tests.urls_locked")

ALL_DBS = [
    alias for alias in ["default", "postgres", "postgres_pool"] if alias in settings.DATABASES
]
db_all = pytest.mark.django_db(transaction=True, databases=ALL_DBS)
needs_postgres = pytest.mark.skipif(
    "postgres" not in settings.DATABASES, reason="PostgreSQL not reachable"
)
needs_pool = pytest.mark.skipif(
    "postgres_pool" not in settings.DATABASES, reason="PostgreSQL or psycopg_pool missing"
)
# "postgres_pool": PostgreSQL through Django's connection pool (tests/settings.py).
ALIASES = [
    "default",
    pytest.param("postgres", marks=needs_postgres),
    pytest.param("postgres_pool", marks=needs_pool),
]
CONNECTED_FIRST = ["connect", "acquired"]
LOCKED_FIRST = ["acquired", "connect"]


@pytest.fixture
def early_on() -> Iterator[None]:
    with override_settings(REDISLOCK={"CONNECT_EARLY": True}):
        yield


class Events:
    """``connection_created`` and ``lock_acquired``, in the order they happened."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def on_connect(self, sender: Any, connection: Any, **kwargs: Any) -> None:
        self.seen.append(("connect", connection.alias))

    def on_acquired(self, sender: Any, name: str, **kwargs: Any) -> None:
        self.seen.append(("acquired", ""))

    def __getitem__(self, alias: str) -> list[str]:
        """The events of one database and the lock."""
        return [event for event, a in self.seen if event == "acquired" or a == alias]


EVENTS = Events()


@pytest.fixture
def events() -> Iterator[Events]:
    connection_created.connect(EVENTS.on_connect)
    lock_acquired.connect(EVENTS.on_acquired)
    yield EVENTS
    connection_created.disconnect(EVENTS.on_connect)
    lock_acquired.disconnect(EVENTS.on_acquired)


def closed(*aliases: str) -> None:
    """As at the start of a request after one with CONN_MAX_AGE = 0; events from here on."""
    for alias in aliases:
        connections[alias].close()
        assert connections[alias].connection is None
    EVENTS.seen.clear()


def forget(view: Any) -> None:
    """What the decorated callable learned in earlier tests about its databases."""
    view.__dict__.pop("_redislock_databases", None)


def buy(alias: str) -> int:
    product = Product.objects.using(alias).create(name="widget", stock=1)
    closed(*ALL_DBS)
    return Client().get(f"/purchase/{alias}/{product.pk}/").status_code


@pytest.fixture(autouse=True)
def _fresh() -> None:
    forget(views_locked.purchase)
    forget(count_products)
    forget(views_locked.item)


# -- views ----------------------------------------------------------------------------------
@db_all
@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.usefixtures("early_on")
def test_a_view_connects_first_to_the_database_it_used_before(events: Events, alias: str) -> None:
    # The first call shows which database the view works in (inside the
    # lock); from the second on, that connection is opened before the lock.
    assert buy(alias) == 200
    assert events[alias] == LOCKED_FIRST
    assert buy(alias) == 200
    assert events[alias] == CONNECTED_FIRST


@db_all
@pytest.mark.parametrize("alias", ALIASES[1:])
@pytest.mark.usefixtures("early_on")
def test_a_view_connects_first_to_its_atomic_requests_database(
    events: Events, monkeypatch: pytest.MonkeyPatch, alias: str
) -> None:
    # The decorator opens the request's transaction on the database inside the
    # lock; its connection is opened before, from the first call.
    monkeypatch.setitem(connections.settings[alias], "ATOMIC_REQUESTS", True)
    assert buy(alias) == 200
    assert events[alias] == CONNECTED_FIRST


@db_all
@pytest.mark.parametrize("alias", ALIASES[1:])
def test_a_list_names_the_databases_to_connect_first(events: Events, alias: str) -> None:
    with override_settings(REDISLOCK={"CONNECT_EARLY": [alias]}):
        assert buy(alias) == 200
    assert events[alias] == CONNECTED_FIRST


@db_all
@needs_pool
@pytest.mark.usefixtures("early_on")
def test_with_django_s_pool_the_early_connection_goes_back_to_the_pool(
    events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taken from the pool before the lock: the one the view then uses, and
    the only one, given back when the request's connection is closed."""
    monkeypatch.setitem(connections.settings["postgres_pool"], "ATOMIC_REQUESTS", True)
    for _ in range(3):
        assert buy("postgres_pool") == 200  # closes this thread's connection first
        assert events["postgres_pool"] == CONNECTED_FIRST
    assert Product.objects.using("postgres_pool").filter(stock=0).count() == 3
    # As at the end of a request (the test client keeps the connection open).
    connections["postgres_pool"].close()
    stats = connections["postgres_pool"].pool.get_stats()
    assert (stats["pool_size"], stats["pool_available"]) == (1, 1), stats


@db_all
@pytest.mark.parametrize("redislock", [{}, {"CONNECT_EARLY": False}], ids=["default", "False"])
def test_off_by_default_and_with_false_the_view_connects_inside_the_lock(
    events: Events, redislock: dict[str, Any]
) -> None:
    with override_settings(REDISLOCK=redislock):
        for _ in range(2):
            assert buy("default") == 200
            assert events["default"] == LOCKED_FIRST


@db_all
@pytest.mark.usefixtures("early_on")
def test_a_view_that_uses_no_database_never_connects(events: Events) -> None:
    for _ in range(2):
        closed(*ALL_DBS)
        assert Client().get("/item/apple/").status_code == 200
        assert events.seen == [("acquired", "")]


# -- other calls --------------------------------------------------------------------------------
@redis_locked("connect-early:task")
def count_products() -> int:
    return Product.objects.count()


@db_all
@pytest.mark.usefixtures("early_on")
def test_a_plain_function_connects_first_once_it_has_used_the_database(
    events: Events,
) -> None:
    closed("default")
    assert count_products() == 0
    assert events["default"] == LOCKED_FIRST
    closed("default")
    assert count_products() == 0
    assert events["default"] == CONNECTED_FIRST


@db_all
def test_a_plain_function_connects_first_to_named_databases(events: Events) -> None:
    closed("default")
    with override_settings(REDISLOCK={"CONNECT_EARLY": ["default"]}):
        assert count_products() == 0
    assert events["default"] == CONNECTED_FIRST


@db_all
@pytest.mark.parametrize(
    ("early", "order"),
    [(False, LOCKED_FIRST), (True, LOCKED_FIRST), (["default"], CONNECTED_FIRST)],
)
def test_a_redis_lock_block_connects_first_only_to_named_databases(
    events: Events, early: Any, order: list[str]
) -> None:
    closed("default")
    with override_settings(REDISLOCK={"CONNECT_EARLY": early}), redis_lock("connect-early:block"):
        assert Product.objects.count() == 0
    assert events["default"] == order


@pytest.fixture
def unreachable(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[str]:
    """A database alias whose server cannot be reached (SQLite in a missing directory)."""
    alias = "unreachable"
    configured = connections.configure_settings(
        {
            "default": {"ENGINE": "django.db.backends.sqlite3"},  # required by Django
            alias: {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "no" / "db")},
        }
    )
    monkeypatch.setitem(connections.settings, alias, configured[alias])
    yield alias
    connections[alias].close()
    del connections[alias]


@redis_locked("connect-early:no-database")
def no_database_work() -> str:
    return "done"


def test_a_database_that_cannot_be_reached_is_left_to_the_call(
    unreachable: str, django_db_blocker: Any
) -> None:
    # The call does not use that database: it runs, as it would have without
    # connecting first (a call that does use it fails at its own query).
    with django_db_blocker.unblock(), override_settings(REDISLOCK={"CONNECT_EARLY": [unreachable]}):
        assert no_database_work() == "done"
    assert connections[unreachable].connection is None


@pytest.mark.usefixtures("early_on")
def test_database_access_refused_is_left_to_the_call() -> None:
    # No django_db mark: pytest-django refuses database access. A callable
    # that connected before (say, in another test), on a call whose work does
    # not reach the database, runs as it would have without connecting first.
    no_database_work.__dict__["_redislock_databases"] = {"default"}
    try:
        assert no_database_work() == "done"
    finally:
        forget(no_database_work)


# -- the setting ---------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [True, False, [], ["default"], ("default",)])
def test_valid_settings_pass_the_checks(value: Any) -> None:
    with override_settings(REDISLOCK={"CONNECT_EARLY": value}):
        assert check_settings() == []


@pytest.mark.parametrize("value", ["default", None, 1, ["nowhere"], [None]])
def test_invalid_settings_fail_with_e012(value: Any) -> None:
    with override_settings(REDISLOCK={"CONNECT_EARLY": value}):
        messages = check_settings()
    assert [m.id for m in messages] == ["django_redislock.E012"]
    assert "CONNECT_EARLY" in messages[0].msg
    assert "DATABASES" in messages[0].hint
