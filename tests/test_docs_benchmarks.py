"""docs/benchmarks.rst lists every harness in ``benchmarks/``, and counts them right."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
WORDS += ["eleven", "twelve"]


def test_the_harness_table_names_every_harness_and_their_number() -> None:
    harnesses = sorted(
        path.stem
        for path in (ROOT / "benchmarks").glob("*.py")
        if 'if __name__ == "__main__"' in path.read_text()
    )
    page = (ROOT / "docs" / "benchmarks.rst").read_text()
    listed = sorted(set(re.findall(r"^``python -m benchmarks\.(\w+)", page, re.MULTILINE)))
    assert listed == harnesses
    count = re.search(r"^(\w+) harnesses live in ``benchmarks/``", page, re.MULTILINE)
    assert count is not None
    assert WORDS.index(count.group(1).lower()) == len(harnesses)


def _options(module: str) -> set[str]:
    """The options a harness's source names (``"--rounds"``), with the shared ones."""
    source = (ROOT / "benchmarks" / f"{module}.py").read_text()
    source += (ROOT / "benchmarks" / "common.py").read_text()
    return set(re.findall(r'"(--[a-z][a-z0-9-]*)"', source))


def _commands(page: str) -> list[tuple[str, str]]:
    """``(module, arguments)`` of every ``python -m benchmarks.X ...`` on ``page``:
    a command in a literal block (its continued lines joined) or inline."""
    joined = re.sub(r"\\\n\s*", " ", page)
    found = re.findall(r"^\s+python -m benchmarks\.(\w+)([^\n#]*)", joined, re.MULTILINE)
    inline = re.findall(r"``python -m benchmarks\.(\w+)([^`]*)``", joined)
    return found + [(module, args.replace("\n", " ")) for module, args in inline]


def _misnamed(page: str, *, alone: bool = True) -> list[str]:
    every = set().union(*(_options(p.stem) for p in (ROOT / "benchmarks").glob("*.py")))
    wrong = [
        f"python -m benchmarks.{module} {flag}"
        for module, args in _commands(page)
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", args)
        if flag not in _options(module)
    ]
    if not alone:
        return wrong
    # On the harnesses' own page, an option named on its own (``--other DIR``)
    # belongs to some harness.
    flags = re.findall(r"``(--[a-z][a-z0-9-]*)[^`]*``", page)
    return wrong + [flag for flag in flags if flag not in every]


def test_every_option_the_page_names_is_a_harness_s() -> None:
    docs = ROOT / "docs"
    assert _misnamed((docs / "benchmarks.rst").read_text()) == []
    # Elsewhere, the options of the harnesses' commands (other options are other tools').
    for page in [*docs.glob("*.rst"), ROOT / "README.rst"]:
        assert _misnamed(page.read_text(), alone=False) == [], page.name


def test_the_option_check_can_fail() -> None:
    page = (
        "Run::\n\n    python -m benchmarks.locks --phases contended \\\n        --nothing 1\n\n"
        "and ``python -m benchmarks.client_cost --contended 8 --library x``; "
        "``--library DIR`` counts another version.\n"
    )
    assert _misnamed(page) == [
        "python -m benchmarks.locks --nothing",
        "python -m benchmarks.client_cost --library",
        "--library",
    ]
