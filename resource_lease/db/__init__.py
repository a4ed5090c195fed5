"""Everything that differs between MySQL/MariaDB, PostgreSQL and SQLite.

``dialect_class(vendor)`` picks the lease statements for a connection; ``db.clock`` is the
database's clock (``DbNow`` for ORM queries, ``read_clock``), a leaf the models import too.
Nothing outside this package branches on the vendor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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


def engine_vendor(engine: str) -> str | None:
    """The vendor of a ``DATABASES`` ENGINE path (the checks that run without connecting), or
    None for one resource_lease does not support."""
    for part, vendor in (("mysql", "mysql"), ("postgresql", "postgresql"), ("sqlite3", "sqlite")):
        if part in engine:
            return vendor
    return None


__all__ = ["SUPPORTED_VENDORS", "dialect_class", "engine_vendor"]
