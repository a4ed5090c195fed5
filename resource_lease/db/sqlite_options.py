"""What an SQLite database shared by several processes needs, checked from its ``DATABASES``
entry: WAL, a busy timeout, and IMMEDIATE transactions (SQLite has no ``SELECT ... FOR
UPDATE``; without these, concurrent writers fail with "database is locked").

- Without WAL, a writer blocks every reader, and a reader every writer: a renewal waits on
  the admin's list page.
- Without a busy timeout a connection that finds the database locked fails at once
  ("database is locked") instead of waiting its turn.
- Without ``transaction_mode = "IMMEDIATE"`` a transaction starts as a reader and upgrades to
  a writer at its first write; when two do, SQLite fails one at once, busy timeout or not.

See docs/pitfalls.md#sqlite.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

#: Below this many seconds, a busy timeout does not cover a renewal waiting for a seeding.
MIN_BUSY_TIMEOUT = 1.0

_WAL = re.compile(r"journal_mode\s*=\s*'?wal'?", re.IGNORECASE)
_FIX = (
    'OPTIONS = {"init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", '
    '"transaction_mode": "IMMEDIATE", "timeout": 30} '
    "(resource_lease.db.settings.database_from_url builds such an entry)"
)


def _file_is_wal(name: str) -> bool:
    """Whether the database file is in WAL mode already (the mode is stored in the file)."""
    path = Path(name)
    if not path.is_file():
        return False
    try:
        connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=1)
        try:
            (mode,) = connection.execute("PRAGMA journal_mode").fetchone()
        finally:
            connection.close()
    except sqlite3.Error:
        return False
    return str(mode).lower() == "wal"


def in_memory(conf: dict[str, Any]) -> bool:
    """Whether a ``DATABASES`` entry is an SQLite database in memory, which no other process
    can share (check W002)."""
    return "sqlite3" in str(conf.get("ENGINE", "")) and str(conf.get("NAME", "")) in ("", ":memory:")


def multiprocess_problems(conf: dict[str, Any]) -> list[str]:
    """What keeps a file-based SQLite ``DATABASES`` entry from being shared by several
    processes; empty when it is set up for it (or is not SQLite, or is in memory: check W002)."""
    if "sqlite3" not in str(conf.get("ENGINE", "")):
        return []
    name = str(conf.get("NAME", ""))
    if name in ("", ":memory:") or "mode=memory" in name:
        return []
    options = conf.get("OPTIONS") or {}
    problems = []
    if not _WAL.search(str(options.get("init_command", ""))) and not _file_is_wal(name):
        problems.append("not in WAL mode (a writer blocks readers and readers block writers)")
    timeout = options.get("timeout", 5.0)  # sqlite3.connect's default
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout < MIN_BUSY_TIMEOUT:
        problems.append(f"a busy timeout of {timeout:g}s (a locked database fails at once instead of waiting)")
    if str(options.get("transaction_mode", "")).upper() != "IMMEDIATE":
        problems.append(
            "transactions not IMMEDIATE (two transactions upgrading to writers at once: one fails with"
            " 'database is locked' whatever the timeout)"
        )
    return problems


FIX = _FIX

__all__ = ["FIX", "MIN_BUSY_TIMEOUT", "in_memory", "multiprocess_problems"]
