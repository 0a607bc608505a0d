"""Testing unique Celery tasks with the redislock_unique_tasks fixture.

The task is the test app's (tests/testapp/tasks.py); in your project, import
your own.
"""

from __future__ import annotations

from tests.testapp.tasks import send_receipt


def test_a_receipt_is_sent_once_per_order(redislock_unique_tasks):
    # No broker: the task runs here, at once, and returns its EagerResult.
    first = send_receipt.delay(order_id=7)
    assert first.get() == "receipt 7 sent"

    # Its key is kept a day after its success (unique_keep_for): a second
    # delay() is refused and handed the first task.
    assert send_receipt.delay(order_id=7).id == first.id

    # When the test ends the fixture lets the key go: the leftovers check
    # (redislock_check_leftovers) finds nothing, and the next test starts free.
