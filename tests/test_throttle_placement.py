"""Where ConcurrencyLimitMiddleware goes: last, so its refusals get every header.

A response the middleware makes itself (503, 429) passes back only through the
middleware listed above it. Placed last, as the README recommends, it sits
below every middleware of Django's project template, so a refusal gets the
same security headers as any page: ``X-Frame-Options`` (XFrameOptionsMiddleware),
``X-Content-Type-Options``, ``Referrer-Policy``, ``Cross-Origin-Opener-Policy``
(SecurityMiddleware).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import override_settings

from django_redislock.locking.factories import get_semaphore
from django_redislock.throttling.checks import check_throttle_setup
from tests.test_decorators import Get, make_get

pytestmark = [pytest.mark.urls("tests.urls_throttle"), pytest.mark.usefixtures("fresh_clients")]

MW = "django_redislock.middleware.ConcurrencyLimitMiddleware"
# Django's startproject MIDDLEWARE, in its order.
TEMPLATE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
RECOMMENDED = [*TEMPLATE, MW]
# What the README used to show: right after AuthenticationMiddleware.
AFTER_AUTH = [*TEMPLATE[:5], MW, *TEMPLATE[5:]]
HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}
RULES = [
    {"name": "reports", "path": r"^/reports/", "limit": 1, "wait": 0},
    {"name": "per-user", "path": r"^/named/", "limit": 1, "per": "user"},
]


@pytest.fixture(params=["client", "async_client"])
def get(request: pytest.FixtureRequest) -> Get:
    return make_get(request)


def _refused(get: Get, middleware: list[str], path: str, held: str) -> Any:
    with override_settings(MIDDLEWARE=middleware, REDISLOCK={"THROTTLE": RULES}):
        # The only permit is taken: the request is refused by the middleware itself.
        permit = get_semaphore(held, 1, timeout=30, wait=0)
        assert permit.acquire()
        try:
            return get(path)
        finally:
            permit.release()


@pytest.mark.parametrize(("path", "held", "status"), [("/reports/slow/", "throttle:reports", 503)])
def test_recommended_order_refusal_has_the_security_headers(
    get: Get, path: str, held: str, status: int
) -> None:
    response = _refused(get, RECOMMENDED, path, held)
    assert response.status_code == status
    assert response["Retry-After"] == "1"
    for header, value in HEADERS.items():
        assert response.get(header) == value, header


def test_recommended_order_per_client_refusal_has_the_security_headers(get: Get) -> None:
    # Anonymous, so the per-user rule counts the client's address.
    response = _refused(get, RECOMMENDED, "/named/1/", "throttle:per-user:user:ip:127.0.0.1")
    assert response.status_code == 429
    for header, value in HEADERS.items():
        assert response.get(header) == value, header


def test_right_after_authentication_the_refusal_lacks_x_frame_options(get: Get) -> None:
    # Why the recommendation is "last": XFrameOptionsMiddleware sits below.
    response = _refused(get, AFTER_AUTH, "/reports/slow/", "throttle:reports")
    assert response.status_code == 503
    assert "X-Frame-Options" not in response
    assert response["X-Content-Type-Options"] == "nosniff"


def test_recommended_order_passes_the_checks() -> None:
    with override_settings(MIDDLEWARE=RECOMMENDED, REDISLOCK={"THROTTLE": RULES}):
        assert check_throttle_setup() == []


def _middleware_blocks() -> list[tuple[str, list[str]]]:
    """Every ``MIDDLEWARE = [...]`` block of the README and the docs that lists ours."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    found = []
    for path in [root / "README.rst", *sorted((root / "docs").rglob("*.rst"))]:
        text = path.read_text()
        for match in re.finditer(r"MIDDLEWARE = \[\n(.*?)\n\s*\]", text, re.S):
            lines = [line.strip() for line in match.group(1).splitlines() if line.strip()]
            if any(MW in line for line in lines):
                found.append((path.name, lines))
    return found


def test_the_docs_recommend_the_tested_order() -> None:
    # Wherever a page shows where the middleware goes, it goes last.
    blocks = _middleware_blocks()
    assert blocks
    for page, lines in blocks:
        assert lines[-1].strip('",') == MW, (page, lines)
        full = [line.strip('",') for line in lines if not line.startswith("#")]
        if len(full) > 1:
            assert full == RECOMMENDED, (page, lines)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("middleware", "status"),
    [
        # Before AuthenticationMiddleware (W002): the user is not known yet, so
        # the logged-in user is counted by address, and refused.
        ([*TEMPLATE[:2], MW, *TEMPLATE[2:]], 429),
        (RECOMMENDED, 200),
    ],
)
def test_per_user_rule_before_authentication_counts_per_ip(
    django_user_model: Any, middleware: list[str], status: int
) -> None:
    from django.test import Client

    user = django_user_model.objects.create_user("alice")
    client = Client()
    client.force_login(user)
    rule = {"name": "per-user", "path": r"^/ok/", "limit": 1, "per": "user"}
    with override_settings(MIDDLEWARE=middleware, REDISLOCK={"THROTTLE": [rule]}):
        # Someone else, anonymous, from the same address holds the address's permit.
        permit = get_semaphore("throttle:per-user:user:ip:127.0.0.1", 1, timeout=30, wait=0)
        assert permit.acquire()
        try:
            assert client.get("/ok/").status_code == status
        finally:
            permit.release()
