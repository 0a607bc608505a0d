"""System checks for ``REDISLOCK``: one test per documented ID, no network."""

from __future__ import annotations

import io
import math
import re
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.core.checks import CheckMessage, Error, Warning
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import RequestFactory, override_settings

from django_redislock.checks import check_settings
from django_redislock.conf import DEFAULTS, DJANGO_REDIS_CACHE, conf
from django_redislock.middleware import ConcurrencyLimitMiddleware
from django_redislock.throttling.checks import check_throttle_setup, check_url_names

REDIS_CACHE = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": "redis://127.0.0.1:1/0",
    }
}


def _ids(messages: list[Any]) -> list[str]:
    return [m.id for m in messages]


def test_clean_settings_have_no_messages() -> None:
    assert check_settings() == []
    with override_settings(REDISLOCK={}):
        assert check_settings() == []
    with override_settings(REDISLOCK=dict(DEFAULTS)):
        assert check_settings() == []
    explicit = {
        "TIMEOUT": 5,
        "WAIT": 0,
        "SOCKET_TIMEOUT": 1,
        "PREFIX": "my.app:locks",
        "BUSY_STATUS": 423,
        "REPLICAS": 1,
        "RENEW": True,
        "RENEW_MAX": 60,
        "CLIENT": "tests.settings.make_client",
    }
    with override_settings(REDISLOCK=explicit):
        assert check_settings() == []


@pytest.mark.parametrize(
    ("redislock", "check_id", "needle"),
    [
        ("not a dict", "E001", "must be a dict"),
        (["TIMEOUT", 5], "E001", "must be a dict"),
        ({"TIMEOUT": 30, "TIMEOUTT": 5}, "E002", "'TIMEOUTT'"),
        ({"TIMEOUT": 0}, "E003", "'TIMEOUT'"),
        ({"TIMEOUT": -1}, "E003", "'TIMEOUT'"),
        ({"TIMEOUT": math.inf}, "E003", "'TIMEOUT'"),
        ({"TIMEOUT": math.nan}, "E003", "'TIMEOUT'"),
        ({"TIMEOUT": "30"}, "E003", "'TIMEOUT'"),
        ({"TIMEOUT": True}, "E003", "'TIMEOUT'"),
        ({"WAIT": -0.5}, "E003", "'WAIT'"),
        ({"SOCKET_TIMEOUT": 0}, "E003", "'SOCKET_TIMEOUT'"),
        ({"CONNECT_TIMEOUT": None}, "E003", "'CONNECT_TIMEOUT'"),
        ({"PERMIT_TIMEOUT": -3}, "E003", "'PERMIT_TIMEOUT'"),
        ({"REPLICAS_TIMEOUT": 0}, "E003", "'REPLICAS_TIMEOUT'"),
        ({"RENEW_MAX": 0}, "E003", "'RENEW_MAX'"),
        ({"RENEW_MAX": "1h"}, "E003", "'RENEW_MAX'"),
        # Above the maxima (a year; a million): docs/settings.rst, Maxima.
        ({"TIMEOUT": 1e16}, "E003", "at most 31536000 (a year)"),
        ({"UNIQUE_TTL": 31_536_001}, "E003", "'UNIQUE_TTL'"),
        ({"RENEW_MAX": 3e10}, "E003", "'RENEW_MAX'"),
        ({"PREFIX": "a{b}"}, "E004", "PREFIX"),
        ({"PREFIX": ""}, "E004", "PREFIX"),
        ({"PREFIX": "locks\n"}, "E004", "PREFIX"),
        ({"PREFIX": 7}, "E004", "PREFIX"),
        ({"CACHE": "missing"}, "E005", "'missing'"),
        ({"CACHE": 3}, "E005", "3"),
        ({"CLIENT": 5}, "E007", "'CLIENT'"),
        ({"CLIENT": "nodots"}, "E007", "'CLIENT'"),
        ({"BUSY_RESPONSE": 1}, "E007", "'BUSY_RESPONSE'"),
        ({"UNAVAILABLE_RESPONSE": ["x"]}, "E007", "'UNAVAILABLE_RESPONSE'"),
        ({"THROTTLE_RESPONSE": 2.0}, "E007", "'THROTTLE_RESPONSE'"),
        ({"ADMIN_PERMISSION": True}, "E007", "'ADMIN_PERMISSION'"),
        ({"CALLER": "nodots"}, "E007", "'CALLER'"),
        ({"CREDENTIAL_HEADERS": "Authorization"}, "E080", "CREDENTIAL_HEADERS"),
        ({"CREDENTIAL_HEADERS": ["Bad Header"]}, "E080", "CREDENTIAL_HEADERS"),
        ({"BUSY_STATUS": 200}, "E008", "BUSY_STATUS"),
        ({"BUSY_STATUS": "409"}, "E008", "BUSY_STATUS"),
        ({"BUSY_STATUS": True}, "E008", "BUSY_STATUS"),
        ({"REPLICAS": -1}, "E009", "REPLICAS"),
        ({"REPLICAS": 1.5}, "E009", "REPLICAS"),
        ({"REPLICAS": True}, "E009", "REPLICAS"),
        ({"REPLICAS": 1_000_001}, "E009", "at most 1000000"),
        ({"ENABLED": "yes"}, "E010", "'ENABLED'"),
        ({"RENEW": 1}, "E010", "'RENEW'"),
        ({"FAIL_OPEN": None}, "E010", "'FAIL_OPEN'"),
        ({"OTEL_LOCK_NAMES": "on"}, "E010", "'OTEL_LOCK_NAMES'"),
        ({"THROTTLE_FAIL_OPEN": "false"}, "E010", "'THROTTLE_FAIL_OPEN'"),
        ({"SOCKET_TIMEOUT": 20, "TIMEOUT": 30}, "W001", "SOCKET_TIMEOUT"),
        ({"BREAKER_WINDOW": -1}, "E013", "'BREAKER_WINDOW'"),
        ({"BREAKER_WINDOW": 61}, "E013", "up to 60"),
        ({"BREAKER_WINDOW": "1"}, "E013", "got '1'"),
        ({"BREAKER_WINDOW": True}, "E013", "'BREAKER_WINDOW'"),
        ({"BREAKER_WINDOW": math.nan}, "E013", "'BREAKER_WINDOW'"),
        ({"BREAKER_WINDOW": None}, "E013", "'BREAKER_WINDOW'"),
    ],
)
def test_each_problem_has_its_id_and_a_hint(redislock: Any, check_id: str, needle: str) -> None:
    with override_settings(REDISLOCK=redislock):
        messages = check_settings()
    full_id = f"django_redislock.{check_id}"
    assert _ids(messages) == [full_id], messages
    message = messages[0]
    assert needle in message.msg
    assert message.hint
    assert isinstance(message, Warning if check_id.startswith("W") else Error)
    if check_id.startswith("E"):
        assert not isinstance(message, Warning)


def test_non_django_redis_cache_is_e006() -> None:
    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    }
    with override_settings(CACHES=caches, REDISLOCK={}):
        messages = check_settings()
        assert _ids(messages) == ["django_redislock.E006"]
        assert "django_redis.cache.RedisCache" in messages[0].hint
        # A CLIENT factory replaces the cache: then any backend is fine.
        with override_settings(REDISLOCK={"CLIENT": "tests.settings.make_client"}):
            assert check_settings() == []


def test_djangos_own_redis_cache_is_not_e006() -> None:
    # Django 4.0+'s backend: the library reads its connection as it reads django-redis's.
    caches = {"default": {"BACKEND": DJANGO_REDIS_CACHE, "LOCATION": "redis://127.0.0.1:1/0"}}
    with override_settings(CACHES=caches, REDISLOCK={}):
        assert check_settings() == []
    caches = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCacheX"}}
    with override_settings(CACHES=caches, REDISLOCK={}):
        messages = check_settings()
    assert _ids(messages) == ["django_redislock.E006"]
    assert "'django.core.cache.backends.redis.RedisCacheX'" in messages[0].msg
    assert repr(DJANGO_REDIS_CACHE) in messages[0].hint


def test_e005_names_the_alias_and_passes_with_another_alias() -> None:
    with override_settings(CACHES=REDIS_CACHE, REDISLOCK={"CACHE": "locks"}):
        assert _ids(check_settings()) == ["django_redislock.E005"]
    caches = dict(REDIS_CACHE, locks=REDIS_CACHE["default"])
    with override_settings(CACHES=caches, REDISLOCK={"CACHE": "locks"}):
        assert check_settings() == []


def test_several_problems_at_once() -> None:
    bad = {"TIMEOUT": 0, "PREFIX": "{x}", "BUSY_STATUS": 1, "ENABLED": "no", "NOPE": 1}
    with override_settings(REDISLOCK=bad):
        ids = set(_ids(check_settings()))
    assert ids == {
        "django_redislock.E002",
        "django_redislock.E003",
        "django_redislock.E004",
        "django_redislock.E008",
        "django_redislock.E010",
    }


# The check command runs here for this app's label. Django 6.1 runs every
# model's database-specific field checks against every alias by default, and
# MySQL's need a server connection (its version), which these tests, with no
# database access, must not open; the library's checks run whatever the label.


def test_check_command_fails_on_a_bad_setting() -> None:
    with override_settings(REDISLOCK={"TIMEOUT": -1}), pytest.raises(SystemCheckError) as info:
        call_command("check", "django_redislock", stdout=io.StringIO(), stderr=io.StringIO())
    assert "django_redislock.E003" in str(info.value)


def test_check_command_passes_on_clean_settings() -> None:
    out = io.StringIO()
    call_command("check", "django_redislock", stdout=out, stderr=io.StringIO())
    assert "no issues" in out.getvalue()


def test_checks_do_not_touch_the_network() -> None:
    # The cache points at a port nobody listens on; the checks must not notice.
    with override_settings(CACHES=REDIS_CACHE, REDISLOCK={"SOCKET_TIMEOUT": 0.5}):
        assert check_settings() == []


def test_settings_are_read_lazily() -> None:
    assert DEFAULTS["TIMEOUT"] == conf.TIMEOUT
    with override_settings(REDISLOCK={"TIMEOUT": 7, "WAIT": 0, "RENEW_MAX": 3}):
        assert conf.TIMEOUT == 7.0 and conf.WAIT == 0.0 and conf.RENEW_MAX == 3.0
    assert DEFAULTS["TIMEOUT"] == conf.TIMEOUT and conf.RENEW_MAX is None


# -- throttling rules: every problem of every rule ----------------------------------------
@pytest.mark.parametrize(
    ("throttle", "check_id"),
    [
        ("reports", "E020"),
        ([{"name": "a", "limit": 1}, "b"], "E020"),
        ([{"limit": 1}], "E021"),
        ([{"name": "a", "limit": 1}, {"name": "a", "limit": 2}], "E021"),
        ([{"name": "a", "limit": 1, "paht": "^/x"}], "E022"),
        ([{"name": "a", "limit": 1, "path": "(["}], "E023"),
        ([{"name": "a", "limit": 1, "per": "planet"}], "E024"),
        ([{"name": "a", "limit": 0}], "E025"),
        ([{"name": "a", "limit": 1, "wait": -1}], "E026"),
        ([{"name": "a", "limit": 1, "timeout": 0}], "E027"),
        ([{"name": "a", "limit": 1, "methods": "G E T"}], "E028"),
        ([{"name": "a", "limit": 1, "url_name": ""}], "E029"),
        ([{"name": "a", "limit": 1, "retry_after": -2}], "E030"),
        # Above the maxima.
        ([{"name": "a", "limit": 1_000_001}], "E025"),
        ([{"name": "a", "limit": 1, "wait": 1e16}], "E026"),
        ([{"name": "a", "limit": 1, "timeout": 1e16}], "E027"),
        ([{"name": "a", "limit": 1, "retry_after": 1e16}], "E030"),
    ],
)
def test_each_rule_problem_has_its_id(throttle: Any, check_id: str) -> None:
    with override_settings(REDISLOCK={"THROTTLE": throttle}):
        messages = check_settings()
    assert _ids(messages) == [f"django_redislock.{check_id}"]
    assert isinstance(messages[0], Error) and messages[0].hint


def test_a_rule_problem_does_not_hide_its_duplicate_name() -> None:
    rules = [{"name": "a", "limit": 1}, {"name": "a", "limit": 0}]
    with override_settings(REDISLOCK={"THROTTLE": rules}):
        messages = check_settings()
    assert _ids(messages) == ["django_redislock.E025", "django_redislock.E021"]
    assert all("REDISLOCK['THROTTLE'][1]" in m.msg for m in messages)


def test_every_problem_of_every_rule_is_reported() -> None:
    rules = [
        {"name": "a", "limit": 0, "wait": -1, "paht": "x", "retry_after": 0},
        {"name": "a", "limit": 1, "per": "planet", "methods": 5},
        {"limit": "2"},
    ]
    with override_settings(REDISLOCK={"THROTTLE": rules}):
        found = [(m.id[-4:], m.msg.split(":")[0]) for m in check_settings()]
    first, second, third = (f"REDISLOCK['THROTTLE'][{i}]" for i in range(3))
    assert sorted(found) == sorted(
        [
            ("E022", first),
            ("E025", first),
            ("E026", first),
            ("E030", first),
            ("E024", second),
            ("E028", second),
            ("E021", second),
            ("E021", third),
            ("E025", third),
        ]
    )


# -- E011: the cache's LOCATION must be a Redis URL ---------------------------------------
def _redis_cache(location: Any) -> dict[str, Any]:
    return {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": location}}


@pytest.mark.parametrize(
    ("location", "bad", "example"),
    [
        ("127.0.0.1:6391", ["127.0.0.1:6391"], "redis://127.0.0.1:6391/0"),
        ("localhost", ["localhost"], "redis://localhost/0"),
        ("/run/redis.sock", ["/run/redis.sock"], "redis://127.0.0.1:6379/0"),
        (["redis://a:1/0", "b:2"], ["b:2"], "redis://b:2/0"),
        ("redis://a:1/0,b:2,c:3", ["b:2", "c:3"], "redis://b:2/0"),
        (None, [None], "redis://127.0.0.1:6379/0"),
        # redis-py reads the scheme case-sensitively.
        ("REDIS://127.0.0.1/0", ["REDIS://127.0.0.1/0"], "redis://127.0.0.1/0"),
        (["redis://a:1/0", "Unix:///run/r.sock"], ["Unix:///run/r.sock"], "unix:///run/r.sock"),
    ],
)
def test_e011_location_without_a_scheme(location: Any, bad: list[Any], example: str) -> None:
    with override_settings(CACHES=_redis_cache(location), REDISLOCK={}):
        messages = check_settings()
    assert _ids(messages) == ["django_redislock.E011"] * len(bad)
    for message, value in zip(messages, bad, strict=True):
        assert f"= {value!r} is not a Redis URL" in message.msg
        assert isinstance(message, Error)
    assert repr(example) in messages[0].hint


@pytest.mark.parametrize(
    "location",
    [
        "redis://127.0.0.1:6379/0",
        "rediss://user:pw@example.com:6380/1",
        "unix:///run/redis.sock?db=0",
        ["redis://a:1/0", "redis://b:2/0"],
        "redis://a:1/0, redis://b:2/0",
    ],
)
def test_e011_accepts_redis_urls(location: Any) -> None:
    with override_settings(CACHES=_redis_cache(location), REDISLOCK={}):
        assert check_settings() == []


def _django_cache(location: Any) -> dict[str, Any]:
    return {"default": {"BACKEND": DJANGO_REDIS_CACHE, "LOCATION": location}}


@pytest.mark.parametrize(
    ("location", "bad"),
    [
        ("127.0.0.1:6391", ["127.0.0.1:6391"]),
        (["redis://a:1/0", "b:2"], ["b:2"]),
        # Django splits on semicolons too, and keeps the spaces (which redis-py refuses).
        ("redis://a:1/0;b:2", ["b:2"]),
        ("redis://a:1/0, redis://b:2/0", [" redis://b:2/0"]),
        (None, [None]),
    ],
)
def test_e011_for_djangos_own_redis_cache(location: Any, bad: list[Any]) -> None:
    with override_settings(CACHES=_django_cache(location), REDISLOCK={}):
        messages = check_settings()
    assert _ids(messages) == ["django_redislock.E011"] * len(bad)
    for message, value in zip(messages, bad, strict=True):
        assert f"= {value!r} is not a Redis URL" in message.msg


@pytest.mark.parametrize(
    "location",
    ["redis://a:1/0", "redis://a:1/0;unix:///run/redis.sock?db=1", ["rediss://a/0", "redis://b/0"]],
)
def test_e011_accepts_djangos_own_redis_urls(location: Any) -> None:
    with override_settings(CACHES=_django_cache(location), REDISLOCK={}):
        assert check_settings() == []


def test_e011_says_which_use_would_fail() -> None:
    with override_settings(CACHES=_redis_cache(["a:1", "b:2"]), REDISLOCK={}):
        first, replica = check_settings()
    assert "the first lock would fail" in first.msg
    assert "the cache's first read from that replica would fail" in replica.msg


def test_e011_not_raised_when_a_client_factory_replaces_the_cache() -> None:
    with override_settings(
        CACHES=_redis_cache("127.0.0.1:6391"),
        REDISLOCK={"CLIENT": "tests.settings.make_client"},
    ):
        assert check_settings() == []


@pytest.mark.parametrize("location", ["127.0.0.1:6391", "REDIS://127.0.0.1:6391/0"])
@pytest.mark.parametrize("caches", [_redis_cache, _django_cache])
def test_e011_is_what_the_first_lock_would_hit(caches: Any, location: str) -> None:
    # The mistake the check reports: redis-py refuses the location at the first use.
    from django_redislock import connection, get_lock

    connection.reset()
    try:
        with (
            override_settings(CACHES=caches(location), REDISLOCK={}),
            pytest.raises(ValueError, match="scheme"),
        ):
            get_lock("x").acquire()
    finally:
        connection.reset()


# -- E031 / W002: the middleware and where it sits ----------------------------------------
MW = "django_redislock.middleware.ConcurrencyLimitMiddleware"
AUTH = "django.contrib.auth.middleware.AuthenticationMiddleware"
SESSION = "django.contrib.sessions.middleware.SessionMiddleware"
USER_RULE = {"name": "export", "limit": 1, "per": "user"}
GLOBAL_RULE = {"name": "reports", "limit": 2}


def _setup_ids(middleware: list[str], *rules: dict[str, Any]) -> list[CheckMessage]:
    with override_settings(MIDDLEWARE=middleware, REDISLOCK={"THROTTLE": list(rules)}):
        return check_throttle_setup()


def test_e031_rules_without_the_middleware() -> None:
    messages = _setup_ids([SESSION, AUTH], GLOBAL_RULE)
    assert _ids(messages) == ["django_redislock.E031"]
    assert isinstance(messages[0], Error)
    assert MW in messages[0].hint


def test_e031_not_raised_with_the_middleware_a_subclass_or_no_rules() -> None:
    assert _setup_ids([SESSION, AUTH, MW], GLOBAL_RULE) == []
    assert _setup_ids([SESSION, AUTH, "tests.test_conf_checks.OwnLimits"], GLOBAL_RULE) == []
    assert _setup_ids([SESSION, AUTH]) == []


def test_w002_per_user_rule_before_authentication() -> None:
    messages = _setup_ids([SESSION, MW, AUTH], GLOBAL_RULE, USER_RULE)
    assert _ids(messages) == ["django_redislock.W002"]
    assert isinstance(messages[0], Warning)
    assert "REDISLOCK['THROTTLE'][1] ('export')" in messages[0].msg
    assert "comes after ConcurrencyLimitMiddleware" in messages[0].msg
    assert "per IP" in messages[0].msg


def test_w002_per_user_rule_without_authentication() -> None:
    messages = _setup_ids([MW], USER_RULE)
    assert _ids(messages) == ["django_redislock.W002"]
    assert "is not in MIDDLEWARE" in messages[0].msg


def test_w002_not_raised_when_authentication_comes_first() -> None:
    assert _setup_ids([SESSION, AUTH, MW], USER_RULE) == []
    # A subclass of AuthenticationMiddleware sets request.user as well.
    assert _setup_ids([SESSION, "tests.test_conf_checks.OwnAuth", MW], USER_RULE) == []
    # Only per-user rules care.
    assert _setup_ids([MW, SESSION, AUTH], GLOBAL_RULE) == []


# -- W003: url_name must name a URL -------------------------------------------------------
def _url_ids(url_name: Any, urlconf: str = "tests.urls_throttle") -> list[CheckMessage]:
    rule = {"name": "r", "limit": 1, "url_name": url_name}
    with override_settings(ROOT_URLCONF=urlconf, REDISLOCK={"THROTTLE": [rule]}):
        return check_url_names()


def test_w003_url_name_that_names_nothing() -> None:
    messages = _url_ids(["ok", "nope", "slow"])
    assert _ids(messages) == ["django_redislock.W003"]
    assert "'url_name' 'nope' names no URL of ROOT_URLCONF" in messages[0].msg
    assert isinstance(messages[0], Warning)


def test_w003_reports_each_missing_name() -> None:
    assert _ids(_url_ids(["nope", "nada"])) == ["django_redislock.W003"] * 2


@pytest.mark.parametrize(
    ("url_name", "urlconf"),
    [
        ("ok", "tests.urls_throttle"),
        (["slow", "named-view"], "tests.urls_throttle"),
        ("admin:index", "tests.urls"),
        ("index", "tests.urls"),
        ("admin:auth_user_changelist", "tests.urls"),
    ],
)
def test_w003_not_raised_for_names_and_namespaced_names(url_name: Any, urlconf: str) -> None:
    assert _url_ids(url_name, urlconf) == []


def test_w003_namespace_must_match() -> None:
    assert _ids(_url_ids("shop:index", "tests.urls")) == ["django_redislock.W003"]


def test_w003_names_the_middleware_would_match(client: Any, settings: Any) -> None:
    # The check's idea of a name is the middleware's: a name it accepts matches a request.
    from django_redislock.throttling.rules import _Resolved

    settings.ROOT_URLCONF = "tests.urls"
    request = RequestFactory().get("/admin/")
    assert {"index", "admin:index"} <= _Resolved(request).names


# -- registered in ready(), run by manage.py check ------------------------------------------
def test_manage_py_check_runs_the_new_checks() -> None:
    bad = {
        "MIDDLEWARE": [MW, SESSION, AUTH],
        "CACHES": _redis_cache("127.0.0.1:6391"),
        "ROOT_URLCONF": "tests.urls_throttle",
        "REDISLOCK": {"THROTTLE": [dict(USER_RULE, url_name="nope")]},
    }
    err = io.StringIO()
    with override_settings(**bad), pytest.raises(SystemCheckError) as info:
        call_command("check", "django_redislock", stdout=io.StringIO(), stderr=err)
    report = str(info.value)
    for check_id in ("E011", "W002", "W003"):
        assert f"django_redislock.{check_id}" in report
    with (
        override_settings(MIDDLEWARE=[SESSION, AUTH], REDISLOCK={"THROTTLE": [GLOBAL_RULE]}),
        pytest.raises(SystemCheckError, match="django_redislock.E031"),
    ):
        call_command("check", "django_redislock", stdout=io.StringIO(), stderr=io.StringIO())


def test_checks_are_registered() -> None:
    from django.core.checks import registry

    registered = registry.registry.get_checks()
    for check in (check_settings, check_throttle_setup, check_url_names):
        assert check in registered


# -- every ID is tested here and documented ---------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent


# -- E012: CONNECT_EARLY is a bool or DATABASES aliases (tests/test_connect_early.py) -------------
@pytest.mark.parametrize("value", ["default", ["nowhere"]])
def test_connect_early_must_be_a_bool_or_aliases(value: object) -> None:
    with override_settings(REDISLOCK={"CONNECT_EARLY": value}):
        assert _ids(check_settings()) == ["django_redislock.E012"]


def _ids_in_code() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "django_redislock").rglob("*.py"):
        found |= set(re.findall(r"django_redislock\.[EW]\d{3}", path.read_text()))
    return found


@pytest.mark.parametrize("window", [0, 0.25, 1, 60])
def test_a_breaker_window_of_0_to_60_seconds_is_fine(window: float) -> None:
    with override_settings(REDISLOCK={"BREAKER_WINDOW": window}):
        assert check_settings() == []


def test_every_check_id_is_tested_and_documented() -> None:
    ids = _ids_in_code()
    assert {"django_redislock.E001", "django_redislock.E031", "django_redislock.W003"} <= ids
    # Most are tested in this file; a feature's own IDs may be tested beside it.
    tested = "".join(path.read_text() for path in Path(__file__).parent.glob("test_*.py"))
    docs = (ROOT / "docs" / "checks.rst").read_text()
    for check_id in sorted(ids):
        short = check_id.split(".")[1]
        assert f'"{short}"' in tested or f'"{check_id}"' in tested, f"{check_id} is not tested"
        assert f"``{check_id}``" in docs, f"{check_id} is not in docs/checks.rst"


class OwnLimits(ConcurrencyLimitMiddleware):
    """A project's own subclass of the middleware."""


class OwnAuth(AuthenticationMiddleware):
    """A project's own authentication middleware, built on Django's."""


def test_a_middleware_entry_that_fails_to_import_does_not_break_the_checks() -> None:
    broken = "tests.no_such_module.Middleware"
    assert _ids(_setup_ids([broken, SESSION, AUTH, MW], USER_RULE)) == []
    assert _ids(_setup_ids([broken], GLOBAL_RULE)) == ["django_redislock.E031"]


def test_settings_are_read_again_after_a_change() -> None:
    with override_settings(REDISLOCK={"WAIT": 3}):
        assert conf.WAIT == 3.0
        with override_settings(REDISLOCK={"WAIT": 4}):
            assert conf.WAIT == 4.0
        assert conf.WAIT == 3.0
        # The dict is kept, not copied: a change made to it in place shows.
        settings.REDISLOCK["WAIT"] = 5
        assert conf.WAIT == 5.0
