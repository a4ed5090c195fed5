"""The statements of rwlocks (``recipes/rwlock.py``), a part of every ``Dialect``: a read
grant, a write grant, and a read grant's renewal, release and check. The templates are in
``rw_statements.py`` (``RW_*``), with what the design needs said there."""

from __future__ import annotations

import datetime as dt
from typing import Any

from resource_lease.db.line import NEWCOMER, LineStatements, Turn

Row = Any


class RwLockStatements(LineStatements):
    """An rwlock's statements; ``Dialect`` supplies the rendered SQL and the vendor's pieces."""

    attnames: list[str]

    def grant_read(
        self, cursor: Any, *, kind: str, name: str, holder: str, token: str, ttl: float, turn: Turn = NEWCOMER
    ) -> Row | None:
        """A read grant of the row (kind, name) if no writer holds it nor waits ahead of the
        caller's ``turn`` (one conditional UPDATE of the row); the row as granted."""
        ttl_param = self.ttl_param(ttl)
        row = self.grant_row(
            cursor,
            "RW_READ",
            (holder, token, ttl_param, ttl_param, float(turn.lock_delay), name, kind, *turn.params(name)),
            turn=turn,
            where=None,
            in_line=True,
            read_params=(kind, name),
        )
        if row is None:
            return None
        granted = list(row[:-1])
        granted[self.attnames.index("fence")] = row[-1]  # this grant's, whatever was read back
        return granted

    def grant_write(
        self, cursor: Any, *, kind: str, name: str, holder: str, token: str, ttl: float, turn: Turn = NEWCOMER
    ) -> Row | None:
        """A write grant of the row (kind, name) if it is free (no live reader nor writer) and
        nobody waits ahead of the caller's ``turn``; the row as granted."""
        return self.grant_row(
            cursor,
            "RW_WRITE",
            (
                *self.grant_params(holder, token, self.ttl_param(ttl), turn),
                name,
                *self.grantable(kind, turn, None, name),
            ),
            turn=turn,
            where=None,
            in_line=True,
            read_params=(kind, name, token),
        )

    def read_renew(self, cursor: Any, *, pk: int, fence: int, ttl: float) -> dt.datetime | None:
        """Keep a live read grant; the read period's expiry, or None if the grant is gone."""
        ttl_param = self.ttl_param(ttl)
        row = self.returning_row(
            cursor, self.sql["RW_READ_RENEW"], (ttl_param, ttl_param, pk, fence), read_params=(pk,)
        )
        return None if row is None else self.to_datetime(row[0])

    def read_release(self, cursor: Any, *, pk: int, fence: int) -> bool:
        """Give a live read grant back; True if it was live (the last reader frees the row)."""
        cursor.execute(self.sql["RW_READ_RELEASE"], (pk, fence))
        return bool(cursor.rowcount == 1)

    def read_is_held(self, cursor: Any, *, pk: int, fence: int) -> bool:
        cursor.execute(self.sql["RW_READ_HELD"], (pk, fence))
        return bool(cursor.fetchall())


__all__ = ["RwLockStatements"]
