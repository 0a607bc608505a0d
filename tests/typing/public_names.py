"""What a type checker sees of the names a project imports from the package.

Not a test module: the lint run checks it with mypy
(``mypy --no-implicit-reexport tests/typing/public_names.py``), and every
``assert_type`` that does not hold, or a name that comes out as ``Any``, fails
that run. The names are loaded lazily at run time, so only ``TYPE_CHECKING``
declarations in ``django_redislock/__init__.py`` give them these types.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import assert_type

    from django_redislock import (
        AsyncLock,
        Lock,
        Semaphore,
        StaleFence,
        get_lock,
        get_semaphore,
    )

    def the_factories_return_the_handles() -> None:
        assert_type(get_lock("order:1"), Lock)
        assert_type(get_semaphore("reports", 2), Semaphore)

    def the_exception_is_a_class(error: StaleFence, lock: AsyncLock) -> None:
        assert_type(error, StaleFence)
        assert_type(lock, AsyncLock)
