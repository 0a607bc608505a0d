"""The test app's unique Celery task, as docs/testing.rst shows it.

No broker is configured: in the tests it runs under ``redislock_unique_tasks``.
"""

from __future__ import annotations

from celery import Celery

from django_redislock.contrib.celery_unique import UniqueTask

app = Celery("testapp", set_as_current=False)


@app.task(base=UniqueTask, unique_key="receipt:{order_id}", unique_keep_for=24 * 3600)
def send_receipt(order_id: int) -> str:
    # Once per order: the key is kept a day after a successful run.
    return f"receipt {order_id} sent"
