"""Granting an ``Ask``: the one path every grant of the app takes, in a line or not.

The entry point says what it asks for (``db.line.Ask``: which rows, for whom, how long) and how
it makes its grant of a granted row (``Make``: a ``Lease``, an rwlock's ``ReadLease``, an
election's adopted lease). Who asks, as the line sees it (``Turn``: a place, or a newcomer),
is the line's business: a wait in line hands its entry point a ``Grantor`` for each attempt,
which grants as the attempt's turn; outside a line (``newcomer``) as a newcomer. No entry
point sees a turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from resource_lease.db.line import NEWCOMER, Ask, Turn
from resource_lease.db.operations import ops
from resource_lease.keeper import keeper
from resource_lease.line.places import Line

T = TypeVar("T")

#: How an entry point makes its grant (a ``Lease``) of a row granted for an ``Ask`` (or handed
#: to its place: ``line.handoff``), and when the grant was sent by this machine's monotonic
#: clock; None if it arrived dead.
Make = Callable[[Ask, Sequence[Any], float], T | None]

#: Grants an ``Ask`` (one attempt); the grant, made by its entry point, or None.
Grantor = Callable[[Ask], T | None]


def grant(alias: str, ask: Ask, turn: Turn, make: Make[T]) -> T | None:
    """One attempt at the ``ask`` as ``turn``, its grant made by ``make``; None if nothing
        could be granted this time. Refused while the process gives back what it holds, which
    waits for a grant under way to be made (``Keeper.taking``)."""
    engine = ops(alias)
    with keeper().taking("grants"):
        for tries_left in (1, 0):
            sent_at = time.monotonic()
            row, settled = engine.grant(ask, turn)
            if row is None and settled and tries_left:
                # Settled: nothing was granted. Most often the statement never reached the
                # server (a session it had dropped: idle timeout, restart); run it once more
                # on the new connection, or a single attempt would report free resources as
                # none.
                continue
            break
        if row is None:
            return None
        return make(ask, row, sent_at)


def grantor(line: Line, turn: Turn, make: Make[T]) -> Grantor[T]:
    """Grants as ``turn`` in ``line``: an ask in another line (a session's wait for its bound
    resource that falls back to any of the pool) as a newcomer there."""

    def granting(ask: Ask) -> T | None:
        mine = ask.kind == line.kind and ask.line_name == line.name
        return grant(line.alias, ask, turn if mine else NEWCOMER, make)

    return granting


def newcomer(alias: str, make: Make[T]) -> Grantor[T]:
    """Grants as a newcomer: outside any line (``timeout=0``, a holder's lock step, one attempt
    at a named row), every live waiter of the row's line is ahead."""
    return lambda ask: grant(alias, ask, NEWCOMER, make)


__all__ = ["Grantor", "Make", "grant", "grantor", "newcomer"]
