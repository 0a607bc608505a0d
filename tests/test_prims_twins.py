"""The sync primitives offer every name the asyncio ones do: the generated sync
code imports from one module where its asyncio source imports from the other."""

import importlib
import importlib.util
from pathlib import Path

import pytest

from django_redislock.core.drivers import _async_prims, _sync_prims

ROOT = Path(__file__).resolve().parent.parent


def test_the_sync_primitives_have_every_asyncio_name() -> None:
    assert [name for name in _async_prims.__all__ if not hasattr(_sync_prims, name)] == []


def _renames() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("gen_sync", ROOT / "tools/gen_sync.py")
    assert spec is not None and spec.loader is not None
    gen_sync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_sync)
    return dict(gen_sync.RENAMES)


@pytest.mark.parametrize(
    "source", ["_calls_prims_async", "_wakeup_prims_async", "giveback_async", "interrupts_async"]
)
def test_each_io_primitives_module_has_a_sync_namesake_with_every_name(source: str) -> None:
    """``tools/gen_sync.py`` maps the module, and each of its names, to the sync one's."""
    renames = _renames()
    sync = importlib.import_module(f"django_redislock.core.io.{renames[source]}")
    asyncio_side = importlib.import_module(f"django_redislock.core.io.{source}")
    missing = [name for name in asyncio_side.__all__ if not hasattr(sync, renames.get(name, name))]
    assert missing == []
