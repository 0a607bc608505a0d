"""``manage.py redislocks list|clear|doctor``: see and force-release held locks,
and check the Redis they live on.

``list`` shows one row per held lock, per semaphore with live permits and per
held read-write lock, with a line for each reader (``--format json`` for
scripts: one object, versioned by ``schema``), and with ``--summary`` first
one line per template: how many are held, the longest held, the waiters, the
busiest names. Each holder shows when it was last renewed and its id; each
name's first waiters (``--waiters N``) follow the table, oldest first.
``clear`` force-releases named locks, those matching ``--pattern``, or
``--all``, after confirmation on a terminal unless ``--noinput``; without a
terminal it refuses (exit 2) rather than wait for an answer nobody can type.
``--dry-run`` only shows what would go. ``clear NAME --holder ID`` releases
only the holders of NAME with those ids (one permit of a semaphore). A name
asked for that is not held is reported and makes the command exit 1, and so
does declining.

``doctor`` reads the server's eviction policy, persistence, replicas,
version, latency and clock, and says what docs/guarantees.rst asks of each
(``ops/doctor.py``); it exits 1 when something breaks a promise.

Output to a pipe closed early (``list | head``) ends the command quietly with
the status a Unix tool killed by SIGPIPE reports, 141, without a traceback.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from redis.exceptions import RedisError

from ...connection import get_client
from ...core import (
    KINDS,
    WAITERS_SHOWN,
    HeldLock,
    RedisClient,
    RedisUnavailable,
    force_release,
    iso_time,
    list_locks,
    select_shown,
    summarize,
)
from ...locking.factories import keyspace
from ...ops.command_process import (
    accept_common_options,
    closed_pipe,
    common_options,
    operator,
    server_time,
)
from ...ops.display import (
    describe,
    owner_text,
    quoted,
    render_summary,
    render_table,
    render_waiters,
)
from ...ops.doctor import PROBLEM, WARN, examine, render

# The version of ``list --format json``'s shape: raised whenever a key is
# renamed or removed, or its meaning changes (added keys keep it).
JSON_SCHEMA = 1

# ``clear`` refused for want of a terminal to confirm on (a usage error);
# declining, or a name not held, is 1.
NO_TERMINAL_STATUS = 2


def has_terminal() -> bool:
    """Whether someone can answer the confirmation: stdin is a terminal."""
    stdin = sys.stdin
    return stdin is not None and not stdin.closed and stdin.isatty()


class Command(BaseCommand):
    help = "List held Redis locks and semaphores, or force-release them."

    def add_arguments(self, parser: CommandParser) -> None:
        common = common_options(parser)
        sub = parser.add_subparsers(dest="action", required=True, metavar="{list,clear,doctor}")
        ls = sub.add_parser("list", help="Show held locks and semaphores.")
        accept_common_options(ls, common)
        self._selection(ls)
        ls.add_argument(
            "--format",
            choices=("table", "json"),
            default="table",
            help="table (people, the default) or json (scripts: one object, "
            '{"schema": 1, "read_at": ..., "locks": [...], "summary": [...]}).',
        )
        ls.add_argument(
            "--waiters",
            type=int,
            default=WAITERS_SHOWN,
            metavar="N",
            help=f"List each name's first N waiters, oldest first (default {WAITERS_SHOWN}; "
            "0: only count them); the rest are counted.",
        )
        ls.add_argument(
            "--summary",
            action="store_true",
            help="First one line per template (held, longest held, waiters, busiest names). "
            "JSON always carries the summary.",
        )
        cl = sub.add_parser("clear", help="Force-release locks and semaphores.")
        accept_common_options(cl, common)
        cl.add_argument("names", nargs="*", metavar="NAME", help="Exact names to release.")
        self._selection(cl)
        cl.add_argument("--all", action="store_true", help="Release everything held.")
        cl.add_argument(
            "--holder",
            action="append",
            default=[],
            metavar="ID",
            help="Release only this holder (a semaphore's permit, a reader) of the NAME "
            "given: its ID as `list` shows it. Repeat for several. A holder that came "
            "since has another ID and is never released.",
        )
        cl.add_argument(
            "--dry-run", action="store_true", help="Show what would be released; change nothing."
        )
        cl.add_argument(
            "--noinput",
            "--no-input",
            action="store_false",
            dest="interactive",
            help="Do not ask for confirmation (needed where no terminal can answer: "
            "cron, CI, ssh without -t).",
        )
        dr = sub.add_parser(
            "doctor",
            help="Check the Redis the locks use: eviction, persistence, replicas, version, "
            "latency, clock.",
        )
        accept_common_options(dr, common)
        dr.add_argument(
            "--cache",
            metavar="ALIAS",
            help="CACHES alias of the Redis to check (default: REDISLOCK['CACHE']).",
        )

    @staticmethod
    def _selection(parser: CommandParser) -> None:
        parser.add_argument(
            "--pattern",
            metavar="GLOB",
            help="Only names matching this shell glob (* ? [abc]; [*] is a literal *).",
        )
        parser.add_argument(
            "--literal",
            action="store_true",
            help="Take --pattern as an exact name, with no wildcards.",
        )
        parser.add_argument(
            "--kind", choices=KINDS, help="Only locks, semaphores or rwlocks (default: all)."
        )
        parser.add_argument(
            "--cache",
            metavar="ALIAS",
            help="CACHES alias of the Redis to inspect (default: REDISLOCK['CACHE']).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "doctor":
            try:
                self._doctor(get_client(options["cache"]))
                self.stdout.flush()
            except (RedisUnavailable, RedisError) as exc:
                raise CommandError(f"Redis is unavailable: {exc}") from exc
            except BrokenPipeError:
                closed_pipe()
            return
        if options["literal"] and options["pattern"] is None:
            raise CommandError("--literal needs --pattern: it says how to read the pattern.")
        kinds = (options["kind"],) if options["kind"] else KINDS
        try:
            client = get_client(options["cache"])
            if options["action"] == "list":
                self._list(client, kinds, options)
            else:
                self._clear(client, kinds, options)
            # Written out here, not at exit: a reader gone early is met inside
            # the command, where it can be answered quietly.
            self.stdout.flush()
        except RedisUnavailable as exc:
            raise CommandError(f"Redis is unavailable: {exc}") from exc
        except BrokenPipeError:
            closed_pipe()

    def execute(self, *args: Any, **options: Any) -> Any:
        try:
            return super().execute(*args, **options)
        except BrokenPipeError:
            # Raised while Django wrote or flushed what the command returned.
            closed_pipe()

    def _list(self, client: RedisClient, kinds: tuple[str, ...], options: dict[str, Any]) -> None:
        if options["waiters"] < 0:
            raise CommandError("--waiters must be 0 or more.")
        rows = list_locks(
            client,
            keyspace(),
            options["pattern"],
            options["literal"],
            kinds=kinds,
            waiters=options["waiters"],
        )
        summary = options["summary"]
        if options["format"] == "json":
            # One shape whatever the options: scripts read the same keys always.
            data = {
                "schema": JSON_SCHEMA,
                # The server's clock at the read (the latest row's, if several
                # were read); every age and lease is counted from it.
                "read_at": iso_time(max((row.read_at or 0 for row in rows), default=None)),
                "locks": [row.as_dict() for row in rows],
                "summary": [s.as_dict() for s in summarize(rows)],
            }
            if data["read_at"] is None:
                data["read_at"] = iso_time(server_time(client))
            # ASCII escapes keep any name exact, whatever the terminal's encoding.
            self.stdout.write(json.dumps(data, indent=2))
            return
        if not rows:
            self.stdout.write("No locks held.")
            return
        if summary:
            for line in render_summary(summarize(rows)):
                self.stdout.write(line)
            self.stdout.write("")
        for line in render_table(rows):
            self.stdout.write(line)
        waiting = render_waiters(rows)
        if waiting:
            self.stdout.write("")
            self.stdout.write("Waiting, oldest first:")
            for line in waiting:
                self.stdout.write(line)

    def _clear(self, client: RedisClient, kinds: tuple[str, ...], options: dict[str, Any]) -> None:
        names, pattern, everything = options["names"], options["pattern"], options["all"]
        if options["holder"] and (pattern is not None or everything):
            raise CommandError("--holder goes with one NAME, not with --pattern or --all.")
        if sum((bool(names), pattern is not None, everything)) != 1:
            raise CommandError(
                "Say what to release: NAME [NAME ...], or --pattern GLOB, or --all "
                "(exactly one of them)."
            )
        ks = keyspace()
        try:
            rows, missing = select_shown(
                client,
                ks,
                names=names,
                pattern=pattern,
                literal=options["literal"],
                all=everything,
                kinds=kinds,
            )
        except ValueError as exc:  # an empty name, for one
            raise CommandError(str(exc)) from exc
        gone: list[str] = []
        if options["holder"]:
            rows, gone = self._holders(rows, names, options["holder"])
        for name in missing:
            self.stderr.write(f"Not held: {quoted(name)}.")
        for ident in gone:
            self.stderr.write(
                f"Not held: holder {ident} of {quoted(names[0])} (released or expired since "
                "it was listed, or never one of its holders)."
            )
        # A holder asked for by its ID and gone counts as a name not held.
        missing = [*missing, *gone]
        if not rows:
            if not missing:
                self.stdout.write("Nothing to release.")
            self._fail(missing, [])
            return
        if options["dry_run"]:
            for row in rows:
                self.stdout.write(f"Would release {describe(row)}.")
            self._fail(missing, [])
            return
        if options["interactive"]:
            if not has_terminal():
                raise CommandError(
                    "No terminal to confirm on (stdin is not a terminal), so nothing was "
                    "released. Run it from a terminal, or pass --no-input to release "
                    "without asking; --dry-run shows what would go.",
                    returncode=NO_TERMINAL_STATUS,
                )
            if not self._confirm(rows):
                self.stdout.write("Nothing released.")
                raise CommandError("Declined: nothing was released.")
        result = force_release(client, ks, rows, by=operator())
        for row in result.released:
            self.stdout.write(f"Released {describe(row)}.")
            if options["holder"]:
                # Which holders went, by the ids they were asked for by.
                for h in row.holders:
                    self.stdout.write(f"  holder {h.ident}: {owner_text(h)}")
        for row in result.changed:
            self.stderr.write(
                f"Not released: {row.kind} {quoted(row.name)} changed hands or was released "
                "after it was read; run the command again to see its new holder."
            )
        self._fail(missing, result.changed)

    @staticmethod
    def _holders(
        rows: list[HeldLock], names: list[str], idents: list[str]
    ) -> tuple[list[HeldLock], list[str]]:
        """Only the holders named by ``--holder`` (their IDs as listed) of
        the one NAME given, and the IDs that hold it no more."""
        if len(names) != 1:
            raise CommandError("--holder needs exactly one NAME: the one whose holders it names.")
        wanted = set(idents)
        kept = [row.only(wanted) for row in rows]
        found = {h.ident for row in kept if row is not None for h in row.holders}
        gone = list(dict.fromkeys(ident for ident in idents if ident not in found))
        return [row for row in kept if row is not None], gone

    def _doctor(self, client: RedisClient) -> None:
        examined = examine(client)
        for line in render(examined):
            self.stdout.write(line)
        levels = [f.level for _, findings in examined for f in findings]
        problems, warnings = levels.count(PROBLEM), levels.count(WARN)
        self.stdout.write(f"{problems} problem(s), {warnings} warning(s).")
        if problems:
            raise CommandError(
                f"{problems} problem(s): Redis does not keep what docs/guarantees.rst asks; "
                "each line says the fix."
            )

    def _confirm(self, rows: list[HeldLock]) -> bool:
        self.stdout.write("These will be force-released:")
        for row in rows:
            self.stdout.write(f"  {describe(row)}")
        self.stdout.write(
            "Waiters are woken at once; each former holder finds out at its next extend or release."
        )
        self.stdout.flush()
        try:
            answer = input("Type 'yes' to continue, or 'no' to cancel: ")
        except EOFError:  # the terminal closed (Ctrl-D): no answer is no
            self.stdout.write("")
            return False
        return answer.strip().lower() == "yes"

    @staticmethod
    def _fail(missing: list[str], changed: list[HeldLock]) -> None:
        problems = []
        if missing:
            problems.append(f"{len(missing)} not held")
        if changed:
            problems.append(f"{len(changed)} changed hands")
        if problems:
            raise CommandError(
                "Not everything asked for was released: " + ", ".join(problems) + "."
            )
