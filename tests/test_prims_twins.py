"""The sync primitives offer every name the asyncio ones do: the generated sync
code imports from one module where its asyncio source imports from the other."""

import importlib

import pytest

from django_redislock.core.drivers import _async_prims, _sync_prims
from tests.helpers import gen_sync


def test_the_sync_primitives_have_every_asyncio_name() -> None:
    assert [name for name in _async_prims.__all__ if not hasattr(_sync_prims, name)] == []


@pytest.mark.parametrize(
    "source", ["_calls_prims_async", "_wakeup_prims_async", "giveback_async", "interrupts_async"]
)
def test_each_io_primitives_module_has_a_sync_namesake_with_every_name(source: str) -> None:
    """``tools/gen_sync.py`` maps the module, and each of its names, to the sync one's."""
    renames = dict(gen_sync().RENAMES)
    sync = importlib.import_module(f"django_redislock.core.io.{renames[source]}")
    asyncio_side = importlib.import_module(f"django_redislock.core.io.{source}")
    missing = [name for name in asyncio_side.__all__ if not hasattr(sync, renames.get(name, name))]
    assert missing == []
