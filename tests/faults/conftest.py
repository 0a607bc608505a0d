from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from .harness import ServerPool, make_rng


@pytest.fixture
def pool() -> Iterator[ServerPool]:
    """Private servers and proxies for one scenario, all stopped afterwards."""
    with ServerPool() as servers:
        yield servers


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    """A seeded RNG; the seed is printed (``-s`` or on failure) for replay."""
    generator, _ = make_rng(request.node.name)
    return generator
