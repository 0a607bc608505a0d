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
