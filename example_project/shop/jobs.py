"""Periodic jobs. Run from cron, systemd timers or Celery beat: each must never overlap itself."""

from __future__ import annotations

from django.db import transaction

from django_redislock import redis_lock, redis_locked
from django_redislock.fencing import fenced_update
from shop.models import Product


# wait=0 and on_busy="skip": when the previous run is still going (a slow
# night, a cron that fires every minute), this run returns None at once
# instead of queueing behind it. renew keeps the lease alive however long
# the catalogue takes.
@redis_locked("job:restock", timeout=60, wait=0, on_busy="skip", renew=True)
def restock(level: int) -> int:
    """Top every product up to ``level`` units; returns how many were restocked."""
    restocked = 0
    for pk in Product.objects.filter(stock__lt=level).values_list("pk", flat=True):
        # Purchases write stock too, under the product's own lock: take it, so
        # a purchase in progress cannot write back a stock level read before ours.
        with redis_lock(f"purchase:{pk}") as lock, transaction.atomic():
            restocked += fenced_update(
                Product.objects.filter(pk=pk, stock__lt=level), lock.fence, stock=level
            )
    return restocked
