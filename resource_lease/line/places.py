"""Places in line and the marks on the line's rows: taking a place (``enter``), the process's
memory of its marks, purging expired places, and looking at a line (``look``, ``waiters``)."""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass

from resource_lease import renewal
from resource_lease.conf import lease_settings
from resource_lease.db.line import Look, Turn, WaiterRow
from resource_lease.db.operations import ops
from resource_lease.exceptions import LeaseLost
from resource_lease.forking import at_fork
from resource_lease.keeper import keeper
from resource_lease.line.counters import stats
from resource_lease.line.wakeups import Waker, board, turn_channel

logger = logging.getLogger("resource_lease")


@dataclass(frozen=True)
class Line:
    """A line of waiters: any row of ``kind`` (``name`` ''), or the one row ``(kind, name)``."""

    alias: str
    kind: str
    name: str = ""
    # Every line's waiters mark its rows (``Resource.line_until``, docs/waiting.md#marks): a
    # newcomer's first try may then skip the line's subquery, and a release knows that a
    # waiter may be in line, so it wakes the next one (PostgreSQL's RELEASE tells turns only
    # on a marked row). An rwlock's grants check its line anyway (``RW_READ``, ``RW_WRITE``),
    # but its release needs the mark all the same: without it its waiters slept through every
    # release until their LINE_POLL_MAX look (tests/test_liveness.py).

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}" if self.name else self.kind


class Place:
    """A waiter's place in line, leased like a grant: the process's background renewal keeps
    it (``renewal.Renewer``) until the waiter leaves; a renewal that finds it expired (the
    waiter was paused past its ttl) marks it lost, and the waiter takes a new place at the back."""

    def __init__(
        self,
        line: Line,
        place: int,
        *,
        priority: int,
        where: str | None,
        ttl: float,
        sent_at: float,
        waker: Waker,
        marked_at: float | None = None,
        token: str = "",
    ) -> None:
        self.line = line
        self.id = place
        self.where = where
        self.priority = priority
        self.ttl = ttl
        #: A release may hand this place a row in its own statement, held under ``token``
        #: (``LineStatements.hands_off``): a place found gone may have been served.
        self.token = token
        self.turn = Turn(place, priority)
        #: When (monotonic) its waiter sent the ENTER_LINE that took it: a grant a release
        #: hands it lasts at least its ttl from then (RELEASE, ``line.handoff``).
        self.entered_at = sent_at
        self.lost = False
        #: Found gone by its renewal, handed a row or expired (``mark_gone``).
        self.gone = False
        #: A grant with this place is being tried (``Waiting.steps``): on PostgreSQL a grant
        #: deletes its place as it commits (``LineStatements.leaving``), so a renewal meanwhile that
        #: finds it gone does not know yet whether it was served or had expired.
        self.attempting = False
        self._gone_while_attempting = False
        self._waker = waker
        self._deadline = sent_at + ttl
        # When the line's rows were last marked for this place: as it was taken, or (a mark
        # of this process's that is recent enough, ``fresh_mark``) before.
        self._marked_at = sent_at if marked_at is None else marked_at

    def __repr__(self) -> str:
        return f"<Place {self.id} in line {self.line}{' lost' if self.lost else ''}>"

    #: A mark lasts at least 1.5 ttl from when it is written (MARK_LINE) and a renewal keeps the
    #: place one ttl from then: a renewal marks again once 0.4 ttl have passed since this
    #: place's last mark (every other renewal at the default RENEW_FRACTION), so the mark it
    #: wrote always outlasts the place.
    MARK_AGAIN = 0.4

    def renew(self) -> None:
        sent_at = time.monotonic()
        line = self.line
        mark = sent_at - self._marked_at >= self.MARK_AGAIN * self.ttl
        kept = ops(line.alias).line.renew_place(
            self.id, kind=line.kind, name=line.name, where=self.where, ttl=self.ttl, mark=mark
        )
        stats.renewals += 1
        if not kept:
            if self.attempting:
                self._gone_while_attempting = True  # judged once the attempt ends (``attempted``)
            elif self.token:
                self.mark_gone()  # handed a row, or expired: its waiter reads which
            else:
                self.mark_lost("the place expired before its renewal (the waiter was paused past its ttl)")
            raise LeaseLost(f"{self!r} is gone")
        self._deadline = sent_at + self.ttl
        if mark:
            self._marked_at = sent_at
            note_mark(line, self.where, sent_at, self.ttl)

    def remaining(self) -> float:
        return max(0.0, self._deadline - time.monotonic())

    def attempted(self, granted: bool) -> None:
        """A grant with this place has been tried (``attempting``): not granted, a renewal
        meanwhile that found the place gone had found it expired."""
        self.attempting = False
        gone, self._gone_while_attempting = self._gone_while_attempting, False
        if gone and not granted:
            if self.token:
                self.mark_gone()  # or handed a row meanwhile: its waiter reads which
            else:
                self.mark_lost("the place expired before its renewal (the waiter was paused past its ttl)")

    def mark_lost(self, reason: str) -> None:
        if not self.lost:
            self.lost = True
            logger.info("%r lost: %s; taking a place at the back", self, reason)
            self._waker.wake()

    def mark_gone(self) -> None:
        """Found gone, by a renewal, where a release may have handed it a row: its waiter
        reads its grant, and only if there is none takes a place at the back (``gone``)."""
        self.gone = True
        self._waker.wake()

    def renew_in_background(self) -> float | None:
        interval = self.ttl * float(lease_settings.RENEW_FRACTION)
        step = renewal.renew_once(self, interval=interval)
        return interval if step.renewed else step.retry_in


@dataclass(frozen=True)
class Mark:
    """A mark this process's waiters wrote on every row of a line (``MARK_LINE`` without a
    ``where=``, ``MARK_NAMED``): sent at ``at`` (monotonic) for a place of ``ttl`` seconds.
    Marks only go up, and each lasts at least 1.5 ttl from when it was written."""

    at: float
    ttl: float

    @property
    def until(self) -> float:
        """Until when every row the line had then is surely marked (this machine's clock)."""
        return self.at + 1.5 * self.ttl


#: The last mark of each line written by this process (``note_mark``).
_marks: dict[Line, Mark] = {}


def note_mark(line: Line, where: str | None, sent_at: float, ttl: float) -> None:
    """A waiter of ``line`` marked its rows (the statement was sent at ``sent_at``); a
    waiter with a ``where=`` of its own marked only the rows it matches, which says nothing
    of the line's other rows."""
    if where is None and (line not in _marks or _marks[line].until < sent_at + 1.5 * ttl):
        _marks[line] = Mark(sent_at, ttl)


def marked_now(line: Line) -> bool:
    """Whether every row of ``line`` is surely marked now, by this process's own last mark
    (rows added since aside): the UNMARKED try of a newcomer would be refused."""
    mark = _marks.get(line)
    return mark is not None and time.monotonic() < mark.until


def fresh_mark(line: Line, where: str | None, ttl: float, now: float) -> float | None:
    """When this process last marked ``line``, if a place of ``ttl`` taken now need not mark it
    again: the same ttl, and less than ``Place.MARK_AGAIN`` x ttl ago, exactly as a place that
    marked then and renews now would not (so the mark outlasts the place the same way)."""
    mark = _marks.get(line)
    if where is None and mark is not None and mark.ttl == ttl and now - mark.at < Place.MARK_AGAIN * ttl:
        return mark.at
    return None


def enter(
    line: Line,
    *,
    holder: str,
    priority: int,
    where: str | None,
    ttl: float,
    waker: Waker,
    target: str = "",
    shared: bool = False,
    handoff: bool = False,
) -> Place:
    """Take a place at the back of ``line`` (``target``: rows cooling down for it do not serve
    it; ``shared``: as a reader of an rwlock; ``handoff``: one that a release may hand a grant
    of ``ttl`` seconds, where the database can); its renewal starts at once."""
    # Refused once the process gives back what it holds, which waits until the place is
    # registered with the keeper, or its giving back would miss it (``Keeper.taking``).
    with keeper().taking("places in line"):
        _purge_now_and_then(line)
        sent_at = time.monotonic()
        marked_at = fresh_mark(line, where, ttl, sent_at)
        mark = marked_at is None
        engine = ops(line.alias)
        token = secrets.token_hex(16) if handoff and engine.dialect.line.hands_off else ""
        place = engine.line.enter_line(
            line.kind,
            line.name,
            holder=holder,
            priority=priority,
            where=where,
            ttl=ttl,
            target=target,
            shared=shared,
            mark=mark,
            channel=turn_channel(line.alias),
            grant_ttl=ttl if token else 0.0,
            token=token or None,
        )
        stats.entered += 1
        if mark:
            note_mark(line, where, sent_at, ttl)
        else:
            stats.marks_skipped += 1
        entered = Place(
            line,
            place,
            priority=priority,
            where=where,
            ttl=ttl,
            sent_at=sent_at,
            waker=waker,
            marked_at=marked_at,
            token=token,
        )
        board().add_place(line.alias, place, waker)
        renewal.renewer().add(entered)
        return entered


#: Seconds between two purges of a line's expired places by this process.
PURGE_EVERY = 10.0
#: Seconds between two purges of every line's expired places by this process (a line nobody
#: enters again is purged so).
PURGE_ALL_EVERY = 60.0
_purged: dict[Line, float] = {}
_purged_all: dict[str, float] = {}


def _purge_now_and_then(line: Line) -> None:
    """Drop the line's expired places (dead or paused waiters), at most every PURGE_EVERY
    seconds per line and process, and every line's at most every PURGE_ALL_EVERY seconds per
    alias and process: they never count, so this only keeps the table small."""
    now = time.monotonic()
    if now - _purged_all.get(line.alias, -PURGE_ALL_EVERY) >= PURGE_ALL_EVERY:
        _purged_all[line.alias] = _purged[line] = now
        ops(line.alias).line.purge_lines()
        return
    if now - _purged.get(line, -PURGE_EVERY) < PURGE_EVERY:
        return
    _purged[line] = now
    ops(line.alias).line.purge_line(line.kind, line.name)


def look(place: Place, where: str | None, shared: bool = False, target: str = "") -> Look:
    stats.looks += 1
    return ops(place.line.alias).line.look(
        place.line.kind, place.line.name, turn=place.turn, where=where, target=target, shared=shared
    )


def waiters(line: Line, limit: int = 10) -> list[WaiterRow]:
    """The first ``limit`` live places of ``line``, in the order they will be served."""
    return ops(line.alias).line.line_waiters(line.kind, line.name, limit=limit)


def forget_lines() -> None:
    """Forget what this process remembers of its lines (its last marks, its purges): in a
    forked child (the parent's waits are not the child's), and in tests once the rows it
    marked are gone (a remembered mark would skip a newcomer's first try on new rows)."""
    _purged.clear()
    _purged_all.clear()
    _marks.clear()


at_fork(after_in_child=forget_lines)
