"""The grant statements of every ``Dialect``: any free row of a kind (the scan), a sampled row
(the probe), a chosen row (the holder's lock step), a named row (locks, elections, members),
each conditional on the row being free and the caller's turn in its line (``db/line.py``).
A vendor overrides what differs (MySQL's probe and scan, PostgreSQL's probe)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from resource_lease.db import statements
from resource_lease.db.line import NEWCOMER, Turn
from resource_lease.db.rwlock import RwLockStatements

Row = Sequence[Any]


class GrantStatements(RwLockStatements):
    """The grants; ``Dialect`` supplies the rendered SQL and the vendor's pieces."""

    def acquire(
        self,
        cursor: Any,
        *,
        kind: str,
        holder: str,
        token: str,
        ttl: float,
        turn: Turn = NEWCOMER,
        where: str | None = None,
    ) -> Row | None:
        """Grant any free resource of ``kind`` that is the caller's ``turn`` (and matches its
        ``where``, encoded) in one conditional statement (the vendor's ACQUIRE_SCAN; a
        newcomer's first try without the line's subquery, ``Turn.forms``)."""
        for in_line in turn.forms:
            row = self.grant_row(
                cursor,
                "ACQUIRE_SCAN",
                (
                    *self.grant_params(holder, token, self.ttl_param(ttl), turn),
                    *self.grantable(kind, turn, where, in_line=in_line),
                ),
                turn=turn,
                where=where,
                in_line=in_line,
                read_params=(token,),
            )
            if row is not None:
                return row
        return None

    def free_rows(self, cursor: Any, *, kind: str, limit: int) -> tuple[list[Row], Any]:
        """Up to ``limit`` rows of ``kind`` free now (in no promised order), and the
        database's clock when they were read (raw): the sample ``acquire()`` probes (a hint
        only: every grant re-checks its row)."""
        cursor.execute(statements.fill(self.sql["FREE_ROWS"], limit=str(int(limit))), (kind,))
        rows = cursor.fetchall()
        if not rows:
            cursor.execute(self.sql["READ_CLOCK"])
            return [], cursor.fetchall()[0][0]
        return [row[:-1] for row in rows], rows[0][-1]

    def grant_sampled(
        self,
        cursor: Any,
        *,
        sampled: Row,
        kind: str,
        holder: str,
        token: str,
        ttl: float,
        clock: Any,
        turn: Turn = NEWCOMER,
        where: str | None = None,
    ) -> Row | None:
        """Grant the sampled row if it is free and the caller's turn (``grant``); its row as
        granted.

        ``sampled`` is the row as the sample read it and ``clock`` estimates the database's
        clock now (``Clock``); a vendor whose grant cannot return the row cheaply may build
        it from them (MySQL), anything that decides the grant stays in the statement."""
        return self.grant(cursor, pk=sampled[0], kind=kind, holder=holder, token=token, ttl=ttl, turn=turn, where=where)

    def grant(
        self,
        cursor: Any,
        *,
        pk: int,
        kind: str,
        holder: str,
        token: str,
        ttl: float,
        turn: Turn = NEWCOMER,
        where: str | None = None,
        line: str = "",
    ) -> Row | None:
        """Grant one chosen resource (the holder's lock step) if it is free and the caller's
        ``turn`` in the line ``line`` ('': the kind's; a row's name: that row's own line, where
        a session waits for its bound resource); return its row.

        The same SET list as ``acquire`` (fence + 1, holder, token, expiry by the database's
        clock), conditional on the row being free; the matched-row count decides a race
        between callers that chose the same row.
        """
        for in_line in turn.forms:
            row = self.grant_row(
                cursor,
                "GRANT_BY_ID",
                (
                    *self.grant_params(holder, token, self.ttl_param(ttl), turn),
                    pk,
                    *self.grantable(kind, turn, where, line, in_line=in_line),
                ),
                turn=turn,
                where=where,
                in_line=in_line,
                read_params=(pk, token),
            )
            if row is not None:
                return row
        return None

    def grant_named(
        self, cursor: Any, *, kind: str, name: str, holder: str, token: str, ttl: float, turn: Turn = NEWCOMER
    ) -> Row | None:
        """Grant the row (kind, name) if it is free and the caller's ``turn`` in the row's own
        line; return its row (locks, elections, members).

        The same SET list and free condition as ``acquire``; the unique (kind, name) index
        finds the row, and the matched-row count decides the race.
        """
        for in_line in turn.forms:
            row = self.grant_row(
                cursor,
                "GRANT_BY_NAME",
                (
                    *self.grant_params(holder, token, self.ttl_param(ttl), turn),
                    name,
                    *self.grantable(kind, turn, None, name, in_line=in_line),
                ),
                turn=turn,
                where=None,
                in_line=in_line,
                read_params=(kind, name, token),
            )
            if row is not None:
                return row
        return None
