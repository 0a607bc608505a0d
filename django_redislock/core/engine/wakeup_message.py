"""What a wake-up message says: its shape, written by the scripts, read here.

A script that frees a lock or a permit publishes on the waiter's channel:

* ``<token>``: a permit was reserved for ``token``, or look again;
* ``<token>:<fence>:<round>``: the lease was handed to ``token`` with that
  fence, in answer to the acquire attempt numbered ``round``. A waiter takes
  such a lease as it is only for the attempt it is waiting on (see
  ``protocol.Acquisition.on_wakeup``): a message that was in flight while the
  waiter sent a later attempt says nothing about that attempt.

No I/O: the channels that carry it are ``io/wakeups_base.py``'s and the notifiers'.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["NO_CHANNEL", "Handed", "parse_wakeup"]

# The channel address of a waiter that queued without a wake-up channel: the
# scripts write its lease all the same, and it finds it at its next attempt.
NO_CHANNEL = b"-"


class Handed(NamedTuple):
    """A lease handed to a waiter: its fence, and the attempt it answers."""

    fence: int
    round: int


def parse_wakeup(data: bytes | str) -> tuple[str, Handed | None]:
    """``(token, Handed or None)`` from a wake-up message.

    A message without a round (or with a part that is not a number) hands
    nothing over: the waiter looks again, which is always safe.
    """
    text = data.decode() if isinstance(data, bytes) else str(data)
    token, _, rest = text.partition(":")
    fence, _, round_ = rest.partition(":")
    if fence.isdigit() and round_.isdigit():
        return token, Handed(int(fence), int(round_))
    return token, None
