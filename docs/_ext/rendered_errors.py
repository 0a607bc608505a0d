"""Errors a reader would see on a built page that ``sphinx-build -W`` does not report.

Furo paints a ``.. contents::`` table as a red "ERROR: Adding a table of
contents in Furo-based documentation is unnecessary" box, from its style sheet
alone, so no warning is ever emitted; a docutils system message or a
problematic reference can also reach the page without one. This extension
reads every HTML page after the build and warns once per such element, which
``-W`` turns into a failed build. tests/test_docs_html.py runs it on the pages
and on a page made to fail.
"""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from sphinx.util import logging

logger = logging.getLogger(__name__)

# The class with which Furo lets a page keep a table of contents on purpose.
FURO_ESCAPE = "this-will-duplicate-information-and-it-is-still-useful-here"


class _Finder(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = (dict(attrs).get("class") or "").split()
        line = self.getpos()[0]
        if "system-message" in classes:
            self.found.append(f"line {line}: a docutils system message")
        if "problematic" in classes:
            self.found.append(f"line {line}: a problematic (unresolved) reference")
        if "contents" in classes and FURO_ESCAPE not in classes:
            self.found.append(
                f"line {line}: a '.. contents::' table, which Furo shows as an ERROR box"
            )


def problems(page: Path) -> list[str]:
    """What ``page`` (a built HTML file) shows a reader as an error."""
    finder = _Finder()
    finder.feed(page.read_text(encoding="utf-8"))
    finder.close()
    return finder.found


def _check(app: Any, exception: BaseException | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    for page in sorted(out.rglob("*.html")):
        for problem in problems(page):
            logger.warning("%s: %s", page.relative_to(out), problem)


def setup(app: Any) -> dict[str, Any]:
    app.connect("build-finished", _check)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
