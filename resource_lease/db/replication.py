"""PostgreSQL replication as the app's server sees it, for the system check that warns when
a failover could lose the last grants (``checks.check_replication``, docs/ha.md).

A lease is only as durable as its commit: if the server that granted it dies before a
standby has the grant, the standby promoted in its place grants the resource again, with a
fence already handed out. Synchronous replication (Patroni's ``synchronous_mode_strict``)
closes that gap; these statements let the check tell whether it is closed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: In recovery (a standby), this session's synchronous_commit, the server's
#: synchronous_standby_names, its streaming standbys, how many of them are synchronous, and
#: how many it would not show (their sync_state is hidden from a role without
#: pg_read_all_stats: then the server cannot tell us).
PRIMARY_REPORT = """
SELECT pg_is_in_recovery(),
       current_setting('synchronous_commit'),
       current_setting('synchronous_standby_names'),
       (SELECT count(*) FROM pg_stat_replication),
       (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')),
       (SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL)
"""

#: synchronous_commit values that return before a synchronous standby has the commit.
BELOW_ON = ("off", "local", "remote_write")


@dataclass(frozen=True)
class PrimaryReport:
    in_recovery: bool
    synchronous_commit: str
    synchronous_standby_names: str
    standbys: int
    synchronous: int
    hidden: int


def primary_report(cursor: Any) -> PrimaryReport:
    """``PRIMARY_REPORT`` on ``cursor`` (a PostgreSQL connection's)."""
    cursor.execute(PRIMARY_REPORT)
    row = cursor.fetchone()
    return PrimaryReport(bool(row[0]), str(row[1]), str(row[2]), int(row[3]), int(row[4]), int(row[5]))
