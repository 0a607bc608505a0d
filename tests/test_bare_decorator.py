"""A bare ``@redis_locked`` (no key) fails when applied, naming the missing key template."""

from __future__ import annotations

import pytest

import django_redislock
from django_redislock import redis_locked


def _assert_names_the_fix(exc: pytest.ExceptionInfo[TypeError], where: str) -> None:
    message = str(exc.value)
    assert "needs the lock key template" in message
    assert where in message
    assert '@redis_locked("purchase:{product_id}")' in message


def test_bare_on_a_function() -> None:
    with pytest.raises(TypeError) as exc:

        @redis_locked
        def view(request: object) -> None: ...

    _assert_names_the_fix(exc, "view")


def test_bare_on_an_async_function() -> None:
    with pytest.raises(TypeError) as exc:

        @redis_locked
        async def aview(request: object) -> None: ...

    _assert_names_the_fix(exc, "aview")


def test_bare_through_the_package_with_a_comment() -> None:
    with pytest.raises(TypeError) as exc:

        @django_redislock.redis_locked  # the key was forgotten
        def task(n: int) -> None: ...

    _assert_names_the_fix(exc, "task")


def test_bare_on_a_method() -> None:
    with pytest.raises(TypeError) as exc:

        class View:
            @redis_locked
            def post(self, request: object) -> None: ...

    _assert_names_the_fix(exc, "View.post")


def test_bare_on_a_class() -> None:
    with pytest.raises(TypeError) as exc:
        redis_locked(type("Report", (), {}))
    _assert_names_the_fix(exc, "Report")


def test_bare_without_source_is_still_refused_for_async() -> None:
    # Code without a source file (exec) is judged by what the callable is.
    namespace: dict[str, object] = {"redis_locked": redis_locked}
    with pytest.raises(TypeError) as exc:
        exec("@redis_locked\nasync def handler(request): pass\n", namespace)
    _assert_names_the_fix(exc, "handler")


def test_a_named_key_function_is_still_a_key() -> None:
    def doc_key(n: int) -> str:
        return f"doc:{n}"

    names = []

    @redis_locked(doc_key)
    def work(n: int) -> None:
        lock = django_redislock.current_lock()
        assert lock is not None
        names.append(lock.name)

    work(7)
    assert names == ["doc:7"]
