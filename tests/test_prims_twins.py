"""The sync primitives offer every name the asyncio ones do: the generated sync
drivers import from one module where their asyncio source imports from the other."""

from django_redislock.core.drivers import _async_prims, _sync_prims


def test_the_sync_primitives_have_every_asyncio_name() -> None:
    assert [name for name in _async_prims.__all__ if not hasattr(_sync_prims, name)] == []
