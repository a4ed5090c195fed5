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
import threading
import time
from typing import TYPE_CHECKING

from resource_lease import renewal
from resource_lease.db.operations import ops
from resource_lease.exceptions import LeaseDatabaseError
from resource_lease.forking import at_fork
from resource_lease.keeper import keeper
from resource_lease.line.counters import stats
from resource_lease.line.wakeups import after_release, board

if TYPE_CHECKING:
    from resource_lease.line.places import Place

logger = logging.getLogger("resource_lease")

#: Seconds between the keeper's first rounds of leaving the places whose waiters could not
#: (a quarter of the shortest ttl if that is sooner); they back off up to RETRY_MAX.
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
        return ops(place.line.alias).line.leave_line(place.id)
    except LeaseDatabaseError as exc:
        logger.warning("could not leave line %s (the keeper tries again): %s", place.line, exc)
        return None


def leave_at_exit(place: Place) -> bool:
    """Leave the line as the process gives back what it holds; a grant a release handed to
    the place meanwhile is given back too. Whether the place was there to delete."""
    there = leave(place)
    if place.token and not there and give_back_handed(place) is None:
        logger.warning("%r: a grant handed to it may stay held until its ttl", place)
    return bool(there)


def give_back_handed(place: Place, *, retrying: bool = False) -> bool | None:
    """Give back a grant a release handed to ``place`` that its waiter will not take (it
    gave up, or was served by its own grant meanwhile): released as any grant is, so the
    release hands it on. Whether there was one; None if the database could not be told
    (``retry`` it)."""
    engine = ops(place.line.alias)
    try:
        claimed = engine.line.claim_handed(place.line.kind, token=place.token)
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
    """The keeper's job for the places of one database alias whose waiters left while it could
    not be told: delete each, and give back a row a release handed it meanwhile, as soon as
    the database answers; a place is given up once it, and a grant handed to it just before
    it expired, have run out by themselves.

    One job per alias, so that while the database is away each round costs one failed
    statement (a connection attempt that may take its connect timeout, on the keeper's thread,
    which the process's renewals share), not one per place; and the rounds back off, from
    ``RETRY_EVERY`` (or a quarter of the shortest ttl) up to ``RETRY_MAX`` seconds apart."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self._places: list[tuple[Place, float]] = []  # (place, when to give it up)
        self._failed = 0  # rounds in a row in which the database did not answer

    def add(self, place: Place) -> float:
        """Leave ``place`` too; the seconds until the next round."""
        # The place expires one ttl after its last renewal (``remaining``); a row handed to it
        # just before runs out one ttl after that.
        self._places.append((place, time.monotonic() + place.remaining() + place.ttl))
        self._failed = 0
        return self._interval()

    def _interval(self) -> float:
        shortest = min((place.ttl / 4 for place, _ in self._places), default=RETRY_EVERY)
        return min(RETRY_MAX, min(RETRY_EVERY, shortest) * 2**self._failed)

    def keep(self) -> float | None:
        with _lock:
            places = list(self._places)
        for place, until in places:
            if time.monotonic() > until:
                logger.warning("%r: gave up leaving the line: it has run out by itself", place)
            elif not _leave_again(place):
                self._failed += 1  # the database is still away: the others wait for the next round
                break
            else:
                stats.leaves_retried += 1
                logger.info("%r: left the line, now that the database answers", place)
            with _lock:
                self._places.remove((place, until))
        else:
            self._failed = 0
        with _lock:
            if not self._places:
                _leaving.pop(self.alias, None)
                return None
            return self._interval()


def _leave_again(place: Place) -> bool:
    """Delete ``place`` (and give back what a release handed it); whether the database could
    be told."""
    try:
        there = ops(place.line.alias).line.leave_line(place.id)
    except LeaseDatabaseError as exc:
        logger.debug("%r: still cannot leave the line: %s", place, exc)
        return False
    return bool(there) or not place.token or give_back_handed(place, retrying=True) is not None


#: The most seconds between two of the keeper's rounds of leaving, once they back off.
RETRY_MAX = 8.0

# The keeper holds its jobs weakly: each alias's job is held here until it ends.
_leaving: dict[str, Leaving] = {}
_lock = threading.Lock()


def retry(place: Place) -> None:
    """Leave ``place`` (and give back what it was handed) on the keeper's thread, as soon as
    the database answers: its waiter could not."""
    with _lock:
        job = _leaving.get(place.line.alias)
        if job is None:
            job = _leaving[place.line.alias] = Leaving(place.line.alias)
        delay = job.add(place)
    keeper().schedule(job, delay)


def pending() -> int:
    """How many places of this process wait to be left (tests, diagnostics)."""
    with _lock:
        return sum(len(job._places) for job in _leaving.values())


def _after_fork_in_child() -> None:
    global _lock
    _leaving.clear()  # the parent's places are not the child's
    _lock = threading.Lock()


at_fork(after_in_child=_after_fork_in_child)
