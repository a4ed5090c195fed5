"""SQLite: one writer at a time, so UPDATE ... WHERE id = (SELECT ...) RETURNING is atomic."""

from __future__ import annotations

import sqlite3
from typing import Any

from resource_lease.db import NOW_SQL
from resource_lease.db.base import Dialect, Failure
from resource_lease.db.statements import Returning

# The acquire: one writer at a time, so the subquery's row is still free when the UPDATE
# writes it (docs/pitfalls.md#sqlite). The implicit transaction (and the write lock) ends only
# when the statement has run to completion: every row is read (``Dialect.returning_row``).
# (holder, token, ttl, kind)
ACQUIRE_SCAN = Returning(
    "UPDATE {table} SET {grant_set} WHERE id = (SELECT id FROM {table} WHERE {free} ORDER BY busy_before LIMIT 1)"
)


class SQLiteDialect(Dialect):
    vendor = "sqlite"
    placeholder = "?"
    single_writer = True
    # Django stores datetimes as 'YYYY-MM-DD HH:MM:SS.ffffff' text in UTC; this sorts with them.
    now_sql = NOW_SQL["sqlite"]
    true = "1"
    false = "0"
    templates = {**Dialect.templates, "ACQUIRE_SCAN": ACQUIRE_SCAN}

    def expiry_sql(self) -> str:
        return "strftime('%Y-%m-%d %H:%M:%f', 'now', ?)"

    def ttl_param(self, ttl: float) -> Any:
        return f"{float(ttl):+.3f} seconds"

    def classify(self, exc: BaseException) -> Failure:
        # "database table is locked" (shared cache) is immediate and passes; "database is
        # locked" means the whole busy timeout already ran out, so retrying would only wait
        # that long again.
        if isinstance(exc, sqlite3.OperationalError) and "table is locked" in str(exc):
            return Failure.TRANSIENT
        return Failure.FATAL
