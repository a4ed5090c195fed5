"""Recommended DATABASES entries per vendor, for projects that configure by URL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dj_database_url


def database_from_url(url: str, *, test_dir: Path | None = None) -> dict[str, Any]:
    """A DATABASES entry for ``url`` (mysql://, postgres://, sqlite://) set up for leasing.

    - MySQL/MariaDB: UTC session time zone whatever the server's (PITFALLS 3), utf8mb4,
      READ COMMITTED.
    - SQLite: WAL, a busy timeout and IMMEDIATE transactions so several processes can lease
      at once (PITFALLS 10); tests use a file (``test_dir``), never memory, so worker
      processes see the same database.
    - PostgreSQL: as dj-database-url gives it.
    """
    config: dict[str, Any] = dict(dj_database_url.parse(url, conn_max_age=0))
    options: dict[str, Any] = dict(config.get("OPTIONS") or {})
    engine = config["ENGINE"]
    if engine.endswith("mysql"):
        options.setdefault("charset", "utf8mb4")
        options.setdefault("init_command", "SET time_zone = '+00:00'")
        options.setdefault("isolation_level", "read committed")
        config["TEST"] = {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"}
    elif engine.endswith("sqlite3"):
        options.setdefault("init_command", "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;")
        options.setdefault("transaction_mode", "IMMEDIATE")
        options.setdefault("timeout", 30)
        if test_dir is not None:
            name = Path(str(config["NAME"])).stem
            config["TEST"] = {"NAME": str(test_dir / f"test_{name}.sqlite3")}
    config["OPTIONS"] = options
    return config
