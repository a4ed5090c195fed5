"""What the benchmark needs to know or do per database vendor, in one place.

The app keeps vendor SQL in ``resource_lease/db/``; the benchmark has a little of its own,
none of it on the lease path: which baselines a server offers (GET_LOCK is MySQL's), the
server settings that decide its figures (durability, autovacuum), server-side counters read
around each measurement window, and PostgreSQL's VACUUM between measurements.
"""

from __future__ import annotations

import os
from pathlib import Path
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

    ``server_cpu_ms``: CPU time of the server's processes on this machine (mysqld/mariadbd,
    or every postgres process), from /proc; 0 where the server is elsewhere. Machine-wide, so
    another client of the same server adds to it. MariaDB/MySQL also: its status counters,
    which are current when read. PostgreSQL's statistics are sent by each backend at most once
    a second (and by an idle one up to ten seconds later), so they cannot be attributed to a
    window of a second or two.
    """
    found = {"server_cpu_ms": _server_cpu_ms(target.vendor)} if target.vendor != "sqlite" else {}
    if target.vendor != "mysql":
        return found
    with connections[target.alias].cursor() as cursor:
        names = ", ".join(f"'{name}'" for name in _MYSQL_COUNTERS)
        cursor.execute(f"SHOW GLOBAL STATUS WHERE Variable_name IN ({names})")
        return found | {name: int(value) for name, value in cursor.fetchall()}


#: The names of a vendor's local server processes, as /proc/<pid>/stat gives them.
SERVER_PROCESSES = {"mysql": ("mysqld", "mariadbd"), "postgresql": ("postgres",)}


def cpu_ticks(*, pids: list[int] | None = None, names: tuple[str, ...] = (), reaped: bool = False) -> dict[int, int]:
    """CPU clock ticks (user + system) by pid, from /proc: of ``pids``, or else of every
    process named one of ``names``; a process gone meanwhile is left out. ``reaped``: also
    what each one's exited children spent (cutime, cstime), which the kernel adds to the
    parent once it has waited for them (PostgreSQL's postmaster and its backends)."""
    procs = [Path(f"/proc/{pid}") for pid in pids] if pids is not None else Path("/proc").glob("[0-9]*")
    found: dict[int, int] = {}
    for proc in procs:
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        if pids is not None or stat[stat.index("(") + 1 : stat.rindex(")")] in names:
            fields = stat[stat.rindex(")") + 2 :].split()
            found[int(proc.name)] = sum(int(f) for f in fields[11 : 15 if reaped else 13])
    return found


def server_cpu_ms(names: tuple[str, ...]) -> float:
    """CPU (user + system, ms) the local processes named ``names`` have spent, with their
    exited children: a backend that exits between two readings (a worker that closed its
    connection before the second one) is counted in its postmaster's total, so the
    difference of two readings is what the server spent between them."""
    return 1000 * sum(cpu_ticks(names=names, reaped=True).values()) / os.sysconf("SC_CLK_TCK")


def _server_cpu_ms(vendor: str) -> int:
    """CPU (ms) of the local server processes of ``vendor`` so far (``server_cpu_ms``)."""
    return int(server_cpu_ms(SERVER_PROCESSES.get(vendor, ())))


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
