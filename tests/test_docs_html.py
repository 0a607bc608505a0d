"""The built documentation shows a reader no error box.

``sphinx-build -W`` fails on warnings, but some errors reach the page without
one: Furo paints a ``.. contents::`` table as a red "ERROR: Adding a table of
contents ..." box from its style sheet alone. The docs' own extension
(docs/_ext/rendered_errors.py) reads the built pages and warns about them;
these tests build the pages as ``tox -e docs`` does and check that the
extension catches such a page: a contents table, a system message, an
unresolved reference. They need the docs' requirements
(docs/requirements.txt).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("sphinx", "furo")),
    reason="the docs' requirements are not installed (docs/requirements.txt)",
)


def _build(source: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
        + [str(source), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
@pytest.mark.skipif(
    bool(os.environ.get("REDISLOCK_DOCS_BUILT_ELSEWHERE")),
    reason="tox's docs env builds the pages with -W and the same check",
)
def test_the_pages_build_without_warnings_or_error_boxes(tmp_path: Path) -> None:
    done = _build(ROOT / "docs", tmp_path / "html")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "html" / "tutorial.html").is_file()


def _project(tmp_path: Path, index: str) -> Path:
    """A one-page Sphinx project that loads the docs' extension."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "conf.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'docs' / '_ext')!r})\n"
        'extensions = ["rendered_errors"]\n'
        'html_theme = "furo"\n'
    )
    (source / "index.rst").write_text(index)
    return source


@pytest.mark.parametrize(
    ("element", "report"),
    [
        ('<div class="system-message"><p>ERROR/3 ...</p></div>', "a docutils system message"),
        ('<span class="problematic">`nowhere`_</span>', "a problematic (unresolved) reference"),
    ],
)
def test_a_page_showing_a_system_message_fails_the_build(
    tmp_path: Path, element: str, report: str
) -> None:
    # What docutils renders for an error it reports below the warning level
    # Sphinx turns into a failure (or a theme or raw block shows): it reaches
    # the page with no warning, so -W alone would let it through.
    source = _project(tmp_path, f"Title\n=====\n\n.. raw:: html\n\n   {element}\n")
    done = _build(source, tmp_path / "html")
    assert done.returncode != 0
    reported = [line for line in done.stderr.splitlines() if report in line]
    assert len(reported) == 1, done.stderr
    assert "index.html" in reported[0]


def test_a_page_with_a_contents_table_fails_the_build(tmp_path: Path) -> None:
    escape = "this-will-duplicate-information-and-it-is-still-useful-here"
    source = _project(
        tmp_path,
        "Title\n=====\n\n.. contents::\n   :local:\n\nOne\n---\n\nText.\n\n"
        f"Two\n---\n\n.. contents::\n   :class: {escape}\n   :local:\n\n"
        "Three\n~~~~~\n\nText.\n",
    )
    done = _build(source, tmp_path / "html")
    assert done.returncode != 0
    reported = [line for line in done.stderr.splitlines() if "Furo shows as an ERROR" in line]
    # The second table asks for Furo's escape hatch: only the first is reported.
    assert len(reported) == 1, done.stderr
    assert "index.html" in reported[0]
