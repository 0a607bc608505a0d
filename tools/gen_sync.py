"""Make the sync lock drivers from their asyncio source.

The asyncio drivers in ``django_redislock/core/drivers`` are the source; the sync
drivers are generated from them and committed, so that every protocol
decision is written once. The transformation maps names only:

* ``async def``, ``async with`` and ``async for`` lose ``async``; ``await``
  is dropped;
* ``__aenter__``/``__aexit__`` become ``__enter__``/``__exit__``;
* names in ``RENAMES`` are replaced (``AsyncLock`` by ``Lock``,
  ``_async_prims`` by ``_sync_prims``...), in code, and as whole words in
  docstrings and comments.

What threads and tasks do differently is in ``core/drivers/_async_prims.py`` and
``core/drivers/_sync_prims.py`` (and, for ``core/io``, ``interrupts_async.py``,
``_calls_prims_async.py``, ``giveback_async.py`` and ``_wakeup_prims_async.py``
and their sync namesakes), which export the same names: never in a generated
file.
The result goes through ``ruff`` (import order, then format), so that it
reads like the rest of the code.

Before it maps a source, the generator refuses what would carry asyncio's
meaning into sync code (``docs/internals.rst``, "Interrupts"):

* naming ``asyncio`` at all: a cancellation is ``Cancelled``, an asyncio
  timeout ``CallTimeout``, and so on, from the primitives, whose sync twins
  say what they mean for threads;
* a handler of ``BaseException`` (or a bare ``except:``) that does not end by
  raising what it caught, unchanged, or that can leave any other way: in the
  sync twin it would catch a signal's ``KeyboardInterrupt`` or ``SystemExit``;
* ``BaseException`` anywhere but in such a handler or an annotation (a
  ``suppress(BaseException)``, say).

Usage::

    python tools/gen_sync.py            # write the sync drivers
    python tools/gen_sync.py --check    # exit 1 if any would change

Standard library only, plus the ``ruff`` command the lint run installs.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import io
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = Path("django_redislock/core/drivers")
IO = Path("django_redislock/core/io")

# asyncio source -> generated sync driver, relative to the repository root.
PAIRS = [
    (CORE / "handle_async.py", CORE / "handle.py"),
    (CORE / "lock_async.py", CORE / "lock.py"),
    (CORE / "semaphore_async.py", CORE / "semaphore.py"),
    (CORE / "rwlock_async.py", CORE / "rwlock.py"),
    (CORE / "multi_async.py", CORE / "multi.py"),
    (CORE / "unique_async.py", CORE / "unique.py"),
    (CORE / "records_async.py", CORE / "records.py"),
    (IO / "calls_async.py", IO / "calls.py"),
    (IO / "wakeups_sharded_async.py", IO / "wakeups_sharded.py"),
]

RENAMES = {
    # The primitives: same names, the sync meaning.
    "_async_prims": "_sync_prims",
    # Modules.
    "handle_async": "handle",
    "lock_async": "lock",
    "semaphore_async": "semaphore",
    "rwlock_async": "rwlock",
    "multi_async": "multi",
    "unique_async": "unique",
    "records_async": "records",
    "wakeups_async": "wakeups",
    "interrupts_async": "interrupts",
    # Classes.
    "AsyncHandle": "SyncHandle",
    "AsyncHeldInBlock": "HeldInBlock",
    "AsyncLock": "Lock",
    "AsyncSemaphore": "Semaphore",
    "AsyncReadWriteLock": "ReadWriteLock",
    "AsyncMultiLock": "MultiLock",
    "AsyncRedisClient": "RedisClient",
    # Functions: the async twin is ``x_async``, a factory ``get_async_x``.
    "get_async_notifier": "get_notifier",
    "run_async": "run",
    "call_async": "call",
    "run_acked_async": "run_acked",
    "submit_async": "submit",
    "clear_semaphore_async": "clear_semaphore",
    "clear_rw_lock_async": "clear_rw_lock",
    "release_permit_async": "release_permit",
    "note_task_async": "note_task",
    "read_task_async": "read_task",
    "read_record_async": "read_record",
    "write_record_async": "write_record",
    "forget_record_async": "forget_record",
    "clear_holders_async": "clear_holders",
    # The protocols.
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
    "StopAsyncIteration": "StopIteration",
    # The bounded calls (core/io): the module, its primitives, the give-back.
    "calls_async": "calls",
    "_calls_prims_async": "_calls_prims",
    "giveback_async": "giveback",
    "cluster_call_async": "cluster_call",
    "refresh_slots_async": "refresh_slots",
    "_moved_since_async": "_moved_since",
    "_call_on_node_async": "_call_on_node",
    "_on_node_async": "_on_node",
    "make_ready_async": "make_ready",
    "follow_moved_async": "follow_moved",
    "pause_async": "pause",
    "_sent_async": "_sent",
    "_resent_async": "_resent",
    "call_on_pool_async": "call_on_pool",
    "guarded_async": "guarded",
    "_on_pool_async": "_on_pool",
    "exchange_async": "exchange",
    "checkout_async": "checkout",
    "give_back_async": "give_back",
    "disconnect_async": "disconnect",
    "drain_async": "drain",
    # Wake-ups on a Cluster (core/io): a node's listener is a task or a thread.
    "_wakeup_prims_async": "_wakeup_prims",
    "wakeups_sharded_async": "wakeups_sharded",
    "AsyncShardedNotifier": "ShardedNotifier",
    "_AsyncNodeListener": "_NodeListener",
    "AsyncNotifier": "Notifier",
    "AsyncWakeup": "Wakeup",
}

_WORD = re.compile(r"\b(" + "|".join(sorted(RENAMES, key=len, reverse=True)) + r")\b")
# Tokens whose text is prose: renamed word by word.
_PROSE = {tokenize.STRING, tokenize.COMMENT}
_FSTRING_MIDDLE = getattr(tokenize, "FSTRING_MIDDLE", None)
if _FSTRING_MIDDLE is not None:
    _PROSE.add(_FSTRING_MIDDLE)


class Refused(ValueError):
    """An asyncio source that would not mean the same once made sync."""


def _catches_base(handler: ast.ExceptHandler) -> bool:
    kinds = handler.type
    if kinds is None:
        return True  # a bare ``except:``
    names = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
    return any(isinstance(n, ast.Name) and n.id == "BaseException" for n in names)


def _leaves_otherwise(body: list[ast.stmt]) -> ast.stmt | None:
    """A statement of ``body`` (outside nested functions) that could leave a
    handler other than by its final bare ``raise``."""
    todo: list[ast.AST] = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, (ast.Return, ast.Break, ast.Continue)) or (
            isinstance(node, ast.Raise) and node.exc is not None
        ):
            return node  # type: ignore[return-value]
        todo.extend(ast.iter_child_nodes(node))
    return None


def _annotations(tree: ast.AST) -> set[int]:
    """The ids of every node inside an annotation or an ``except`` clause's type."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        roots: list[ast.AST | None] = []
        if isinstance(node, (ast.AnnAssign, ast.arg)):
            roots.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            roots.append(node.returns)
        elif isinstance(node, ast.ExceptHandler):
            roots.append(node.type)
        for root in roots:
            if root is not None:
                inside.update(id(n) for n in ast.walk(root))
    return inside


def check_source(text: str, name: str) -> None:
    """Refuse an asyncio source whose sync twin would catch an interrupt, or
    would need asyncio (see the module's docstring). Raises ``Refused``."""
    tree = ast.parse(text)
    allowed = _annotations(tree)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Name) and node.id == "asyncio":
            raise Refused(
                f"{name} line {line}: names asyncio; take the construct from the "
                "primitives (Cancelled, CallTimeout, complete, Gate...), whose sync twin "
                "says what it means for threads"
            )
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
            alias.name.split(".")[0] == "asyncio" for alias in node.names
        ):
            raise Refused(f"{name} line {line}: imports asyncio; use the primitives")
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "asyncio":
            raise Refused(f"{name} line {line}: imports from asyncio; use the primitives")
        if isinstance(node, ast.Name) and node.id == "BaseException" and id(node) not in allowed:
            raise Refused(
                f"{name} line {line}: BaseException outside an except clause or an "
                "annotation: in sync code it would hold back KeyboardInterrupt and SystemExit"
            )
        if isinstance(node, ast.ExceptHandler) and _catches_base(node):
            last = node.body[-1]
            reraises = isinstance(last, ast.Raise) and last.exc is None
            if not reraises or _leaves_otherwise(node.body[:-1]) is not None:
                raise Refused(
                    f"{name} line {line}: a handler of BaseException must end by raising "
                    "what it caught, unchanged (a bare raise), and leave no other way: in the "
                    "sync twin it catches a signal's KeyboardInterrupt or SystemExit. Catch "
                    "Exception for failures, Cancelled for asyncio's cancellation"
                )


def header(source: Path) -> str:
    return f"# generated from {source.name} by tools/gen_sync.py; do not edit\n"


def unasync(text: str) -> str:
    """The sync twin of asyncio source ``text``, before formatting."""
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def offset(pos: tuple[int, int]) -> int:
        return starts[pos[0] - 1] + pos[1]

    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    edits: list[tuple[int, int, str]] = []
    for i, tok in enumerate(tokens):
        start, end = offset(tok.start), offset(tok.end)
        if tok.type == tokenize.NAME and tok.string in ("async", "await"):
            following = tokens[i + 1]
            if tok.string == "async" and following.string not in ("def", "with", "for"):
                raise ValueError(f"line {tok.start[0]}: 'async' before {following.string!r}")
            # The keyword and the space after it, to the next token on its line.
            if following.start[0] == tok.end[0]:
                end = offset(following.start)
            edits.append((start, end, ""))
        elif tok.type == tokenize.NAME and tok.string in RENAMES:
            edits.append((start, end, RENAMES[tok.string]))
        elif tok.type in _PROSE and _WORD.search(tok.string):
            if text[start:end] != tok.string:
                raise ValueError(f"line {tok.start[0]}: cannot place {tok.string!r}")
            edits.append((start, end, _WORD.sub(lambda m: RENAMES[m.group(1)], tok.string)))
    out = text
    for start, end, new in reversed(edits):
        out = out[:start] + new + out[end:]
    return out


def _ruff() -> list[str]:
    try:
        import ruff  # noqa: F401  (only to find it beside this interpreter)
    except ImportError:
        found = shutil.which("ruff")
        if found is None:
            sys.exit("gen_sync: needs ruff (pip install ruff), to format what it writes")
        return [found]
    return [sys.executable, "-m", "ruff"]


def _through_ruff(code: str, target: Path) -> str:
    ruff = _ruff()
    for args in (["check", "--fix", "--select", "I", "--quiet"], ["format"]):
        done = subprocess.run(
            [*ruff, *args, "--stdin-filename", str(target), "-"],
            input=code,
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )
        if done.returncode != 0:
            sys.exit(f"gen_sync: ruff {args[0]} failed on {target}:\n{done.stderr}")
        code = done.stdout
    return code


def generate(source: Path, target: Path) -> str:
    text = (ROOT / source).read_text(encoding="utf-8")
    try:
        check_source(text, str(source))
    except Refused as exc:
        sys.exit(f"gen_sync: {exc}")
    return _through_ruff(header(source) + unasync(text), target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a file would change"
    )
    args = parser.parse_args(argv)
    stale = []
    for source, target in PAIRS:
        wanted = generate(source, target)
        path = ROOT / target
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current == wanted:
            continue
        stale.append(target)
        if args.check:
            sys.stdout.writelines(
                difflib.unified_diff(
                    current.splitlines(keepends=True),
                    wanted.splitlines(keepends=True),
                    f"{target} (committed)",
                    f"{target} (generated from {source.name})",
                )
            )
        else:
            path.write_text(wanted, encoding="utf-8")
            print(f"wrote {target}")
    if args.check and stale:
        names = ", ".join(str(t) for t in stale)
        print(f"\n{names}: not what tools/gen_sync.py makes; run it and commit the result")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
