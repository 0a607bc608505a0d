"""The harnesses in ``benchmarks/`` still run: each imports, and the work each
measures through the library's own API runs once, at a tiny size.

The harnesses are not part of the package, so nothing else would notice when
a name they use moves; their figures are what the docs quote."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
HARNESSES = sorted(
    path.stem for path in (ROOT / "benchmarks").glob("*.py") if path.stem != "__init__"
)


@pytest.mark.parametrize("name", HARNESSES)
def test_every_harness_imports(name: str) -> None:
    importlib.import_module(f"benchmarks.{name}")


@pytest.mark.parametrize("item", ["lock", "permit", "waiter", "record"])
def test_the_server_cost_items_run(r: Any, item: str) -> None:
    from benchmarks.server_cost import ITEMS, _item_ops

    assert item in ITEMS
    _item_ops(r, item, 2)


def test_the_capacity_record_sizing_runs(r: Any) -> None:
    from benchmarks.capacity import idempotency_records

    assert idempotency_records(r, 2, 16) > 0
