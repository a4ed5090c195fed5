"""Server-side connection counts for leak tests (vendor queries live here, not in the app).

Counted for the test database only: the servers are shared with other test runs.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.db import connection


def open_connections() -> int:
    """Connections currently open to the test database (SQLite: this process's open files
    on the database, its WAL and shared-memory files)."""
    if connection.vendor == "sqlite":
        name = str(Path(str(connection.settings_dict["NAME"])).resolve())
        count = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith(name):
                count += 1
        return count
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE()")
        elif connection.vendor == "postgresql":
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        else:
            raise NotImplementedError(connection.vendor)
        return int(cursor.fetchone()[0])
