"""The lease statements, a part of every ``Dialect`` (``dialect.leases``): the grants (any free
row of a kind: the scan; a sampled row: the probe; a chosen row: the holder's lock step; a
named row: locks, elections, members), each conditional on the row being free and the caller's
turn in its line (``db/line.py``), and a grant's renewal, release and checks. A vendor's part
overrides what differs (``MySQLLeases``: the probe and the scan; ``PostgreSQLLeases``: the probe
and the release's hand-off)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from resource_lease.db import statements
from resource_lease.db.answers import Answer
from resource_lease.db.line import NEWCOMER, Ask, Turn, left_by_grant, own
from resource_lease.models import NEVER

if TYPE_CHECKING:
    from resource_lease.db.base import Dialect

Row = Sequence[Any]


class LeaseStatements:
    """The lease statements on ``dialect``'s rendered SQL."""

    def __init__(self, dialect: Dialect) -> None:
        self.d = dialect

    def acquire(self, cursor: Any, ask: Ask, *, token: str, turn: Turn = NEWCOMER) -> Row | None:
        """Grant any free resource of the ``ask``'s kind that is the caller's ``turn`` (and
        matches its ``where``) in one conditional statement (the vendor's ACQUIRE_SCAN; a
        newcomer's first try without the line's subquery, ``Turn.forms``)."""
        for in_line in turn.forms:
            row = self.grant_row(
                cursor,
                "ACQUIRE_SCAN",
                (*self.grant_params(ask, token), *self.grantable(ask, turn, in_line=in_line)),
                ask=ask,
                turn=turn,
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
        cursor.execute(statements.fill(self.d.sql["FREE_ROWS"], limit=str(int(limit))), (kind,))
        rows = cursor.fetchall()
        if not rows:
            return [], self.d.execute(cursor, "READ_CLOCK", answer=Answer.VALUE)
        return [row[:-1] for row in rows], rows[0][-1]

    def grant_sampled(
        self, cursor: Any, ask: Ask, *, sampled: Row, token: str, clock: Any, turn: Turn = NEWCOMER
    ) -> Row | None:
        """Grant the sampled row if it is free and the caller's turn (``grant``); its row as
        granted.

        ``sampled`` is the row as the sample read it and ``clock`` estimates the database's
        clock now (``Clock``); a vendor whose grant cannot return the row cheaply may build
        it from them (MySQL), anything that decides the grant stays in the statement."""
        return self.grant(cursor, ask, pk=sampled[0], token=token, turn=turn)

    def grant(self, cursor: Any, ask: Ask, *, pk: int, token: str, turn: Turn = NEWCOMER, line: str = "") -> Row | None:
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
                (*self.grant_params(ask, token), pk, *self.grantable(ask, turn, line, in_line=in_line)),
                ask=ask,
                turn=turn,
                in_line=in_line,
                read_params=(pk, token),
            )
            if row is not None:
                return row
        return None

    def grant_named(self, cursor: Any, ask: Ask, *, name: str, token: str, turn: Turn = NEWCOMER) -> Row | None:
        """Grant the row (kind, name) if it is free and the caller's ``turn`` in the row's own
        line; return its row (locks, elections, members). The ``ask`` has no ``where=``.

        The same SET list and free condition as ``acquire``; the unique (kind, name) index
        finds the row, and the matched-row count decides the race.
        """
        for in_line in turn.forms:
            row = self.grant_row(
                cursor,
                "GRANT_BY_NAME",
                (*self.grant_params(ask, token), name, *self.grantable(ask, turn, name, in_line=in_line)),
                ask=ask,
                turn=turn,
                in_line=in_line,
                read_params=(ask.kind, name, token),
            )
            if row is not None:
                return row
        return None

    def grant_row(
        self,
        cursor: Any,
        name: str,
        params: Sequence[Any],
        *,
        ask: Ask,
        turn: Turn,
        in_line: bool,
        read_params: Sequence[Any] = (),
    ) -> Sequence[Any] | None:
        """Run the grant statement ``name`` in its form (``Turn.forms``; with the ``ask``'s
        filter and target if any); a waiter's grant in the line form leaves its place in the
        same statement where the vendor can (``leaving``)."""
        where, target = ask.where_sql, ask.target
        leaving = self.d.line.leaving.get((name, where is not None, bool(target))) if in_line and turn.place else None
        if leaving is not None:
            row = self.d.returning_row(cursor, leaving, (*params, turn.place), read_params=read_params)
            if row is None:
                return None
            left_by_grant[self.d.alias, turn.place] = bool(row[-1])
            return tuple(row[:-1])
        sql = self.d.statement(name, where, in_line=in_line, target=target)
        return self.d.returning_row(cursor, sql, params, read_params=read_params)

    def grant_params(self, ask: Ask, token: str) -> tuple[Any, ...]:
        """GRANT_SET's parameters: the holder, the token, the ttl, the lock delay."""
        return (ask.holder, token, self.d.ttl_param(ask.ttl), float(ask.lock_delay))

    @staticmethod
    def grantable(ask: Ask, turn: Turn, line: str = "", *, in_line: bool = True) -> tuple[Any, ...]:
        """GRANTABLE's parameters: the kind, the caller's turn in the line ``line`` (the line
        form only), the ``ask``'s filter and its target."""
        params = (ask.kind, *turn.line_params(line, ask.kind)) if in_line else (ask.kind,)
        return (*params, *own(ask.where_sql, ask.target))

    # -- a grant's life: renewal, release, checks ------------------------------------------

    def renew(self, cursor: Any, *, pk: int, holder: str, fence: int, ttl: float) -> dt.datetime | None:
        """Extend a live grant of ours; return the new expiry, or None if it is not ours."""
        row = self.d.returning_row(
            cursor, self.d.sql["RENEW"], (self.d.ttl_param(ttl), pk, holder, fence), read_params=(pk, fence)
        )
        return None if row is None else self.d.to_datetime(row[0])

    def release(self, cursor: Any, *, pk: int, holder: str, fence: int) -> bool:
        """Give a live grant of ours back; True if it was ours. Where the vendor can, the same
        statement tells the waiters whose turn it may be (PostgreSQL: ``TELL_TURNS``)."""
        self.d.run_hot(cursor, self.d.sql["RELEASE"], (pk, holder, fence), label="release")
        return bool(cursor.rowcount == 1)

    def write_data(self, cursor: Any, *, pk: int, holder: str, fence: int, data: str) -> bool:
        """Replace a live grant's payload (JSON text) if the grant is still ours: a fenced write."""
        return self.d.execute(cursor, "WRITE_DATA", (data, pk, holder, fence), answer=Answer.CHANGED_ONE)

    def was_released(self, cursor: Any, *, pk: int, holder: str, fence: int) -> bool:
        """Whether this grant (holder and fence) has been given back: its token cleared, or the
        next grant followed a release of it (handed to a waiter: PostgreSQL's RELEASE).
        Settles a release whose answer was lost (docs/pitfalls.md#unknown-outcome); an
        operator's force_release counts too (the grant was ours and the resource is free)."""
        return self.d.execute(cursor, "WAS_RELEASED", (pk, holder, fence, holder, fence), answer=Answer.ANY)

    def is_held(self, cursor: Any, *, pk: int, holder: str, fence: int) -> bool:
        return self.d.execute(cursor, "IS_HELD", (pk, holder, fence), answer=Answer.ANY)

    def find_grant(self, cursor: Any, *, kind: str, token: str) -> Row | None:
        """The row granted under ``token``, if that grant committed and is still live (settles
        a grant whose answer was lost: docs/pitfalls.md#unknown-outcome)."""
        return self.d.execute(cursor, "FIND_GRANT", (kind, token), answer=Answer.FIRST)

    # -- the rows ----------------------------------------------------------------------------

    def kind_exists(self, cursor: Any, kind: str) -> bool:
        return self.d.execute(cursor, "KIND_EXISTS", (kind,), answer=Answer.ANY)

    def limit_slots(self, cursor: Any, *, kind: str, below: str) -> int:
        """Enable the rows of ``kind`` whose name sorts before ``below`` and disable the others
        (a semaphore's slot count: slot names are zero-padded numbers). A held row that gets
        disabled keeps its holder; it is never granted again while disabled. Returns how many
        rows changed (none when the count is already in force)."""
        return self.d.execute(cursor, "LIMIT_SLOTS", (below, kind, below), answer=Answer.COUNT)

    def insert_missing(self, cursor: Any, *, kind: str, names: Sequence[str], data: str = "{}") -> None:
        """Create the rows (kind, name) that do not exist yet, free and never leased.

        Race-safe: a row that another connection creates at the same moment is kept as it is
        (no IntegrityError); ``data`` (JSON text) goes only into rows this statement creates.
        """
        if not names:
            return
        never = self.d.connection.ops.adapt_datetimefield_value(NEVER)
        params: list[Any] = []
        for name in names:
            params += [kind, name, data, never]
        rows = ", ".join([self.d.sql["MISSING_ROW"]] * len(names))
        cursor.execute(statements.fill(self.d.sql["INSERT_MISSING"], rows=rows), params)

    def read_named(self, cursor: Any, *, kind: str, names: Sequence[str] | None = None) -> tuple[list[Row], Any]:
        """The rows of ``kind`` (only ``names`` if given; in no order), and the database's
        clock when they were read (raw; ``to_datetime`` converts it)."""
        if names is None:
            cursor.execute(self.d.sql["READ_KIND"], [kind])
        elif not names:
            return [], None
        else:
            in_list = ", ".join([self.d.placeholder] * len(names))
            cursor.execute(statements.fill(self.d.sql["READ_NAMED"], names=in_list), [kind, *names])
        rows = cursor.fetchall()
        if not rows:
            return [], self.d.execute(cursor, "READ_CLOCK", answer=Answer.VALUE)
        return [row[:-1] for row in rows], rows[0][-1]
