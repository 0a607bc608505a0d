"""The public path of the fencing helpers, as models import them.

``from django_redislock.fencing import FencedQuerySet`` is written in
projects' models (``objects = FencedQuerySet.as_manager()``), so it stays
here; the helpers live in ``locking/fencing.py``. ``fenced_get``,
``fenced_update`` and ``StaleFence`` are also importable from
``django_redislock``.
"""

from .locking.fencing import (
    FencedQuerySet,
    FencedQuerySetMixin,
    StaleFence,
    fenced_get,
    fenced_update,
)

__all__ = ["FencedQuerySet", "FencedQuerySetMixin", "StaleFence", "fenced_get", "fenced_update"]
