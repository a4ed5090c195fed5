"""Exit 0 if the database at URL answers (creating the database if missing), else say why.

python scripts/probe_database.py mysql://root@127.0.0.1:3306/resource_lease
python scripts/probe_database.py --no-create URL   # create nothing: a missing database is said

With ``--no-create`` (``scripts/test --plan``) a server that answers is enough; a database
that is missing is printed ("missing: the run would create it") and the exit status is 0.
"""

from __future__ import annotations

import sys
from urllib.parse import urlsplit

#: What ``--no-create`` prints for a database that is not there.
MISSING = "missing: the run would create it"


def main(url: str, *, create: bool = True) -> str | None:
    """Why the database cannot be used (None: it can); with ``create=False`` nothing is
    created, and a missing database goes to ``notes`` (printed, not a failure)."""
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
        cursor = conn.cursor()
        if create:
            cursor.execute(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4")
        elif not cursor.execute("SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s", (name,)):
            notes.append(MISSING)
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
            if create:
                conn.execute(f'CREATE DATABASE "{name}"')
            else:
                notes.append(MISSING)
        conn.close()
        return None
    return f"unsupported URL scheme {parts.scheme!r}"


notes: list[str] = []

if __name__ == "__main__":
    args = sys.argv[1:]
    create = "--no-create" not in args
    problem = main([a for a in args if a != "--no-create"][0], create=create)
    if problem:
        print(problem)
        sys.exit(1)
    for note in notes:
        print(note)
