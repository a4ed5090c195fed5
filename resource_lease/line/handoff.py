"""Taking a grant a release handed to a place (PostgreSQL's RELEASE, ``LineStatements.hands_off``).

A waiter first in line whose place takes hand-offs (``Wait.make`` is given, so its place has
a token) may be granted the row by the release itself, in the release's own statement: the
row is then held under the place's token, and the release tells the waiter's process what it
granted (its NOTIFY). The waiter takes it here (``claim``): as the release described it, with
nothing to read, while at least HANDED_UNREAD_MIN of its ttl is left counted from when the
place was taken (the grant lasts its ttl from after that); else it reads the grant by its
token (``CLAIM_HANDED``), whose answer says how long it has left. The entry point makes its
lease of the row (``Wait.make``): the line does the claiming, and no recipe sees it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, TypeVar

from resource_lease.db.line import Ask
from resource_lease.db.operations import ops
from resource_lease.keeper import keeper
from resource_lease.line.counters import stats
from resource_lease.line.granting import Make
from resource_lease.line.places import Place

T = TypeVar("T")

#: The least share of its ttl a grant handed to a place must have left, by the waiter's
#: clock from when it sent ENTER_LINE, for the waiter to take it as the release described it;
#: after a longer wait in line it reads the grant (``CLAIM_HANDED``), whose answer says how
#: long the grant has left.
HANDED_UNREAD_MIN = 0.5


def claim(place: Place, make: Make[T], *, ttl: float, holder: str, row: int = 0, grant: Any = None) -> T | None:
    """The grant a release handed to ``place`` (``row``: the row the release named, 0: not
    known; ``grant``: what it said it granted, or None), made by ``make``; None if there is
    none (the place had expired, or its grant ran out)."""
    engine = ops(place.line.alias)
    with keeper().taking("grants"):
        told = _as_told(engine, place, grant, ttl=ttl, holder=holder)
        if told is not None:
            # Granted by a release, which said what (its NOTIFY): the grant lasts at least ttl
            # from when this waiter sent ENTER_LINE (RELEASE, db/postgresql.py), nothing to read.
            stats.handed_unread += 1
            return make(Ask(place.line.kind, holder, ttl), told, place.entered_at)
        sent_at = time.monotonic()
        claimed = engine.line.claim_handed(place.line.kind, token=place.token, pk=row)
        if claimed is None:
            return None
        values, left = claimed
        # Granted by a release this waiter never saw: its local deadline counts from this read,
        # with the seconds the database said were left (as if sent that much earlier).
        return make(Ask(place.line.kind, holder, ttl), values, sent_at - max(0.0, ttl - left))


def _as_told(engine: Any, place: Place, grant: Any, *, ttl: float, holder: str) -> Sequence[Any] | None:
    """The row as the release's NOTIFY described it, if the waiter may take it without reading
    it: at least HANDED_UNREAD_MIN of its ttl left counted from when the place was taken."""
    if not grant or place.entered_at + ttl - time.monotonic() < HANDED_UNREAD_MIN * ttl:
        return None
    row: Sequence[Any] | None = engine.dialect.line.handed_row(grant, holder=holder, token=place.token)
    return row


__all__ = ["HANDED_UNREAD_MIN", "claim"]
