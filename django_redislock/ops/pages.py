"""How the admin's lock page shows many names: pages, when Redis was read, reloads.

A site with thousands of held names made one page of 650 KB. The page shows
``PAGE_SIZE`` names at a time (the summary above them still covers every
name), says when Redis was read, by Redis's own clock, and reloads itself
every ``?refresh=`` seconds when someone asks for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.core.paginator import Page, Paginator

from ..core import HeldLock, iso_time

__all__ = ["PAGE_SIZE", "REFRESH_CHOICES", "page_links", "page_of", "read_at", "refresh_of"]

# Names per page: a hundred read at a glance and render at once.
PAGE_SIZE = 100

# Seconds between automatic reloads the page offers (0: off, the default).
# Each reload lists every name again (a SCAN, and a read per name, on the
# Redis the locks live on): never more often than every 5 s, and only when
# someone asks.
REFRESH_CHOICES = (0, 5, 10, 30, 60)


def refresh_of(params: Any) -> int:
    """The reload interval asked for (``?refresh=``), if it is one offered; else 0."""
    try:
        seconds = int(params.get("refresh") or 0)
    except ValueError:
        return 0
    return seconds if seconds in REFRESH_CHOICES else 0


def page_of(rows: list[HeldLock], number: Any) -> Page:
    """The page of rows asked for (``?p=``): the last one for a number past
    the end, the first one for anything that is not a page number."""
    return Paginator(rows, PAGE_SIZE).get_page(number)


def page_links(page: Page, url_of: Callable[[int], str]) -> list[dict[str, Any]]:
    """Links to the pages around ``page``, as the admin's change lists show
    them (``…`` for the gaps); none when everything fits on one page."""
    if not page.has_other_pages():
        return []
    links: list[dict[str, Any]] = []
    for number in page.paginator.get_elided_page_range(page.number, on_each_side=2, on_ends=1):
        if number == Paginator.ELLIPSIS:
            links.append({"number": number, "url": "", "current": False})
        else:
            url = url_of(int(number))
            links.append({"number": number, "url": url, "current": number == page.number})
    return links


def read_at(rows: list[HeldLock]) -> tuple[str, str]:
    """When Redis was read: ``(ISO instant, "YYYY-MM-DD HH:MM:SS UTC")``, by
    Redis's clock (the last row read), or by this server's with no row."""
    latest = max((row.read_at for row in rows if row.read_at is not None), default=None)
    instant = iso_time(latest if latest is not None else time.time()) or ""
    return instant, instant.replace("T", " ")[:19] + " UTC"
