"""The sync primitives offer every name the asyncio ones do: the generated sync
drivers import from one module where their asyncio source imports from the other."""

from django_redislock.core.drivers import _async_prims, _sync_prims
from django_redislock.core.io import _wakeup_prims, _wakeup_prims_async


def test_the_sync_primitives_have_every_asyncio_name() -> None:
    assert [name for name in _async_prims.__all__ if not hasattr(_sync_prims, name)] == []


def test_the_thread_wakeup_primitives_have_every_asyncio_name() -> None:
    # The Cluster notifier's (wakeups_sharded_async.py and its generated twin).
    names = _wakeup_prims_async.__all__
    assert [name for name in names if not hasattr(_wakeup_prims, name)] == []
