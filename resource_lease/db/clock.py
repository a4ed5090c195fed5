"""The database's clock in UTC: ``NOW_SQL`` per vendor, ``DbNow`` for ORM queries, and
``read_clock`` on a Django connection. A leaf: the models use it, and it imports nothing of
the app (docs/pitfalls.md#database-clock)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import DateTimeField, Func
from django.db.models.sql.compiler import SQLCompiler
from django.utils.dateparse import parse_datetime

# The database's clock in UTC, per vendor (kept in step with each dialect's now_sql):
# never the client's clock, never the session's time zone (docs/pitfalls.md#database-clock).
NOW_SQL = {
    "mysql": "UTC_TIMESTAMP(6)",
    "postgresql": "statement_timestamp()",
    "sqlite": "strftime('%Y-%m-%d %H:%M:%f', 'now')",
}


def read_clock(connection: BaseDatabaseWrapper) -> dt.datetime:
    """The database's current time (UTC), read on a Django connection (the caller's own)."""
    with connection.cursor() as cursor:
        # Parameters given (none), so every driver reads %% as a literal %.
        cursor.execute(f"SELECT {NOW_SQL[connection.vendor]}".replace("%", "%%"), [])
        (value,) = cursor.fetchone()
    return as_utc_datetime(value)


def as_utc_datetime(value: Any) -> dt.datetime:
    """A datetime the database returned raw (SQLite: text, MySQL: naive UTC) as aware UTC."""
    if isinstance(value, str):
        parsed = parse_datetime(value)
        if parsed is None:
            raise ValueError(f"not a datetime: {value!r}")
        value = parsed
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


class DbNow(Func):
    """The database's current time in UTC (never the client's clock, never the session zone)."""

    output_field = DateTimeField()

    def as_sql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any) -> tuple[str, list[Any]]:  # type: ignore[override]
        # The ORM %-formats its SQL, so a literal % (SQLite's strftime) is doubled.
        return NOW_SQL[connection.vendor].replace("%", "%%"), []


__all__ = ["NOW_SQL", "DbNow", "as_utc_datetime", "read_clock"]
