"""System checks for ``REDISLOCK``: one test per documented ID, no network."""

from __future__ import annotations

import io
import math
from typing import Any

import pytest
from django.core.checks import Error, Warning
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_redislock.checks import check_settings
from django_redislock.conf import DEFAULTS, conf

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
        ({"BUSY_STATUS": 200}, "E008", "BUSY_STATUS"),
        ({"BUSY_STATUS": "409"}, "E008", "BUSY_STATUS"),
        ({"BUSY_STATUS": True}, "E008", "BUSY_STATUS"),
        ({"REPLICAS": -1}, "E009", "REPLICAS"),
        ({"REPLICAS": 1.5}, "E009", "REPLICAS"),
        ({"REPLICAS": True}, "E009", "REPLICAS"),
        ({"ENABLED": "yes"}, "E010", "'ENABLED'"),
        ({"RENEW": 1}, "E010", "'RENEW'"),
        ({"FAIL_OPEN": None}, "E010", "'FAIL_OPEN'"),
        ({"THROTTLE_FAIL_OPEN": "false"}, "E010", "'THROTTLE_FAIL_OPEN'"),
        ({"SOCKET_TIMEOUT": 20, "TIMEOUT": 30}, "W001", "SOCKET_TIMEOUT"),
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


def test_check_command_fails_on_a_bad_setting() -> None:
    with override_settings(REDISLOCK={"TIMEOUT": -1}), pytest.raises(SystemCheckError) as info:
        call_command("check", stdout=io.StringIO(), stderr=io.StringIO())
    assert "django_redislock.E003" in str(info.value)


def test_check_command_passes_on_clean_settings() -> None:
    out = io.StringIO()
    call_command("check", stdout=out, stderr=io.StringIO())
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
