"""The line of waiters' statements (``resource_lease.line``), a part of every ``Dialect``.

``Turn`` is who asks for a grant as the line sees it (the place in line, or a newcomer); every
grant statement takes its parameters (``statements.LINE_CLEAR``). ``LineStatements`` holds the
statements of the places themselves (take, keep, leave, look) and the ``where=`` filters as
each vendor compares them (docs/pitfalls.md#json-compared).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from resource_lease.db import statements


@dataclass(frozen=True)
class Turn:
    """Who asks for a grant, as the line of waiters sees it: the caller's place in line (its
    id and priority), or a newcomer (place 0, which no place has: every live waiter of the
    line is ahead of it). See ``statements.LINE_CLEAR``."""

    place: int = 0
    priority: int = 0
    #: The caller's ``lock_delay`` (seconds): the grant writes it on the row (GRANT_SET); a
    #: grant of it that expires unreleased keeps the row from every grant this long after.
    lock_delay: float = 0.0
    #: A newcomer that will take a place if this try fails: it tries the UNMARKED form only
    #: (see ``forms``).
    will_wait: bool = False
    #: Rows the caller's look has just seen free (``Look.free_ids``): a grant in the line form
    #: that would read some free rows first (MySQL's ``acquire_in_line``) tries these instead.
    candidates: tuple[int, ...] = ()
    #: What the caller will use the row for (``acquire(target=...)``): a row cooling down for
    #: it is not granted (OWN_TARGET). '' for none.
    target: str = ""

    def trying(self, candidates: tuple[int, ...]) -> Turn:
        """This turn, with the rows its look saw free to try first."""
        return self if candidates == self.candidates else replace(self, candidates=candidates)

    def with_delay(self, lock_delay: float) -> Turn:
        """This turn, asking for ``lock_delay`` on its grant."""
        return self if lock_delay == self.lock_delay else replace(self, lock_delay=lock_delay)

    def aiming(self, target: str | None) -> Turn:
        """This turn, for a row not cooling down for ``target`` (None: any)."""
        return self if (target or "") == self.target else replace(self, target=target or "")

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
class Place:
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


def key_paths(key: str) -> dict[str, str]:
    """The JSON paths of ``key`` for the vendors that look a key up as its document spells
    it (MySQL/MariaDB, SQLite: the stored text, escapes and all): ``pa`` as Python (Django's
    JSONField, ``json.dumps``) writes it, non-ASCII and control characters escaped
    (``\\u00e9``), and ``pu`` as writers that keep UTF-8 write it (``é``). A key found under
    neither is missing (docs/pitfalls.md#json-compared). ``check_where`` refuses the quote and
    backslash a path cannot carry."""
    return {
        "pa": '$."' + json.dumps(key)[1:-1] + '"',
        "pu": '$."' + json.dumps(key, ensure_ascii=False)[1:-1] + '"',
    }


#: Whether a waiter's grant that left its place (``leaving``) found the place there, by
#: (alias, place): if not, a release may have handed the place a row a moment before, which
#: its waiter gives back as it leaves (``line.Waiting.cleanup``, which takes the entry out).
left_by_grant: dict[tuple[str, int], bool] = {}


class LineStatements:
    """The line's statements; ``Dialect`` supplies the rendered SQL and the vendor's pieces."""

    #: How a ``where=`` value's type is named by the vendor's JSON functions (``encode_where``):
    #: for str, int, True, False, None.
    where_types: Mapping[str, str] = {}
    sql: dict[str, str]
    forms: dict[tuple[bool, bool, bool], dict[str, str]]
    alias: str
    placeholder: str

    def ttl_param(self, ttl: float) -> Any:
        raise NotImplementedError

    def to_datetime(self, value: Any) -> dt.datetime:
        raise NotImplementedError

    def returning_row(
        self, cursor: Any, sql: str, params: Sequence[Any], *, read_params: Sequence[Any] = ()
    ) -> Sequence[Any] | None:
        raise NotImplementedError

    def matches_sql(self, where: str, data: str) -> str:
        """An SQL condition, never NULL: the JSON ``data`` has every key of the filter
        ``where`` (JSON text, as ``encode_where`` wrote it: [{"k": key, "t": type, "s":
        text}, ...]) with a value of the same type and text."""
        raise NotImplementedError

    def encode_where(self, where: Mapping[str, Any]) -> str:
        """A checked ``where=`` filter (keys: str; values: str, int, bool or None) as the JSON
        text ``matches_sql`` compares: each key with its value's type as this vendor's JSON
        functions name it, and its text (booleans and null: their type says it all)."""
        entries = []
        for key, value in sorted(where.items()):
            if value is None:
                kind, text = "null", ""
            elif value is True or value is False:
                kind, text = str(value).lower(), str(value).lower()
            elif isinstance(value, int):
                kind, text = "int", str(value)
            else:
                kind, text = "str", value
            entries.append({"k": key, "t": self.where_types[kind], "s": text, **key_paths(key)})
        return json.dumps(entries)

    def statement(self, name: str, where: str | None, *, in_line: bool = True, target: str = "") -> str:
        """The statement ``name`` in its line form or not (``Turn.forms``), and with the
        caller's ``where=`` filter and ``target`` if any."""
        return self.forms[in_line, where is not None, bool(target)][name]

    @staticmethod
    def own(where: str | None, target: str = "") -> tuple[Any, ...]:
        """The parameters of ``{own_filter}{own_target}``: the caller's encoded ``where=`` and
        its target, those it has."""
        return (() if where is None else (where,)) + ((target,) if target else ())

    #: The grant statements in the line form that also leave the caller's place in line,
    #: where the vendor can in one statement (PostgreSQL: ``LEAVING_LINE``), by (name,
    #: filtered, targeted): the waiter's leaving after it (``LEAVE_LINE``) then deletes
    #: nothing, and commits no write of its own. Elsewhere empty: the place is left after the grant.
    leaving: dict[tuple[str, bool, bool], str] = {}

    #: Whether a release hands its row to the head of its line in its own statement
    #: (PostgreSQL's RELEASE), to a waiter that takes hand-offs (``enter_line``'s
    #: ``grant_ttl``), which then reads its grant (``claim_handed``). Elsewhere the waiter
    #: runs its own grant.
    hands_off = False

    def release_to_line(self, cursor: Any, *, pk: int, holder: str, fence: int) -> tuple[bool, int]:
        """``Dialect.release``, and the place in line the row was handed to in the same
        statement (``hands_off`` vendors), or 0."""
        return self.release(cursor, pk=pk, holder=holder, fence=fence), 0  # type: ignore[attr-defined]

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

    def grant_row(
        self,
        cursor: Any,
        name: str,
        params: Sequence[Any],
        *,
        turn: Turn,
        where: str | None,
        in_line: bool,
        read_params: Sequence[Any] = (),
    ) -> Sequence[Any] | None:
        """Run the grant statement ``name`` in its form (``Turn.forms``); a waiter's grant in
        the line form leaves its place in the same statement where the vendor can
        (``leaving``)."""
        leaving = self.leaving.get((name, where is not None, bool(turn.target))) if in_line and turn.place else None
        if leaving is not None:
            row = self.returning_row(cursor, leaving, (*params, turn.place), read_params=read_params)
            if row is None:
                return None
            left_by_grant[self.alias, turn.place] = bool(row[-1])
            return tuple(row[:-1])
        sql = self.statement(name, where, in_line=in_line, target=turn.target)
        return self.returning_row(cursor, sql, params, read_params=read_params)

    @staticmethod
    def grant_params(holder: str, token: str, ttl_param: Any, turn: Turn) -> tuple[Any, ...]:
        """GRANT_SET's parameters: the holder, the token, the ttl, the caller's lock delay."""
        return (holder, token, ttl_param, float(turn.lock_delay))

    @staticmethod
    def grantable(kind: str, turn: Turn, where: str | None, line: str = "", *, in_line: bool = True) -> tuple[Any, ...]:
        """GRANTABLE's parameters: the kind, the caller's turn in the line ``line`` (the line
        form only), its filter and its target."""
        params = (kind, *turn.line_params(line, kind)) if in_line else (kind,)
        return (*params, *LineStatements.own(where, turn.target))

    # -- the line of waiters -----------------------------------------------------------

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
        row = self.returning_row(
            cursor,
            self.sql["ENTER_LINE"],
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
                self.ttl_param(ttl),
            ),
            read_params=(token,),
        )
        if row is None:
            raise RuntimeError("taking a place in line inserted no row")
        return int(row[0])

    def purge_line(self, cursor: Any, *, kind: str, name: str) -> None:
        """Drop the expired places of the line (their waiters died or were paused): they no
        longer count, they only take room."""
        cursor.execute(self.sql["PURGE_LINE"], (kind, name))

    def purge_lines(self, cursor: Any) -> int:
        """Drop every line's expired places; how many."""
        cursor.execute(self.sql["PURGE_LINES"])
        return int(cursor.rowcount or 0)

    def find_place(self, cursor: Any, *, token: str) -> int | None:
        """The place taken under ``token``, if that insert committed (settles a lost answer)."""
        cursor.execute(self.sql["FIND_PLACE"], (token,))
        rows = cursor.fetchall()
        return int(rows[0][0]) if rows else None

    def mark_line(self, cursor: Any, *, kind: str, name: str, where: str | None, ttl: float) -> None:
        """Mark the rows a waiter of the line (kind, name) may wait for, so that until the mark
        ends a newcomer's grant of them checks the line (MARK_LINE). Before a place is taken
        or kept: the mark outlasts it."""
        marked, at_least = self.ttl_param(2 * ttl), self.ttl_param(1.5 * ttl)
        if name:
            cursor.execute(self.sql["MARK_NAMED"], (marked, kind, name, at_least))
        else:
            cursor.execute(self.statement("MARK_LINE", where), (marked, kind, at_least, *self.own(where)))

    def renew_place(
        self, cursor: Any, *, kind: str, name: str, where: str | None, place: int, ttl: float, mark: bool = True
    ) -> bool:
        """Keep a live place for ``ttl`` more seconds, and then (``mark``) its line's rows
        marked (``mark_line``); False if it had expired (it is lost: nothing is written)."""
        cursor.execute(self.sql["RENEW_PLACE"], (self.ttl_param(ttl), place))
        if cursor.rowcount != 1:
            return False
        if mark:
            self.mark_line(cursor, kind=kind, name=name, where=where, ttl=ttl)
        return True

    def leave_line(self, cursor: Any, *, place: int) -> bool:
        """Leave the line; whether the place was there to delete."""
        cursor.execute(self.sql["LEAVE_LINE"], (place,))
        return bool(cursor.rowcount == 1)

    def pass_turn(self, cursor: Any, *, kind: str, name: str) -> None:
        """Tell the first waiters of the line (kind, name) that it may be their turn, as a
        release does (PostgreSQL: ``PASS_TURN``; elsewhere the waiters look, and this is a
        no-op): a turn told to a waiter that did not take it."""
        if "PASS_TURN" in self.sql:
            cursor.execute(self.sql["PASS_TURN"], (kind, name))
            cursor.fetchall()

    def line_waiters(self, cursor: Any, *, kind: str, name: str, limit: int) -> list[Place]:
        """The first ``limit`` live places of the line (kind, name), in the order of service."""
        cursor.execute(statements.fill(self.sql["LINE_WAITERS"], limit=str(int(limit))), (kind, name))
        return [
            Place(int(pk), holder, int(priority), self.to_datetime(since), self.to_datetime(expires))
            for pk, holder, priority, since, expires in cursor.fetchall()
        ]

    #: Free rows a waiter's look counts at most: as many as a grant counts (LINE_CLEAR).
    LOOK_LIMIT = statements.LINE_ROOM

    def look(self, cursor: Any, *, kind: str, name: str, turn: Turn, where: str | None, shared: bool = False) -> Look:
        """A waiter's look at its line (``Look``): reads only, by primary key and indexes.
        ``shared``: a reader of an rwlock (only writers ahead count; free: open to readers)."""
        me, prio = turn.place, turn.priority
        if name:
            sql = self.sql["LOOK_READ" if shared else "LOOK_NAMED"]
            params: tuple[Any, ...] = (me, kind, name, me, prio, prio, me, kind, name, kind, name)
        else:
            sql = statements.fill(self.statement("LOOK_ANY", where, target=turn.target), limit=str(self.LOOK_LIMIT))
            ahead = (kind, me, prio, prio, me)
            params = (me, *ahead, *ahead, kind, *self.own(where, turn.target), kind, turn.target, kind)
        cursor.execute(sql, params)
        live, ahead_n, filtered, free, next_at, now, cooled_at = cursor.fetchall()[0]
        # A count, or (LOOK_FREE listing them) the free rows' ids, comma-separated, or NULL.
        ids = tuple(int(pk) for pk in free.split(",")) if isinstance(free, str) else ()
        return Look(
            live=bool(live),
            ahead=int(ahead_n),
            filtered=int(filtered),
            free=len(ids) if free is None or isinstance(free, str) else int(free),
            next_free_at=None if next_at is None else self.to_datetime(next_at),
            now=self.to_datetime(now),
            free_ids=ids,
            cooled_at=None if cooled_at is None else self.to_datetime(cooled_at),
        )
