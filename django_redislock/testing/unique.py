"""Unique tasks in a project's tests: ``local_unique_tasks``."""

from __future__ import annotations

from typing import Any

from .settings import Block

__all__ = ["let_go_of_unique_keys", "local_unique_tasks"]


def let_go_of_unique_keys() -> None:
    """Free every key a unique task took in this process since the block
    began and still holds (compared by token: another's is left alone)."""
    from ..tasks import local
    from ..tasks.claims import let_go

    for claim in local.here.taken():
        let_go(claim.name, claim.token, claim.fence, claim.alias, "the test ended")


class local_unique_tasks(Block):  # noqa: N801 - used like a function
    """Run unique tasks in the test's process, and leave none of their keys behind.

    Inside the block a unique task takes its key when it is enqueued, and a
    duplicate is refused, exactly as in production; only where the task goes
    differs:

    * a Celery ``UniqueTask`` (``delay``, ``apply_async``) is not sent to a
      broker: it runs at once, in the calling thread, as Celery's eager mode
      runs a task, and the call returns its ``EagerResult``
      (``task_eager_propagates`` says whether its exception reaches the
      caller). Its run adopts the key and lets it go, or keeps it
      (``unique_keep_for``), as a worker's run would;
    * a Django ``unique_task`` goes to the backend your settings name: the
      immediate backend runs it at once, the dummy backend keeps it queued.

    When the block ends, every key a unique task took inside it and still
    holds (a task that never ran, a key kept after a successful run) is let
    go, so ``assert_no_locks_left`` finds none of them and the next test
    starts free. A context manager and a decorator, as ``redislock_settings``;
    the pytest fixture is ``redislock_unique_tasks``.
    """

    def __enter__(self) -> None:
        from ..tasks import local

        local.here.start()

    def __exit__(self, *exc_info: Any) -> None:
        from ..tasks import local

        try:
            let_go_of_unique_keys()
        finally:
            local.here.stop()
