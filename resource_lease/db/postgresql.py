"""PostgreSQL: UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING."""

from __future__ import annotations

from typing import Any

from resource_lease.db import NOW_SQL
from resource_lease.db.base import Dialect, Failure, Row
from resource_lease.db.statements import FREE, Returning

# SQLSTATEs after which the statement was rolled back and can run again.
_TRANSIENT = {"40001", "40P01"}  # serialization failure, deadlock
_LOCK_TIMEOUT = {"55P03", "57014"}  # lock_timeout, statement_timeout
# Class 08 (connection exception) and the server shutting down or killing the backend.
_DISCONNECT_PREFIXES = ("08", "57P0")

# The acquire. SKIP LOCKED: contenders never queue behind a row another acquire is granting
# (docs/pitfalls.md#index-locks). (holder, token, ttl, kind)
ACQUIRE_SCAN = Returning(
    "UPDATE {table} SET {grant_set}"
    " WHERE id = (SELECT id FROM {table} WHERE {free}"
    " ORDER BY busy_before LIMIT 1 FOR UPDATE SKIP LOCKED)"
)

# The free condition of a row already chosen by primary key. The kind is compared as an
# expression, which no index serves: with statistics older than the pool (a kind seeded after
# the last ANALYZE is estimated at one row), the planner would otherwise walk the (kind, ...)
# indexes over every row of the kind and filter on id (docs/pitfalls.md#stale-statistics).
FREE_BY_ID = FREE.replace("kind = {p}", "kind || '' = {p}", 1)

# Grant one chosen row (the holder's lock step): (holder, token, ttl, id, kind).
GRANT_BY_ID = Returning("UPDATE {table} SET {grant_set} WHERE id = {p} AND " + FREE_BY_ID)

# The probe's grant, by primary key, and SKIP LOCKED: a free row that another transaction has
# locked (an operator's edit, a SELECT ... FOR UPDATE) is a miss, not a wait.
# (holder, token, ttl, id, kind)
GRANT_SAMPLED = Returning(
    "UPDATE {table} SET {grant_set}"
    " WHERE id = (SELECT id FROM {table} WHERE id = {p} AND " + FREE_BY_ID + " FOR UPDATE SKIP LOCKED)"
)


#: Executions of one statement on a connection before psycopg prepares it (psycopg's default):
#: a lease statement is prepared on its sixth run, a one-off read never.
PREPARE_THRESHOLD = 5


class PostgreSQLDialect(Dialect):
    vendor = "postgresql"
    # statement_timestamp() is the statement's start even inside a transaction (now() is
    # frozen at the transaction's BEGIN, so a long transaction would judge expiries by an
    # old clock) and, being stable, lets the planner use the index
    # (docs/pitfalls.md#database-clock).
    now_sql = NOW_SQL["postgresql"]
    templates = {
        **Dialect.templates,
        "ACQUIRE_SCAN": ACQUIRE_SCAN,
        "GRANT_BY_ID": GRANT_BY_ID,
        "GRANT_SAMPLED": GRANT_SAMPLED,
    }

    def expiry_sql(self) -> str:
        return f"{self.now_sql} + make_interval(secs => %s)"

    def ttl_param(self, ttl: float) -> Any:
        return float(ttl)

    def setup_session(self, raw_connection: Any, lock_wait_timeout: float) -> None:
        with raw_connection.cursor() as cursor:
            cursor.execute(
                "SELECT set_config('lock_timeout', %s, false), set_config('statement_timeout', %s, false)",
                (f"{int(lock_wait_timeout * 1000)}ms", f"{int(lock_wait_timeout * 2000)}ms"),
            )

    @staticmethod
    def connect_options(options: dict[str, Any], io_timeout: float, *, prepared: bool) -> None:
        options.setdefault("connect_timeout", max(2, round(io_timeout)))
        # TCP keepalives notice a vanished server while a renewal waits for an answer
        # (docs/pitfalls.md#dropped-connections).
        options.setdefault("keepalives_idle", max(1, round(io_timeout)))
        options.setdefault("keepalives_interval", 1)
        options.setdefault("keepalives_count", 3)
        # Parse and plan each lease statement once per connection: bound parameters (Django's
        # default binds them into the text, which PostgreSQL must then parse and plan on every
        # execution: about 0.18 ms of server CPU per lease cycle here, docs/benchmarks.md) and
        # psycopg's automatic prepared statements. An alias that chose either itself keeps its
        # choice (docs/pitfalls.md#prepared-statements).
        if prepared and "server_side_binding" not in options and "prepare_threshold" not in options:
            options["server_side_binding"] = True
            options["prepare_threshold"] = PREPARE_THRESHOLD

    def grant_sampled(
        self, cursor: Any, *, sampled: Row, kind: str, holder: str, token: str, ttl: float, clock: Any
    ) -> Row | None:
        return self.returning_row(
            cursor, self.sql["GRANT_SAMPLED"], (holder, token, self.ttl_param(ttl), sampled[0], kind)
        )

    def classify(self, exc: BaseException) -> Failure:
        import psycopg

        sqlstate = getattr(exc, "sqlstate", None) or ""
        if sqlstate in _TRANSIENT:
            return Failure.TRANSIENT
        if sqlstate in _LOCK_TIMEOUT:
            return Failure.LOCK_TIMEOUT
        if sqlstate.startswith(_DISCONNECT_PREFIXES):
            return Failure.DISCONNECT
        if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)) and not sqlstate:
            return Failure.DISCONNECT  # the socket closed under us: no server answer at all
        return Failure.FATAL
