"""What the benchmark needs to know or do per database vendor, in one place.

The app keeps vendor SQL in ``resource_lease/db/``; the benchmark has a little of its own,
none of it on the lease path: which baselines a server offers (GET_LOCK is MySQL's), the
server settings that decide its figures (durability, autovacuum), server-side counters read
around each measurement window, and PostgreSQL's VACUUM between measurements.
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError, connections

from project.bench.targets import Target
from resource_lease.models import Resource

_MYSQL_SETTINGS = ("innodb_flush_log_at_trx_commit", "sync_binlog", "log_bin", "tx_isolation", "transaction_isolation")
_POSTGRES_SETTINGS = ("autovacuum", "synchronous_commit", "fsync", "shared_buffers")
# Server-wide counters read around each window; deltas per cycle go to the JSON.
_MYSQL_COUNTERS = ("Innodb_row_lock_waits", "Innodb_row_lock_time", "Innodb_data_fsyncs", "Handler_read_next")


def has_get_lock(target: Target) -> bool:
    return target.vendor == "mysql"


def server_facts(target: Target) -> dict[str, Any]:
    """The server settings that most change the figures (commit durability, vacuum)."""
    try:
        with connections[target.alias].cursor() as cursor:
            if target.vendor == "mysql":
                names = ", ".join(f"'{name}'" for name in _MYSQL_SETTINGS)
                cursor.execute(f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({names})")
                return {name: value for name, value in cursor.fetchall()}
            if target.vendor == "postgresql":
                facts = {}
                for name in _POSTGRES_SETTINGS:
                    cursor.execute("SELECT current_setting(%s)", [name])
                    facts[name] = cursor.fetchone()[0]
                return facts
            if target.vendor == "sqlite":
                cursor.execute("PRAGMA journal_mode")
                journal = cursor.fetchone()[0]
                cursor.execute("PRAGMA synchronous")
                return {"journal_mode": journal, "synchronous": cursor.fetchone()[0]}
    except DatabaseError as exc:
        return {"error": str(exc)}
    return {}


def counters(target: Target) -> dict[str, int]:
    """Server counters to difference around a window (empty where there are none).

    MariaDB/MySQL only: its status counters are current when read. PostgreSQL's statistics
    are sent by each backend at most once a second (and by an idle one up to ten seconds
    later), so they cannot be attributed to a window of a second or two.
    """
    if target.vendor != "mysql":
        return {}
    with connections[target.alias].cursor() as cursor:
        names = ", ".join(f"'{name}'" for name in _MYSQL_COUNTERS)
        cursor.execute(f"SHOW GLOBAL STATUS WHERE Variable_name IN ({names})")
        return {name: int(value) for name, value in cursor.fetchall()}


def vacuum(target: Target) -> bool:
    """PostgreSQL: VACUUM the lease table, as autovacuum would between measurements.

    Every lease update there is a non-HOT update (busy_before is indexed) and leaves a dead
    index entry behind, as does every deleted benchmark row; those in the (kind, busy_before)
    range the acquire scans from its start are walked over by every acquire until VACUUM
    removes them (measured here: about 850 buffers per acquire with 390,000 dead rows in the
    table, under 80 after a VACUUM). Some servers run with autovacuum off: this keeps one
    scenario's churn out of the next one's figures. Returns whether it vacuumed.
    """
    if target.vendor != "postgresql":
        return False
    connection = connections[target.alias]
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM (ANALYZE) {connection.ops.quote_name(Resource._meta.db_table)}")
    return True
