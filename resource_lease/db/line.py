"""The line of waiters' statements (``resource_lease.line``), a part of every ``Dialect``.

``Turn`` is who asks for a grant as the line sees it (the place in line, or a newcomer); every
grant statement takes its parameters (``statements.LINE_CLEAR``). ``LineStatements`` holds the
statements of the places themselves (take, keep, leave, look) and the ``where=`` filters as
each vendor compares them (docs/pitfalls.md#json-compared).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from resource_lease.db import statements
from resource_lease.db.answers import Answer

if TYPE_CHECKING:
    from resource_lease.db.base import Dialect


#: ``Ask.rows``: which rows an ask is for.
ANY, BY_ID, BY_NAME, READ, WRITE = "any", "id", "name", "read", "write"
ROWS = (ANY, BY_ID, BY_NAME, READ, WRITE)


@dataclass(frozen=True)
class Ask:
    """What a caller asks to be granted, one value built once by its entry point: rows of
    ``kind`` (which of them: the statement says, ``ops(using).grant_any`` and its kin), for
    ``holder``, for ``ttl`` seconds; a ``where=`` filter (``where``, and ``where_sql`` as the
    dialect encoded it, once); the ``target`` the row is for ('' for none: a row cooling down
    for it is not granted, OWN_TARGET); the ``lock_delay`` its grant writes on the row
    (GRANT_SET: a grant that expires unreleased keeps the row from every grant this long
    after). Who asks, as the line sees it, is its ``Turn``."""

    kind: str
    holder: str
    ttl: float
    where: Mapping[str, Any] | None = None
    where_sql: str | None = None
    target: str = ""
    lock_delay: float = 0.0
    #: Which rows: ``ANY`` free row of the kind (the pool's acquire), the row ``pk``
    #: (``BY_ID``: the holder's lock step, a session's bound resource), the row ``name``
    #: (``BY_NAME``: locks, elections, members), an rwlock's row ``name`` to ``READ`` or
    #: ``WRITE``.
    rows: str = "any"
    pk: int = 0
    name: str = ""
    #: ``BY_ID``: the line the caller waits in ('' the kind's; a session's bound row: its name).
    line: str = ""

    def __post_init__(self) -> None:
        if self.rows not in ROWS:
            raise ValueError(f"Ask.rows must be one of {', '.join(ROWS)}, got {self.rows!r}")

    @property
    def line_name(self) -> str:
        """The line this ask waits in ('' for any row of the kind; else a row's own line)."""
        return self.line if self.rows in (ANY, BY_ID) else self.name


@dataclass(frozen=True)
class Turn:
    """Who asks for a grant, as the line of waiters sees it: the caller's place in line (its
    id and priority), or a newcomer (place 0, which no place has: every live waiter of the
    line is ahead of it). See ``statements.LINE_CLEAR``."""

    place: int = 0
    priority: int = 0
    #: A newcomer that will take a place if this try fails: it tries the UNMARKED form only
    #: (see ``forms``).
    will_wait: bool = False
    #: Rows the caller's look has just seen free (``Look.free_ids``): a grant in the line form
    #: that would read some free rows first (MySQL's ``acquire_in_line``) tries these instead.
    candidates: tuple[int, ...] = ()

    def trying(self, candidates: tuple[int, ...]) -> Turn:
        """This turn, with the rows its look saw free to try first."""
        return self if candidates == self.candidates else replace(self, candidates=candidates)

    def params(self, line_name: str) -> tuple[Any, ...]:
        """Who is ahead of this turn in the line ``line_name`` ('' for any row of the kind):
        the parameters of RW_READ_CLEAR, and the first of LINE_CLEAR's (``line_params``)."""
        return (line_name, self.place, self.priority, self.priority, self.place, self.place)

    def line_params(self, line_name: str, kind: str) -> tuple[Any, ...]:
        """LINE_CLEAR's parameters for a row of ``kind`` in the line ``line_name``: who is
        ahead, then the room the line has for this turn (its free rows, if it has a place)."""
        return (*self.params(line_name), line_name, self.place, kind)

    @property
    def forms(self) -> tuple[bool, ...]:
        """The forms of a grant to try, in order (``in_line``: the line form, LINE_CLEAR). A
        newcomer first tries the form that only asks whether a waiter marked the row
        (UNMARKED: no subquery, the uncontended grant's cost), then, if that granted nothing,
        the line form, which may find the marks stale or the waiters not interested; a waiter
        in line always checks the line. A newcomer that will wait (``ARRIVING``) leaves the
        line form to its first try in line: under contention the line form would only be
        refused (3 statements on MySQL, for nothing), and where the marks are stale it is
        served at its first look from its place."""
        if self.place:
            return (True,)
        return (False,) if self.will_wait else (False, True)


#: A caller with no place in line (``timeout=0``, or a grant that does not wait).
NEWCOMER = Turn()
#: The first try of a caller that waits if it is not granted at once (``line.Waiting``).
ARRIVING = Turn(will_wait=True)


@dataclass(frozen=True)
class WaiterRow:
    """A live place in a line, as ``Dialect.line_waiters`` reads it."""

    id: int
    holder: str
    priority: int
    since: dt.datetime
    expires_at: dt.datetime


@dataclass(frozen=True)
class Look:
    """A waiter's look at its line (``Dialect.look``): whether its place is still live, how
    many live waiters are ahead of it (``filtered``: how many of those have a ``where=`` or a
    target of their own), how many rows it could take are free (up to a few), when the first
    held row of the line expires (None: none held), the database's clock, and when the first
    cooldown of its target on a row of the line ends (None: none, or no target)."""

    live: bool
    ahead: int
    filtered: int
    free: int
    next_free_at: dt.datetime | None
    now: dt.datetime
    #: Which rows were free, where the look lists them (MySQL: ``LOOK_FREE``); else empty.
    free_ids: tuple[int, ...] = ()
    cooled_at: dt.datetime | None = None


def own(where: str | None, target: str = "") -> tuple[Any, ...]:
    """The parameters of ``{own_filter}{own_target}``: the caller's encoded ``where=`` and its
    target, those it has."""
    return (() if where is None else (where,)) + ((target,) if target else ())


#: Whether a waiter's grant that left its place (``leaving``) found the place there, by
#: (alias, place): if not, a release may have handed the place a row a moment before, which
#: its waiter gives back as it leaves (``line.Waiting.cleanup``, which takes the entry out).
left_by_grant: dict[tuple[str, int], bool] = {}


class LineStatements:
    """The line's statements, a part of every ``Dialect`` (``dialect.line``): the places
    themselves (take, keep, leave, look, mark) and a release's hand-off to the head of the line
    (``hands_off`` vendors: ``PostgreSQLLine``)."""

    #: Whether a release hands its row to the head of its line in its own statement
    #: (PostgreSQL's RELEASE), to a waiter that takes hand-offs (``enter_line``'s
    #: ``grant_ttl``), which then reads its grant (``claim_handed``). Elsewhere the waiter
    #: runs its own grant.
    hands_off = False

    def __init__(self, dialect: Dialect) -> None:
        self.d = dialect
        #: The grant statements in the line form that also leave the caller's place in line,
        #: where the vendor can in one statement (PostgreSQL: ``LEAVING_LINE``), by (name,
        #: filtered, targeted): the waiter's leaving after it (``LEAVE_LINE``) then deletes
        #: nothing, and commits no write of its own. Elsewhere empty: the place is left after
        #: the grant.
        self.leaving: dict[tuple[str, bool, bool], str] = {}

    def release_to_line(self, cursor: Any, *, pk: int, holder: str, fence: int) -> tuple[bool, int]:
        """``Dialect.release``, and the place in line the row was handed to in the same
        statement (``hands_off`` vendors), or 0."""
        return self.d.leases.release(cursor, pk=pk, holder=holder, fence=fence), 0

    def handed_row(self, grant: Sequence[Any], *, holder: str, token: str) -> Any:
        """The row a release granted to the place of ``holder`` under ``token``, built from
        what the release told it (``hands_off`` vendors: its NOTIFY), the columns it did not
        say ``DEFERRED``; None if it is not such a grant (the waiter reads it instead)."""
        return None

    def claim_handed(self, cursor: Any, *, kind: str, token: str, pk: int = 0) -> tuple[Any, float] | None:
        """The live grant a release handed to the waiter whose place had ``token`` (the row
        ``pk`` if known, else any of ``kind``), with the seconds it has left by the
        database's clock; None if there is none (nothing was handed, or it ran out)."""
        return None

    def enter_line(
        self,
        cursor: Any,
        *,
        kind: str,
        name: str,
        holder: str,
        priority: int,
        where: str | None,
        token: str,
        ttl: float,
        target: str = "",
        shared: bool = False,
        mark: bool = True,
        channel: str = "",
        grant_ttl: float = 0.0,
    ) -> int:
        """Take a place at the back of the line (kind, name) for ``ttl`` seconds, the line's
        rows marked first if ``mark`` (``mark_line``); its id. ``shared``: a reader of an
        rwlock (served with the readers ahead of it). ``target``: rows cooling down for it do
        not serve the waiter ('' for none). ``channel``: where the waiter's process
        hears its turn (PostgreSQL: ``wakeups.turn_channel``), or ''. ``grant_ttl``: a release
        may hand the waiter its row for this long, under ``token`` (``hands_off`` vendors; 0:
        it takes no hand-off)."""
        if mark:
            self.mark_line(cursor, kind=kind, name=name, where=where, ttl=ttl)
        row = self.d.returning_row(
            cursor,
            self.d.sql["ENTER_LINE"],
            (
                kind,
                name,
                holder,
                priority,
                where,
                target,
                shared,
                token,
                channel,
                float(grant_ttl) if self.hands_off else 0.0,
                self.d.ttl_param(ttl),
            ),
            read_params=(token,),
        )
        if row is None:
            raise RuntimeError("taking a place in line inserted no row")
        return int(row[0])

    def purge_line(self, cursor: Any, *, kind: str, name: str) -> None:
        """Drop the expired places of the line (their waiters died or were paused): they no
        longer count, they only take room."""
        self.d.execute(cursor, "PURGE_LINE", (kind, name))

    def purge_lines(self, cursor: Any) -> int:
        """Drop every line's expired places; how many."""
        return self.d.execute(cursor, "PURGE_LINES", answer=Answer.COUNT)

    def find_place(self, cursor: Any, *, token: str) -> int | None:
        """The place taken under ``token``, if that insert committed (settles a lost answer)."""
        place = self.d.execute(cursor, "FIND_PLACE", (token,), answer=Answer.VALUE)
        return None if place is None else int(place)

    def mark_line(self, cursor: Any, *, kind: str, name: str, where: str | None, ttl: float) -> None:
        """Mark the rows a waiter of the line (kind, name) may wait for, so that until the mark
        ends a newcomer's grant of them checks the line (MARK_LINE). Before a place is taken
        or kept: the mark outlasts it."""
        marked, at_least = self.d.ttl_param(2 * ttl), self.d.ttl_param(1.5 * ttl)
        if name:
            self.d.execute(cursor, "MARK_NAMED", (marked, kind, name, at_least))
        else:
            cursor.execute(self.d.statement("MARK_LINE", where), (marked, kind, at_least, *own(where)))

    def renew_place(
        self, cursor: Any, *, kind: str, name: str, where: str | None, place: int, ttl: float, mark: bool = True
    ) -> bool:
        """Keep a live place for ``ttl`` more seconds, and then (``mark``) its line's rows
        marked (``mark_line``); False if it had expired (it is lost: nothing is written)."""
        if not self.d.execute(cursor, "RENEW_PLACE", (self.d.ttl_param(ttl), place), answer=Answer.CHANGED_ONE):
            return False
        if mark:
            self.mark_line(cursor, kind=kind, name=name, where=where, ttl=ttl)
        return True

    def leave_line(self, cursor: Any, *, place: int) -> bool:
        """Leave the line; whether the place was there to delete."""
        return self.d.execute(cursor, "LEAVE_LINE", (place,), answer=Answer.CHANGED_ONE)

    def pass_turn(self, cursor: Any, *, kind: str, name: str) -> None:
        """Tell the first waiters of the line (kind, name) that it may be their turn, as a
        release does (PostgreSQL: ``PASS_TURN``; elsewhere the waiters look, and this is a
        no-op): a turn told to a waiter that did not take it."""
        if "PASS_TURN" in self.d.sql:
            self.d.execute(cursor, "PASS_TURN", (kind, name), answer=Answer.ROWS)

    def line_waiters(self, cursor: Any, *, kind: str, name: str, limit: int) -> list[WaiterRow]:
        """The first ``limit`` live places of the line (kind, name), in the order of service."""
        cursor.execute(statements.fill(self.d.sql["LINE_WAITERS"], limit=str(int(limit))), (kind, name))
        return [
            WaiterRow(int(pk), holder, int(priority), self.d.to_datetime(since), self.d.to_datetime(expires))
            for pk, holder, priority, since, expires in cursor.fetchall()
        ]

    #: Free rows a waiter's look counts at most: as many as a grant counts (LINE_CLEAR).
    LOOK_LIMIT = statements.LINE_ROOM

    def look(
        self,
        cursor: Any,
        *,
        kind: str,
        name: str,
        turn: Turn,
        where: str | None,
        target: str = "",
        shared: bool = False,
    ) -> Look:
        """A waiter's look at its line (``Look``): reads only, by primary key and indexes.
        ``shared``: a reader of an rwlock (only writers ahead count; free: open to readers)."""
        me, prio = turn.place, turn.priority
        if name:
            sql = self.d.sql["LOOK_READ" if shared else "LOOK_NAMED"]
            params: tuple[Any, ...] = (me, kind, name, me, prio, prio, me, kind, name, kind, name)
        else:
            sql = statements.fill(self.d.statement("LOOK_ANY", where, target=target), limit=str(self.LOOK_LIMIT))
            ahead = (kind, me, prio, prio, me)
            params = (me, *ahead, *ahead, kind, *own(where, target), kind, target, kind)
        self.d.run_repeated(cursor, sql, params)
        live, ahead_n, filtered, free, next_at, now, cooled_at = cursor.fetchall()[0]
        # A count, or (LOOK_FREE listing them) the free rows' ids, comma-separated, or NULL.
        ids = tuple(int(pk) for pk in free.split(",")) if isinstance(free, str) else ()
        return Look(
            live=bool(live),
            ahead=int(ahead_n),
            filtered=int(filtered),
            free=len(ids) if free is None or isinstance(free, str) else int(free),
            next_free_at=None if next_at is None else self.d.to_datetime(next_at),
            now=self.d.to_datetime(now),
            free_ids=ids,
            cooled_at=None if cooled_at is None else self.d.to_datetime(cooled_at),
        )
