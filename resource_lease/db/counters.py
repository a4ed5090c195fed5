"""The statements of shared counters (``resource_lease.counter``), per vendor.

An ``add`` is one upsert judged by the database: it creates the counter on first use (two
processes adding to a new name at once create one row) or adds to its value, and hands back
the new value from the same statement, so no other add can slip in between (a read-back by
name could see a later value). PostgreSQL and SQLite say it with ``RETURNING``; MySQL/MariaDB
with ``value = LAST_INSERT_ID(value + n)`` read back in the same round trip
(docs/pitfalls.md#no-returning). A sum that would leave BIGINT changes nothing (PostgreSQL and
SQLite: the upsert's WHERE refuses it; MySQL/MariaDB: the server's range error): the caller
says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resource_lease.models import Counter

if TYPE_CHECKING:
    from resource_lease.db.base import Dialect

#: The range of a BIGINT, which a counter's value stays in.
BIGINT_MIN, BIGINT_MAX = -(2**63), 2**63 - 1

# Create the counter at n or add n to it, within BIGINT: its new value (no row: refused). The
# bound is checked without computing a sum that could overflow (SQLite would make it a REAL).
# (name, n)
COUNTER_ADD = (
    "INSERT INTO {counters} ({q_name}, {q_value}, {q_updated_at}) VALUES ({p_name}, {p_n}, {now})"
    " ON CONFLICT ({q_name}) DO UPDATE SET {q_value} = {counters}.{q_value} + excluded.{q_value},"
    " {q_updated_at} = excluded.{q_updated_at}"
    " WHERE CASE WHEN excluded.{q_value} > 0 THEN {counters}.{q_value} <= {bigint_max} - excluded.{q_value}"
    " ELSE {counters}.{q_value} >= {bigint_min} - excluded.{q_value} END"
    " RETURNING {q_value}"
)
# The value of a counter (no row: never added to, 0). (name)
COUNTER_READ = "SELECT {q_value} FROM {counters} WHERE {q_name} = {p_name}"

TEMPLATES: dict[str, str] = {"COUNTER_ADD": COUNTER_ADD, "COUNTER_READ": COUNTER_READ}

# -- MySQL / MariaDB: ON DUPLICATE KEY, the new value through LAST_INSERT_ID ------------------

# LAST_INSERT_ID(expr) remembers the new value for this session (as BIGINT UNSIGNED: CAST back
# to signed both ways). An insert (affected rows 1, with CLIENT.FOUND_ROWS) leaves the row's
# new id there instead: its value is n. A sum out of range is the server's error 1690.
MYSQL_COUNTER_ADD = (
    "INSERT INTO {counters} ({q_name}, {q_value}, {q_updated_at}) VALUES ({p_name}, {p_n}, {now})"
    " ON DUPLICATE KEY UPDATE {q_value} = CAST(LAST_INSERT_ID({q_value} + VALUES({q_value})) AS SIGNED),"
    " {q_updated_at} = VALUES({q_updated_at}); SELECT CAST(LAST_INSERT_ID() AS SIGNED)"
)
MYSQL_TEMPLATES = {**TEMPLATES, "COUNTER_ADD": MYSQL_COUNTER_ADD}


def pieces(dialect: Dialect) -> dict[str, str]:
    """What these templates leave open, for ``dialect``'s vendor and tables."""
    qn = dialect.connection.ops.quote_name
    return {
        "counters": qn(Counter._meta.db_table),
        "now": dialect.now_sql,
        "named": dialect.named_placeholder,
        "quote": qn("{}"),
        "bigint_min": str(BIGINT_MIN),
        "bigint_max": str(BIGINT_MAX),
    }
