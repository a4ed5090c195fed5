"""The statements of the leadership log (``models.LeadershipTerm``), per vendor.

``TERM_RECORD`` writes down a term of an election: ``(fence, holder)`` of the election's row
and, with it, the term before (``fence - 1``, the row's ``previous_holder``, which the grant
set to the holder it replaced), read from the row in the same statement and written only
while the row is still that live grant of that holder. So a term can be written only while
it is live or while the next one is: once the row has moved two terms on, nothing can add an
older term, and an observer that read the row first and the log next has everything older
that will ever be there (``recipes/observing.py``). Terms already written are kept as they
are (``ON CONFLICT DO NOTHING``; a no-op ``ON DUPLICATE KEY UPDATE`` on MySQL/MariaDB). On PostgreSQL the same
statement wakes the election's observers (``pg_notify``), and ``TERM_WAKE`` wakes them when a
leader resigns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resource_lease.models import LeadershipTerm, Resource

if TYPE_CHECKING:
    from resource_lease.db.base import Dialect

#: At most this many terms are read by one look at the log (the rest at the next).
TERMS_READ = 1000

# The live grant (kind, name, fence, holder) of an election's row, as the two terms' source.
_LIVE = (
    " FROM {table} WHERE kind = {p_kind} AND name = {p_name} AND fence = {p_fence} AND holder = {p_holder}"
    " AND grant_token <> '' AND busy_before > {now}"
)
_ROWS = (
    "SELECT name, fence, holder, {now}" + _LIVE + " UNION ALL SELECT name, fence - 1, previous_holder, {now}" + _LIVE
)
_COLUMNS = "INSERT INTO {terms} ({q_election}, {q_fence}, {q_leader}, {q_recorded_at}) "

# Write down a live term and the one before it. (kind, name, fence, holder: twice)
TERM_RECORD = _COLUMNS + _ROWS + " AND fence > 1 ON CONFLICT ({q_election}, {q_fence}) DO NOTHING"
# The leader written down for one term, if any. (election, fence)
TERM_LEADER = "SELECT {q_leader} FROM {terms} WHERE {q_election} = {p_election} AND {q_fence} = {p_fence}"
# The terms after a fence, oldest first. (election, fence)
TERMS_AFTER = (
    "SELECT {q_fence}, {q_leader} FROM {terms} WHERE {q_election} = {p_election} AND {q_fence} > {p_fence}"
    " ORDER BY {q_fence} LIMIT {terms_read}"
)
TEMPLATES: dict[str, str] = {
    "TERM_RECORD": TERM_RECORD,
    "TERM_LEADER": TERM_LEADER,
    "TERMS_AFTER": TERMS_AFTER,
}

# -- PostgreSQL: the observers woken by the statement that wrote the term --------------------

# (kind, name, fence, holder: twice; channel)
PG_TERM_RECORD = (
    "WITH written AS (" + _COLUMNS + _ROWS + " AND fence > 1"
    " ON CONFLICT ({q_election}, {q_fence}) DO NOTHING RETURNING {q_fence})"
    " SELECT pg_notify({p_channel}, '') FROM written"
)
# Wake the observers of an election (a resignation); only PostgreSQL has it: elsewhere
# observers poll, and there is nothing to send. (channel)
PG_TERM_WAKE = "SELECT pg_notify({p_channel}, '')"
POSTGRESQL_TEMPLATES = {**TEMPLATES, "TERM_RECORD": PG_TERM_RECORD, "TERM_WAKE": PG_TERM_WAKE}

# -- MySQL / MariaDB: a term already written is kept (ON DUPLICATE KEY: a no-op) ------------

# Not INSERT IGNORE: IGNORE would turn any other error of a row (a value the column cannot
# hold) into a warning and write the row changed or not at all (issue 37). Here a duplicate
# key changes nothing, and anything else fails the statement, writing nothing.
MYSQL_TERM_RECORD = _COLUMNS + _ROWS + " AND fence > 1 ON DUPLICATE KEY UPDATE {q_leader} = {terms}.{q_leader}"
MYSQL_TEMPLATES = {**TEMPLATES, "TERM_RECORD": MYSQL_TERM_RECORD}


def pieces(dialect: Dialect) -> dict[str, str]:
    """What these templates leave open, for ``dialect``'s vendor and tables."""
    qn = dialect.connection.ops.quote_name
    return {
        "terms": qn(LeadershipTerm._meta.db_table),
        "table": qn(Resource._meta.db_table),
        "now": dialect.now_sql,
        "named": dialect.named_placeholder,
        "quote": qn("{}"),
        "terms_read": str(TERMS_READ),
    }
