"""The statements of notifications and live configuration, per vendor.

Every change is one upsert judged by the database: it creates the row on first use (two
processes using a new name at once create one row) or raises its ``version`` by one, and
hands back the new version from the same statement (``RETURNING``; on MySQL/MariaDB
``version = LAST_INSERT_ID(version + 1)`` read back in the same round trip, see
docs/pitfalls.md#no-returning). On PostgreSQL the same statement also calls ``pg_notify``, so
the wake-up is sent exactly when the change commits; ``Listener`` is the watcher's side of
it. Reads are one indexed row per topic (a namespace's few rows for a configuration).

JSON travels as text both ways (PostgreSQL casts it), so a payload reads back the same on
every vendor whatever loaders the driver has registered.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Sequence
from typing import Any

from django.db import connections

from resource_lease.db.base import Dialect
from resource_lease.models import ConfigEntry, Topic

logger = logging.getLogger("resource_lease")


def channel(kind: str, name: str) -> str:
    """The PostgreSQL NOTIFY channel of a topic or a config namespace: a fixed-length
    identifier (names may be 200 characters; channels at most 63)."""
    return "rl_" + hashlib.md5(f"{kind}:{name}".encode(), usedforsecurity=False).hexdigest()


class Statements:
    """The statements for one vendor, on a dialect's connection (``connections.run``)."""

    def __init__(self, dialect: Dialect) -> None:
        qn = dialect.connection.ops.quote_name
        self.p = dialect.placeholder
        self.now = dialect.now_sql
        self.topics = qn(Topic._meta.db_table)
        self.configs = qn(ConfigEntry._meta.db_table)
        self.q = qn

    # -- vendor pieces ---------------------------------------------------------------

    def json_param(self) -> str:
        return self.p

    def json_text(self, column: str) -> str:
        return column

    def wake(self, bump_sql: str) -> str:
        """The upsert ``bump_sql`` answering its new version, and waking watchers when it
        commits where the vendor can (then the channel is its last parameter)."""
        return f"{bump_sql} RETURNING {self.q('version')}"

    wakes = False

    def upsert(self, table: str, conflict: Sequence[str], update: str) -> str:
        """The ON CONFLICT clause of an upsert that raises ``version`` (and sets ``update``)."""
        cols = ", ".join(self.q(c) for c in conflict)
        return f"ON CONFLICT ({cols}) DO UPDATE SET {self.q('version')} = {table}.{self.q('version')} + 1, {update}"

    def excluded(self, column: str) -> str:
        return f"excluded.{self.q(column)}"

    def run_bump(self, cursor: Any, sql: str, params: Sequence[Any]) -> int:
        cursor.execute(sql, params)
        # Every row: SQLite ends the statement (and its lock) only then (docs/pitfalls.md#sqlite).
        rows = cursor.fetchall()
        return int(rows[0][0])

    # -- statements ------------------------------------------------------------------

    def notify(self, cursor: Any, name: str, payload: str, wake_channel: str) -> int:
        """Create or bump topic ``name`` with ``payload`` (JSON text); its new version."""
        q, p = self.q, self.p
        sql = (
            f"INSERT INTO {self.topics} ({q('name')}, {q('version')}, {q('payload')}, {q('updated_at')})"
            f" VALUES ({p}, 1, {self.json_param()}, {self.now})"
            f" {self.upsert(self.topics, ['name'], self._set_from_new(['payload', 'updated_at']))}"
        )
        params: list[Any] = [name, payload]
        if self.wakes:
            params.append(wake_channel)
        return self.run_bump(cursor, self.wake(sql), params)

    def read_topic(self, cursor: Any, name: str) -> tuple[int, str | None] | None:
        """``(version, payload JSON text)`` of topic ``name``, None if it was never notified."""
        q = self.q
        cursor.execute(
            f"SELECT {q('version')}, {self.json_text(q('payload'))} FROM {self.topics} WHERE {q('name')} = {self.p}",
            (name,),
        )
        rows = cursor.fetchall()
        return None if not rows else (int(rows[0][0]), rows[0][1])

    def declare(self, cursor: Any, namespace: str, key: str, type_name: str, default: str) -> None:
        """Record the key's type and default (for the admin); its value and version stay."""
        q, p, j = self.q, self.p, self.json_param()
        cursor.execute(
            f"INSERT INTO {self.configs} ({q('namespace')}, {q('key')}, {q('type')}, {q('default')}, {q('value')},"
            f" {q('version')}, {q('updated_at')}) VALUES ({p}, {p}, {p}, {j}, NULL, 0, {self.now})"
            f" {self._declare_conflict()}",
            (namespace, key, type_name, default),
        )

    def _declare_conflict(self) -> str:
        cols = ", ".join(self.q(c) for c in ("namespace", "key"))
        sets = ", ".join(f"{self.q(c)} = {self.excluded(c)}" for c in ("type", "default"))
        return f"ON CONFLICT ({cols}) DO UPDATE SET {sets}"

    def set_value(
        self, cursor: Any, namespace: str, key: str, type_name: str, default: str, value: str | None, wake_channel: str
    ) -> int:
        """Store ``value`` (JSON text, None: back to the default) and raise the key's version."""
        q, p, j = self.q, self.p, self.json_param()
        value_sql = "NULL" if value is None else j
        sql = (
            f"INSERT INTO {self.configs} ({q('namespace')}, {q('key')}, {q('type')}, {q('default')}, {q('value')},"
            f" {q('version')}, {q('updated_at')}) VALUES ({p}, {p}, {p}, {j}, {value_sql}, 1, {self.now})"
            f" {self.upsert(self.configs, ['namespace', 'key'], self._set_from_new(['value', 'updated_at']))}"
        )
        params: list[Any] = [namespace, key, type_name, default]
        if value is not None:
            params.append(value)
        if self.wakes:
            params.append(wake_channel)
        return self.run_bump(cursor, self.wake(sql), params)

    def read_namespace(self, cursor: Any, namespace: str) -> list[tuple[str, str | None, int]]:
        """``(key, value JSON text or None, version)`` of every stored key of ``namespace``."""
        q = self.q
        cursor.execute(
            f"SELECT {q('key')}, {self.json_text(q('value'))}, {q('version')} FROM {self.configs}"
            f" WHERE {q('namespace')} = {self.p}",
            (namespace,),
        )
        return [(str(k), v, int(n)) for k, v, n in cursor.fetchall()]

    def _set_from_new(self, columns: Sequence[str]) -> str:
        return ", ".join(f"{self.q(c)} = {self.excluded(c)}" for c in columns)


class SQLiteStatements(Statements):
    pass


class PostgreSQLStatements(Statements):
    wakes = True

    def json_param(self) -> str:
        return "CAST(%s AS jsonb)"

    def json_text(self, column: str) -> str:
        return f"{column}::text"

    def wake(self, bump_sql: str) -> str:
        # pg_notify in the same statement: the wake-up is queued in the bump's own
        # transaction and delivered when (and only if) it commits.
        return (
            f"WITH bumped AS ({bump_sql} RETURNING {self.q('version')})"
            " SELECT version, pg_notify(%s, version::text) FROM bumped"
        )


class MySQLStatements(Statements):
    def upsert(self, table: str, conflict: Sequence[str], update: str) -> str:
        # LAST_INSERT_ID(expr) remembers the new version for this session: the bump and its
        # answer are one statement, so no other change can slip in between (a read-back by
        # name could see a later version).
        v = self.q("version")
        return f"ON DUPLICATE KEY UPDATE {v} = LAST_INSERT_ID({v} + 1), {update}"

    def excluded(self, column: str) -> str:
        return f"VALUES({self.q(column)})"

    def wake(self, bump_sql: str) -> str:
        return bump_sql  # the new version is read back by run_bump

    def _declare_conflict(self) -> str:
        sets = ", ".join(f"{self.q(c)} = {self.excluded(c)}" for c in ("type", "default"))
        return f"ON DUPLICATE KEY UPDATE {sets}"

    def run_bump(self, cursor: Any, sql: str, params: Sequence[Any]) -> int:
        # Sent with its read as one query (the engine's connections allow several
        # statements). Affected rows (CLIENT.FOUND_ROWS, docs/pitfalls.md#found-rows): 1
        # inserted (version 1), 2 updated.
        cursor.execute(f"{sql}; SELECT LAST_INSERT_ID()", params)
        inserted = cursor.rowcount == 1
        if not cursor.nextset():
            raise RuntimeError("the read of a pipelined upsert; SELECT returned no result")
        rows = cursor.fetchall()
        return 1 if inserted else int(rows[0][0])


def statements(dialect: Dialect) -> Statements:
    """The notification statements for a dialect, cached on it."""
    cached: Statements | None = getattr(dialect, "_topic_statements", None)
    if cached is None:
        cls = {"mysql": MySQLStatements, "postgresql": PostgreSQLStatements}.get(dialect.vendor, SQLiteStatements)
        cached = cls(dialect)
        dialect._topic_statements = cached  # type: ignore[attr-defined]
    return cached


# -- PostgreSQL LISTEN ------------------------------------------------------------------


class Listener:
    """A dedicated PostgreSQL connection LISTENing on one channel, owned by one thread.

    ``wait`` returns early when a NOTIFY arrives; any failure of the connection closes it and
    is raised, so the caller falls back to polling and opens a new listener later.
    """

    #: Longest single wait on the socket, so ``stop`` is noticed promptly.
    SLICE = 0.2

    def __init__(self, alias: str, wake_channel: str) -> None:
        from resource_lease.db.connections import LeaseConnection

        self._conn = LeaseConnection(alias)
        wrapper = self._conn.wrapper
        wrapper.ensure_connection()
        self.raw: Any = wrapper.connection
        self.raw.autocommit = True
        self.raw.execute(f'LISTEN "{wake_channel}"')

    def backend_pid(self) -> int:
        return int(self.raw.info.backend_pid)

    def wait(self, timeout: float, stop: threading.Event) -> bool:
        """Wait up to ``timeout`` s for a notification (True) or ``stop`` (False)."""
        import time

        deadline = time.monotonic() + timeout
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            got = list(self.raw.notifies(timeout=min(left, self.SLICE), stop_after=1))
            if got:
                # Drain what else arrived: one read covers them all.
                list(self.raw.notifies(timeout=0))
                return True
        return False

    def close(self) -> None:
        self._conn.close()


def listener(alias: str, wake_channel: str) -> Listener | None:
    """A listener on ``wake_channel`` where the database can push wake-ups (PostgreSQL)."""
    if connections[alias].vendor != "postgresql":
        return None
    return Listener(alias, wake_channel)
