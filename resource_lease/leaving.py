"""Leaving the line: at once as the wait ends, or, if the database could not be told then,
by the process's keeper as soon as it answers again.

A waiter that is served, gives up or is cancelled deletes its place (``LEAVE_LINE``). On
PostgreSQL a release may have handed that place a row a moment before; the waiter then gives
the row back, released as any grant is, so the release hands it on (``give_back_handed``).

If the database cannot be told as the waiter leaves (it is down, or the connection was cut
twice), the place would stay in line until its ttl: on MariaDB and SQLite nobody behind it
is served, and on PostgreSQL a release hands it a row that nobody takes. ``Leaving`` keeps
trying, on the keeper's thread, to delete it and give back what it was handed, until the
place and any grant handed to it have run out anyway; so a database that was away for a
moment costs the line that moment, not the waiter's whole ttl.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

from resource_lease import renewal
from resource_lease.db.operations import ops
from resource_lease.exceptions import LeaseDatabaseError
from resource_lease.keeper import keeper
from resource_lease.line_stats import stats
from resource_lease.wakeups import after_release, board

if TYPE_CHECKING:
    from resource_lease.line import Place

logger = logging.getLogger("resource_lease")

#: The most seconds between two of the keeper's tries to leave a place for a waiter that
#: could not (a place of ttl t is tried every t/4 if that is sooner).
RETRY_EVERY = 1.0


def leave(place: Place, *, gone: bool = False) -> bool | None:
    """Leave the line now; whether the place was there to delete, None if the database could
    not be told (``retry`` it). ``gone``: it was deleted in the commit that served its waiter
    (only this process's bookkeeping is left)."""
    renewal.renewer().discard(place)
    board().remove_place(place.line.alias, place.id)
    if gone:
        return False
    try:
        return ops(place.line.alias).leave_line(place.id)
    except LeaseDatabaseError as exc:
        logger.warning("could not leave line %s (the keeper tries again): %s", place.line, exc)
        return None


def give_back_handed(place: Place, *, retrying: bool = False) -> bool | None:
    """Give back a grant a release handed to ``place`` that its waiter will not take (it
    gave up, or was served by its own grant meanwhile): released as any grant is, so the
    release hands it on. Whether there was one; None if the database could not be told
    (``retry`` it)."""
    engine = ops(place.line.alias)
    try:
        claimed = engine.claim_handed(place.line.kind, token=place.token)
        if claimed is None:
            return False
        resource = engine.dialect.to_resource(claimed[0])
        stats.handed_back += 1
        logger.info("%r: giving back row %s, handed to it as it left the line", place, resource.pk)
        released, handed_to = engine.release_to_line(pk=resource.pk, holder=resource.holder, fence=resource.fence)
    except LeaseDatabaseError as exc:
        log = logger.debug if retrying else logger.warning
        log("%r: could not give back a grant handed to it (the keeper tries again): %s", place, exc)
        return None
    after_release(place.line.alias, resource.kind, resource.name, resource.pk, released=released, handed_to=handed_to)
    return True


class Leaving:
    """The keeper's job for a place its waiter left while the database could not be told:
    delete it, and give back a row a release handed it meanwhile, as soon as the database
    answers; given up once the place, and a grant handed to it just before it expired, have
    run out by themselves."""

    def __init__(self, place: Place) -> None:
        self.place = place
        # The place expires one ttl after its last renewal (``remaining``); a row handed to it
        # just before runs out one ttl after that.
        self.until = time.monotonic() + place.remaining() + place.ttl
        self.every = min(RETRY_EVERY, place.ttl / 4)

    def keep(self) -> float | None:
        place = self.place
        try:
            there = ops(place.line.alias).leave_line(place.id)
        except LeaseDatabaseError as exc:
            there = None
            logger.debug("%r: still cannot leave the line: %s", place, exc)
        if there is not None and not (place.token and not there and give_back_handed(place, retrying=True) is None):
            stats.leaves_retried += 1
            logger.info("%r: left the line, now that the database answers", place)
            _pending.discard(self)
            return None
        if time.monotonic() + self.every > self.until:
            logger.warning("%r: gave up leaving the line: it has run out by itself", place)
            _pending.discard(self)
            return None
        return self.every


# The keeper holds its jobs weakly: these are held here until they end.
_pending: set[Leaving] = set()


def retry(place: Place) -> None:
    """Leave ``place`` (and give back what it was handed) on the keeper's thread, as soon as
    the database answers: its waiter could not."""
    job = Leaving(place)
    _pending.add(job)
    keeper().schedule(job, job.every)


def pending() -> int:
    """How many places of this process wait to be left (tests, diagnostics)."""
    return len(_pending)


os.register_at_fork(after_in_child=_pending.clear)  # the parent's places are not the child's
