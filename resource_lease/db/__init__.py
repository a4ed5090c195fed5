"""Everything that differs between MySQL/MariaDB, PostgreSQL and SQLite.

``dialect_class(vendor)`` picks the lease statements for a connection; ``DbNow`` is the
database's clock in UTC for ORM queries (admin, pool operations). Nothing outside this
package branches on the vendor.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import DateTimeField, Func
from django.db.models.sql.compiler import SQLCompiler
from django.utils.dateparse import parse_datetime

if TYPE_CHECKING:
    from resource_lease.db.base import Dialect

SUPPORTED_VENDORS = ("mysql", "postgresql", "sqlite")


def dialect_class(vendor: str) -> type[Dialect]:
    """The lease statements for a connection's vendor (imports models: call after setup)."""
    if vendor == "mysql":
        from resource_lease.db.mysql import MySQLDialect

        return MySQLDialect
    if vendor == "postgresql":
        from resource_lease.db.postgresql import PostgreSQLDialect

        return PostgreSQLDialect
    if vendor == "sqlite":
        from resource_lease.db.sqlite import SQLiteDialect

        return SQLiteDialect
    raise NotImplementedError(f"resource_lease supports {', '.join(SUPPORTED_VENDORS)}; this database is {vendor!r}")


# The database's clock in UTC, per vendor (kept in step with each dialect's now_sql):
# never the client's clock, never the session's time zone (docs/pitfalls.md#database-clock).
NOW_SQL = {
    "mysql": "UTC_TIMESTAMP(6)",
    "postgresql": "statement_timestamp()",
    "sqlite": "strftime('%Y-%m-%d %H:%M:%f', 'now')",
}


def engine_vendor(engine: str) -> str | None:
    """The vendor of a ``DATABASES`` ENGINE path (the checks that run without connecting), or
    None for one resource_lease does not support."""
    for part, vendor in (("mysql", "mysql"), ("postgresql", "postgresql"), ("sqlite3", "sqlite")):
        if part in engine:
            return vendor
    return None


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


__all__ = ["NOW_SQL", "SUPPORTED_VENDORS", "DbNow", "as_utc_datetime", "dialect_class", "engine_vendor", "read_clock"]
