"""Exit 0 if the database at URL answers (creating the database if missing), else say why.

python scripts/probe_database.py mysql://root@127.0.0.1:3306/resource_lease
"""

from __future__ import annotations

import sys
from urllib.parse import urlsplit


def main(url: str) -> str | None:
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if parts.scheme.startswith("mysql"):
        try:
            import MySQLdb
        except ImportError:
            return "mysqlclient is not installed (it needs the MariaDB client headers to build)"
        try:
            conn = MySQLdb.connect(
                host=parts.hostname or "localhost",
                port=parts.port or 3306,
                user=parts.username or "root",
                password=parts.password or "",
                connect_timeout=3,
            )
        except MySQLdb.Error as exc:
            return f"no MariaDB/MySQL server answers at {parts.hostname}:{parts.port or 3306} ({exc})"
        conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4")
        conn.close()
        return None
    if parts.scheme.startswith("postgres"):
        try:
            import psycopg
        except ImportError:
            return "psycopg is not installed"
        try:
            conn = psycopg.connect(
                host=parts.hostname or "localhost",
                port=parts.port or 5432,
                user=parts.username or "postgres",
                password=parts.password or None,
                dbname="postgres",
                connect_timeout=3,
                autocommit=True,
            )
        except psycopg.Error as exc:
            return f"no PostgreSQL server answers at {parts.hostname}:{parts.port or 5432} ({exc})"
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
        conn.close()
        return None
    return f"unsupported URL scheme {parts.scheme!r}"


if __name__ == "__main__":
    problem = main(sys.argv[1])
    if problem:
        print(problem)
        sys.exit(1)
