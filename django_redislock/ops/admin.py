"""A page in the Django admin that lists held locks and force-releases them.

Above the rows, a "By template" table sums them up per template
(``core.ops.inspection.summarize``): names carry ids, templates do not.

At scale: the rows come a page at a time (``PAGE_SIZE`` names, in natural
order: ``cart:2`` before ``cart:10``) under a total, while the summary covers
every row; the page says when Redis was read, and reloads itself every
``?refresh=`` seconds when asked (one of ``REFRESH_CHOICES``).

There is no model and no migration: ``install(site)`` adds one URL to an
``AdminSite`` (``django_redislock.admin`` does it for ``admin.site``) and an
entry to its app list. Only active staff reach the page (the admin's own
login), and then only users allowed by ``REDISLOCK['ADMIN_PERMISSION']``
(superusers by default). Releasing takes a POST with a CSRF token, through a
confirmation page that shows what will go. Each page carries the holders it
showed (``core.ops.force.Shown``: their ids, never their tokens) and releases only
those: a holder that came after the page was shown, of any kind, is left alone.
A semaphore's permits and a read-write lock's readers have a checkbox each, to
release one alone. Each name's first waiters follow its holders.
"""

from __future__ import annotations

import binascii
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.module_loading import import_string

from ..conf import conf
from ..connection import get_client
from ..core import (
    HeldLock,
    RedisClient,
    RedisUnavailable,
    Shown,
    TemplateSummary,
    force_release,
    list_locks,
    still_held,
    summarize,
)
from ..locking.factories import keyspace
from .display import (
    duration,
    owner_text,
    printable,
    quoted,
    renewed_text,
    template_text,
    waited_text,
    waiter_owner_text,
)
from .pages import REFRESH_CHOICES, page_links, page_of, read_at, refresh_of
from .selection import merged, parse_selection, selection

__all__ = ["has_permission", "install"]

logger = logging.getLogger("django_redislock.admin")

URL_NAME = "django_redislock_locks"
APP_LABEL = "django_redislock"


def has_permission(user: Any) -> bool:
    """Whether ``user`` may see and release locks (``ADMIN_PERMISSION``)."""
    if not getattr(user, "is_active", False) or not getattr(user, "is_staff", False):
        return False
    check = conf.ADMIN_PERMISSION
    if check is None:
        return bool(getattr(user, "is_superuser", False))
    func: Callable[[Any], Any] = import_string(check) if isinstance(check, str) else check
    return bool(func(user))


def admin_user(request: HttpRequest) -> str:
    """Who releases from the admin, as the log and the holder name them."""
    user = request.user
    return f"admin user {user.get_username()!r} (id {user.pk})"


# Digits of a fencing token shown in the table; the whole token is in the
# cell's title. Tokens of one lock differ in their last digits.
FENCE_DIGITS = 6


def short_fence(fence: int | None) -> str:
    """``…567890`` for a long token, the token itself when short, ``-`` for none."""
    if fence is None:
        return "-"
    text = str(fence)
    return text if len(text) <= FENCE_DIGITS + 1 else "\u2026" + text[-FENCE_DIGITS:]


@dataclass(frozen=True)
class Row:
    """A HeldLock with its display strings (escaped; the template escapes HTML)."""

    lock: HeldLock
    value: str
    name: str
    owner: str
    label: str
    fence: str
    held_for: str
    lease_left: str
    renewed: str
    holders: list[dict[str, str]]
    # The first waiters, oldest first, and how many more wait.
    waiters: list[dict[str, str]]
    more_waiting: int

    @property
    def holder_kind(self) -> str:
        """What each holder gets a row of its own as: "permit", "reader", or "" (none)."""
        if self.lock.kind == "semaphore":
            return "permit"
        return "reader" if self.lock.kind == "rwlock" and self.lock.fence is None else ""


def _row(lock: HeldLock) -> Row:
    return Row(
        lock=lock,
        value=selection(lock),
        name=printable(lock.name),
        owner=owner_text(lock),
        label=printable(lock.label),
        fence=short_fence(lock.fence),
        held_for=duration(lock.held_for),
        lease_left=duration(lock.lease_left),
        renewed=renewed_text(lock.holders[0]),
        holders=[
            {
                "owner": owner_text(h),
                "label": printable(h.label),
                "held_for": duration(h.held_for),
                "lease_left": duration(h.lease_left),
                "renewed": renewed_text(h),
                "ident": h.ident,
                # Releases this holder alone (one permit, one reader).
                "value": selection(lock, [h.ident]),
            }
            for h in lock.holders
        ],
        waiters=[
            {
                "owner": waiter_owner_text(w),
                "label": printable(w.label),
                "waited": waited_text(w),
                "gives_up_in": duration(w.gives_up_in),
                "ident": w.ident,
            }
            for w in lock.waiting
        ],
        more_waiting=max(0, lock.waiters - len(lock.waiting)),
    )


@dataclass(frozen=True)
class SummaryRow:
    """A TemplateSummary with its display strings, and links to its busiest names."""

    summary: TemplateSummary
    template: str
    holders: str
    longest_held: str
    busiest: list[dict[str, str]]


def _summary_row(site: admin.AdminSite, summary: TemplateSummary) -> SummaryRow:
    busiest = []
    for row in summary.busiest:
        try:
            # The page filtered to exactly that name.
            url = _list_url(site, row.name, True)
        except UnicodeEncodeError:  # a lone surrogate has no URL form
            url = ""
        busiest.append(
            {
                "name": printable(row.name),
                "url": url,
                "waiters": str(row.waiters),
                "held_for": duration(row.held_for),
            }
        )
    return SummaryRow(
        summary=summary,
        template=template_text(summary.template),
        holders="-" if summary.kind == "lock" else str(summary.holders),
        longest_held=duration(summary.longest_held),
        busiest=busiest,
    )


# -- the view -------------------------------------------------------------------
def _filters(params: Any) -> tuple[str | None, bool]:
    pattern = params.get("pattern") or None
    return pattern, params.get("literal") == "1"


def _list_url(
    site: admin.AdminSite,
    pattern: str | None,
    literal: bool,
    *,
    page: int = 1,
    refresh: int = 0,
) -> str:
    url = reverse(f"{site.name}:{URL_NAME}", current_app=site.name)
    query = {}
    if pattern:
        query["pattern"] = pattern
        if literal:
            query["literal"] = "1"
    if page > 1:
        query["p"] = str(page)
    if refresh:
        query["refresh"] = str(refresh)
    return url + ("?" + urlencode(query) if query else "")


def _described(row: HeldLock) -> str:
    return f"{row.kind} {quoted(row.name)}"


def locks_view(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    if not has_permission(request.user):
        raise PermissionDenied
    params = request.POST if request.method == "POST" else request.GET
    pattern, literal = _filters(params)
    refresh = refresh_of(params)
    context: dict[str, Any] = {
        **site.each_context(request),
        "title": "Held locks",
        "pattern": pattern or "",
        "literal": literal,
        "refresh": refresh,
        "refresh_choices": REFRESH_CHOICES,
        "list_url": _list_url(site, pattern, literal, refresh=refresh),
        "opts": None,
    }
    try:
        client = get_client()
        if request.method == "POST":
            return _post(request, site, client, context, pattern, literal)
        rows = list_locks(client, keyspace(), pattern, literal)
    except RedisUnavailable as exc:
        logger.warning("admin lock page: %s", exc)
        context["error"] = str(exc)
        return TemplateResponse(
            request,
            "admin/django_redislock/locks.html",
            {**context, "rows": [], "summary": [], "refresh": 0},
            status=503,
        )
    page = page_of(rows, params.get("p"))
    context["rows"] = [_row(row) for row in page.object_list]
    context["page"] = page
    context["pages"] = page_links(
        page, lambda n: _list_url(site, pattern, literal, page=n, refresh=refresh)
    )
    context["total"] = len(rows)
    context["read_at"], context["read_at_text"] = read_at(rows)
    # The summary covers every row, not only this page's.
    context["summary"] = [_summary_row(site, s) for s in summarize(rows)]
    return TemplateResponse(request, "admin/django_redislock/locks.html", context)


def _post(
    request: HttpRequest,
    site: admin.AdminSite,
    client: RedisClient,
    context: dict[str, Any],
    pattern: str | None,
    literal: bool,
) -> HttpResponse:
    try:
        chosen = merged(parse_selection(v) for v in request.POST.getlist("selected"))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return HttpResponseBadRequest("malformed selection")
    back = HttpResponseRedirect(_list_url(site, pattern, literal, refresh=refresh_of(request.POST)))
    if not chosen:
        messages.warning(request, "Select at least one lock to release.")
        return back
    ks = keyspace()
    # Only the holders this request's page showed, as they hold now.
    current, gone = still_held(client, ks, chosen)
    if request.POST.get("confirm") != "yes":
        context.update(
            title="Release these locks?",
            rows=[_row(row) for row in current],
            gone=[_gone(item) for item in gone],
        )
        return TemplateResponse(request, "admin/django_redislock/confirm_release.html", context)
    who = admin_user(request)
    result = force_release(client, ks, current, by=who)
    for row in result.released:
        logger.warning(
            "released from the admin by %s: %s",
            who,
            _described(row),
            extra={
                "lock_name": row.name,
                "template": row.template,
                "kind": row.kind,
                "forced_by": who,
            },
        )
        messages.success(request, f"Released {_described(row)}.")
    lost = [_gone(item) for item in gone]
    lost.extend(_gone(Shown.of(row)) for row in result.changed)
    for what in lost:
        messages.warning(request, f"Not released: {what} was released or changed hands meanwhile.")
    return back


def _gone(item: Shown) -> str:
    """``lock 'x'``, or ``semaphore 'x' (2 holders)`` when a kind has several."""
    what = f"{item.kind} {quoted(item.name)}"
    if item.kind == "lock":
        return what
    count = len(item.holders)
    return f"{what} ({count} holder{'' if count == 1 else 's'})"


# -- wiring ---------------------------------------------------------------------
def install(site: admin.AdminSite) -> None:
    """Add the lock page to ``site`` (its URLs and its app list). Idempotent."""
    if getattr(site, "_redislock_installed", False):
        return
    get_urls = site.get_urls
    get_app_list = site.get_app_list

    def urls() -> list[URLPattern | Any]:
        view = site.admin_view(lambda request: locks_view(request, site))
        return [path("django_redislock/locks/", view, name=URL_NAME), *get_urls()]

    def app_list(request: HttpRequest, app_label: str | None = None) -> list[dict[str, Any]]:
        apps = list(get_app_list(request, app_label))
        if app_label not in (None, APP_LABEL) or not has_permission(request.user):
            return apps
        url = reverse(f"{site.name}:{URL_NAME}", current_app=site.name)
        apps.append(
            {
                "name": "Redis locks",
                "app_label": APP_LABEL,
                "app_url": url,
                "has_module_perms": True,
                "models": [
                    {
                        "model": None,
                        "name": "Held locks",
                        "object_name": "HeldLock",
                        "perms": {"add": False, "change": True, "delete": False, "view": True},
                        "admin_url": url,
                        "add_url": None,
                        "view_only": True,
                    }
                ],
            }
        )
        apps.sort(key=lambda app: app["name"].lower())
        return apps

    # Instance attributes shadow the methods for this site only.
    site.get_urls = urls  # type: ignore[method-assign]
    site.get_app_list = app_list  # type: ignore[method-assign]
    site._redislock_installed = True  # type: ignore[attr-defined]
