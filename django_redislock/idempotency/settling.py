"""How an attempt inside transactions ends in Redis: stored at the commit, freed at a rollback.

A response is stored only once every transaction open around its view has
committed (``ATOMIC_REQUESTS``, or a transaction the caller opened): an
``on_commit`` hook per database. Django has no hook for a rollback, but it
drops the commit hooks of a transaction (or a savepoint) that rolls back, or
of a connection that closes, the moment it does. Each hook here is a small
object referenced by nothing but Django's list, with a finaliser: dropped
without having run, it frees the key (the attempt's marker is removed), so
that a retry runs the view whose writes were undone. Without it the marker
would stay, and the key would answer "outcome unknown" until it expired.
(``locking/deferred.py`` releases a lock the same way.)
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable

from django.db import connections

from ..locking.deferred import run_first

__all__ = ["settle_at_commit"]

logger = logging.getLogger("django_redislock.idempotency")


class _Outcome:
    """Once every alias has committed: ``store``; at the first one dropped: ``forget``."""

    def __init__(
        self, aliases: Iterable[str], store: Callable[[], None], forget: Callable[[], None]
    ) -> None:
        self.waiting = set(aliases)
        self.store, self.forget = store, forget
        self.settled = False

    def committed(self, alias: str) -> None:
        self.waiting.discard(alias)
        if not self.waiting and not self.settled:
            self.settled = True
            self.store()

    def dropped(self) -> None:
        if self.settled:
            return
        self.settled = True
        try:
            self.forget()
        except Exception:  # a finaliser's exception would only reach stderr
            logger.exception("could not free an idempotency key after a rollback")


class _Hook:
    """One alias's commit hook. It holds nothing that leads back to itself, so
    it dies with Django's list (see the module docstring)."""

    __slots__ = ("alias", "outcome", "ran", "__weakref__")

    def __init__(self, outcome: _Outcome, alias: str) -> None:
        self.outcome, self.alias = outcome, alias
        ran = self.ran = [False]
        weakref.finalize(self, _unless_ran, ran, outcome).atexit = False

    def __call__(self) -> None:  # the commit
        self.ran[0] = True
        self.outcome.committed(self.alias)


def _unless_ran(ran: list[bool], outcome: _Outcome) -> None:
    if not ran[0]:
        outcome.dropped()


def settle_at_commit(
    aliases: list[str], store: Callable[[], None], forget: Callable[[], None]
) -> None:
    """``store()`` once every transaction of ``aliases`` has committed;
    ``forget()`` as soon as one of them rolls back instead."""
    outcome = _Outcome(aliases, store, forget)
    for alias in aliases:
        conn, hook = connections[alias], _Hook(outcome, alias)
        conn.on_commit(hook, robust=True)
        # First in the list: a hook before it that raised would end the commit's
        # hooks there, and this one, dropped unrun, would free a key whose work stands.
        run_first(conn, hook)
