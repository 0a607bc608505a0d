"""Plain helpers that several test modules share (fixtures live in conftest.py)."""

from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from django_redislock import get_lock

if TYPE_CHECKING:
    from django_redislock.core.drivers.lock import Lock

ROOT = Path(__file__).resolve().parents[1]


def flowing(text: str) -> str:
    """``text`` with every run of white space made one space: a claim in the
    docs is found however its paragraph is wrapped."""
    return " ".join(text.split())


def module_from_file(name: str, path: Path) -> ModuleType:
    """The Python file at ``path``, not on any import path, run as module
    ``name`` (registered in ``sys.modules``, where dataclasses look it up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@functools.cache
def gen_sync() -> Any:
    """``tools/gen_sync.py``, the generator of the sync twins, as a module."""
    return module_from_file("gen_sync", ROOT / "tools" / "gen_sync.py")


def is_free(name: str) -> bool:
    """Whether a caller that tries once gets the lock ``name`` (and gives it back)."""
    lock = get_lock(name, wait=0)
    if lock.acquire():
        lock.release()
        return True
    return False


def end_process(proc: subprocess.Popen[Any], *, grace: float = 15, kill_wait: float = 10) -> None:
    """Terminate ``proc`` if it still runs; kill it if it is not gone ``grace`` seconds later."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(kill_wait)


def start_waiter(
    waiter: Lock, queued: Callable[[], bool]
) -> tuple[threading.Thread, threading.Event]:
    """Run ``waiter.acquire()`` in a thread (released at once if it gets the lock) and
    return when ``queued()`` says it waits: the thread, and an event set if it got the lock."""
    got = threading.Event()

    def wait() -> None:
        if waiter.acquire():
            got.set()
            waiter.release()

    t = threading.Thread(target=wait)
    t.start()
    deadline = time.monotonic() + 10
    while not queued():
        assert time.monotonic() < deadline, "the waiter never queued"
        time.sleep(0.01)
    return t, got


def start_project(where: Path, *, timeout: float) -> None:
    """``django-admin startproject mysite`` into the new folder ``where``."""
    where.mkdir()
    subprocess.run(
        [sys.executable, "-m", "django", "startproject", "mysite", str(where)],
        check=True,
        capture_output=True,
        timeout=timeout,
    )


def run_python(*args: str, env: dict[str, str], timeout: float) -> str:
    """Run ``python *args`` from the checkout's root; its output, once it exited 0
    (else the test fails with the end of its error output)."""
    done = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
