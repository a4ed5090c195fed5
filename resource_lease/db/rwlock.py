"""The statements of rwlocks (``recipes/rwlock.py``), a part of every ``Dialect`` (``dialect.rw``): a read
grant, a write grant, and a read grant's renewal, release and check. The templates are in
``rw_statements.py`` (``RW_*``), with what the design needs said there."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from resource_lease.db.answers import Answer
from resource_lease.db.line import NEWCOMER, Ask, Turn

if TYPE_CHECKING:
    from resource_lease.db.base import Dialect

Row = Any


class RwLockStatements:
    """An rwlock's statements on ``dialect``'s rendered SQL (``PostgreSQLRw``: a read
    release that tells the writers waiting)."""

    def __init__(self, dialect: Dialect) -> None:
        self.d = dialect

    def grant_read(self, cursor: Any, ask: Ask, *, name: str, token: str, turn: Turn = NEWCOMER) -> Row | None:
        """A read grant of the row (kind, name) if no writer holds it nor waits ahead of the
        caller's ``turn`` (one conditional UPDATE of the row); the row as granted."""
        ttl_param = self.d.ttl_param(ask.ttl)
        row = self.d.leases.grant_row(
            cursor,
            "RW_READ",
            (ask.holder, token, ttl_param, ttl_param, float(ask.lock_delay), name, ask.kind, *turn.params(name)),
            ask=ask,
            turn=turn,
            in_line=True,
            read_params=(ask.kind, name),
        )
        if row is None:
            return None
        granted = list(row[:-1])
        granted[self.d.attnames.index("fence")] = row[-1]  # this grant's, whatever was read back
        return granted

    def grant_write(self, cursor: Any, ask: Ask, *, name: str, token: str, turn: Turn = NEWCOMER) -> Row | None:
        """A write grant of the row (kind, name) if it is free (no live reader nor writer) and
        nobody waits ahead of the caller's ``turn``; the row as granted."""
        leases = self.d.leases
        return leases.grant_row(
            cursor,
            "RW_WRITE",
            (*leases.grant_params(ask, token), name, *leases.grantable(ask, turn, name)),
            ask=ask,
            turn=turn,
            in_line=True,
            read_params=(ask.kind, name, token),
        )

    def read_renew(self, cursor: Any, *, pk: int, fence: int, ttl: float) -> dt.datetime | None:
        """Keep a live read grant; the read period's expiry, or None if the grant is gone."""
        ttl_param = self.d.ttl_param(ttl)
        row = self.d.returning_row(
            cursor, self.d.sql["RW_READ_RENEW"], (ttl_param, ttl_param, pk, fence), read_params=(pk,)
        )
        return None if row is None else self.d.to_datetime(row[0])

    def read_release(self, cursor: Any, *, pk: int, fence: int) -> bool:
        """Give a live read grant back; True if it was live (the last reader frees the row)."""
        return self.d.execute(cursor, "RW_READ_RELEASE", (pk, fence), answer=Answer.CHANGED_ONE)

    def read_is_held(self, cursor: Any, *, pk: int, fence: int) -> bool:
        return self.d.execute(cursor, "RW_READ_HELD", (pk, fence), answer=Answer.ANY)


__all__ = ["RwLockStatements"]
