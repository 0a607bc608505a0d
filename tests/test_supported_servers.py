"""docs/servers.rst against tox.ini: the servers CI runs on are the ones the page names.

What the page says about each server's behaviour is tested where it happens
(test_cluster.py for Cluster wake-ups without sharded pub/sub); this file
keeps its list of tested servers and the tox factors behind it in step.
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

from tests.servers import redis_compatible_version, requires_redis, server_label

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "servers.rst").read_text()


def _tox() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "tox.ini")
    return parser


def _factor_servers() -> dict[str, str]:
    """tox factor -> the server it must run on (REDISLOCK_EXPECT_SERVER)."""
    found = re.findall(
        r"^\s*(\w+): REDISLOCK_EXPECT_SERVER = (.+)$",
        _tox()["testenv"]["set_env"],
        flags=re.MULTILINE,
    )
    return dict(found)


def test_each_server_factor_is_in_ci_and_on_the_page() -> None:
    factors = _factor_servers()
    assert factors == {"server62": "Redis 6.2", "valkey81": "Valkey 8.1"}
    ci = [env.strip() for env in _tox()["tox"]["labels"].split("=", 1)[1].split(",")]
    for factor, server in factors.items():
        env = f"py311-django52-redis8-{factor}"
        assert env in ci
        assert f"``{env}``" in PAGE
        # The table row: "Redis 6.2.14" and the factor beside it.
        assert re.search(rf"\* - {re.escape(server)}\.\d+\n\s+- ``{factor}``", PAGE), server


def test_the_server_subset_names_files_that_exist() -> None:
    paths = _tox()["servers"]["paths"].split()
    assert paths
    for path in paths:
        assert (ROOT / path).exists(), path
    assert "tox.ini lists the subset's paths under ``[servers]``" in PAGE


def test_the_server_is_named_with_its_version() -> None:
    # "server: Redis 6.2.14 (...)" in the test header.
    assert re.fullmatch(r"(Redis|Valkey) \d+\.\d+\.\d+", server_label())


def test_the_skip_reason_names_the_server() -> None:
    marker = requires_redis(99, 0, "a feature no server has").mark
    assert marker.args == (True,)
    assert marker.kwargs["reason"] == (
        f"a feature no server has needs Redis 99.0 or newer; the suite runs on {server_label()}"
    )
    assert redis_compatible_version() < (99, 0)
    assert requires_redis(6, 2, "anything").mark.args == (False,)
    # The page's example is the same sentence.
    example = requires_redis(7, 0, "sharded pub/sub").mark.kwargs["reason"]
    assert example.replace(server_label(), "Redis 6.2.14") in " ".join(PAGE.split())
