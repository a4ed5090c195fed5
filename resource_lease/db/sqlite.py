"""SQLite: one writer at a time, so UPDATE ... WHERE id = (SELECT ...) RETURNING is atomic."""

from __future__ import annotations

import sqlite3
from typing import Any

from resource_lease.db.base import Dialect, Failure
from resource_lease.db.clock import NOW_SQL
from resource_lease.db.statements import Returning

# The acquire: one writer at a time, so the subquery's row is still free when the UPDATE
# writes it (docs/pitfalls.md#sqlite). The implicit transaction (and the write lock) ends only
# when the statement has run to completion: every row is read (``Dialect.returning_row``).
# (holder, token, ttl, kind, *line, [where])
ACQUIRE_SCAN = Returning(
    "UPDATE {table} SET {grant_set} WHERE id = (SELECT id FROM {table} WHERE {grantable} ORDER BY busy_before LIMIT 1)"
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
    where_types = {"str": "text", "int": "integer", "true": "true", "false": "false", "null": "null"}

    def matches_sql(self, where: str, data: str) -> str:
        # docs/pitfalls.md#json-compared. json_each walks the filter's entries; each key's value in the row must have the
        # same JSON type (json_type names true and false apart) and, for text and integers,
        # the same text.
        # The key as the document spells it (base.key_paths): SQLite compares a path's key
        # with the stored text, escapes and all.
        path = (
            f"CASE WHEN json_type({data}, json_extract(f.value, '$.pa')) IS NOT NULL"
            " THEN json_extract(f.value, '$.pa') ELSE json_extract(f.value, '$.pu') END"
        )
        kind = "json_extract(f.value, '$.t')"
        return (
            f"NOT EXISTS (SELECT 1 FROM json_each({where}) AS f"
            f" WHERE NOT COALESCE(json_type({data}, {path}) = {kind}"
            f" AND ({kind} IN ('null', 'true', 'false')"
            f" OR CAST(json_extract({data}, {path}) AS TEXT) = json_extract(f.value, '$.s')), 0))"
        )

    named_placeholder = ":{}"

    def delay_end_sql(self) -> str:
        # Django stores busy_before as text SQLite's date functions read; the result sorts
        # with now_sql's (both with milliseconds).
        return "strftime('%Y-%m-%d %H:%M:%f', busy_before, '+' || lock_delay || ' seconds')"

    def expiry_sql(self, placeholder: str | None = None) -> str:
        return f"strftime('%Y-%m-%d %H:%M:%f', 'now', {placeholder or '?'})"

    def ttl_param(self, ttl: float) -> Any:
        return f"{float(ttl):+.3f} seconds"

    def classify(self, exc: BaseException) -> Failure:
        # "database table is locked" (shared cache) is immediate and passes; "database is
        # locked" means the whole busy timeout already ran out, so retrying would only wait
        # that long again.
        if isinstance(exc, sqlite3.OperationalError) and "table is locked" in str(exc):
            return Failure.TRANSIENT
        return Failure.FATAL
