"""The lease statements, written once with the few pieces that differ per vendor left open.

A dialect runs on the raw DB-API cursor of a Django connection (native paramstyle, no
Django cursor wrapper), because the lease statements are on the hot path and need
vendor features the ORM does not expose (UPDATE ... RETURNING, LIMIT on UPDATE,
SKIP LOCKED, LAST_INSERT_ID). Everything vendor-specific lives in this package.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field
from django.db.models.base import DEFERRED

from resource_lease.models import NEVER, Resource

Row = Sequence[Any]


class Failure(Enum):
    """How the engine should treat a database error."""

    #: The statement was rolled back at once and may simply be run again (deadlock,
    #: serialization failure).
    TRANSIENT = "transient"
    #: The statement waited the whole bounded lock wait and was rolled back.
    LOCK_TIMEOUT = "lock_timeout"
    #: The connection is gone; the statement may or may not have committed.
    DISCONNECT = "disconnect"
    #: Anything else: a bug or a misconfiguration, raised to the caller.
    FATAL = "fatal"


class Dialect:
    """The lease statements for one vendor.

    Subclasses set the SQL fragments (``now``, the expiry expression, the placeholder) and
    override ``acquire`` where the vendor's way of returning the chosen row differs.
    """

    vendor = ""
    placeholder = "%s"
    #: One writer for the whole database (SQLite): a caller's open write transaction blocks
    #: every other connection, the engine's included, so acquiring inside it must be refused.
    single_writer = False
    #: The database's clock, in UTC, as an SQL expression.
    now_sql = ""

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        qn = connection.ops.quote_name
        meta = Resource._meta
        self.alias = connection.alias
        self.table = qn(meta.db_table)
        self.fields: list[Field[Any, Any]] = list(meta.concrete_fields)
        self.columns = ", ".join(qn(f.column) for f in self.fields)
        self.attnames = [f.attname for f in self.fields]
        # Only the columns that need converting (datetimes, JSON, booleans on some vendors).
        self._converting = [
            (i, funcs) for i, f in enumerate(self.fields) if (funcs := self._converters_for(connection, f))
        ]
        self._datetime_converters = self._converters_for(connection, meta.get_field("busy_before"))
        self.connection = connection
        p = self.placeholder
        now = self.now_sql
        # Where the lease condition of a grant is checked: ours (holder and fence in the
        # WHERE, because Django's MySQL backend counts the rows an UPDATE matched, not the
        # rows it changed), not given back (a release or force release clears
        # the token, and may leave busy_before in the future: the end of a quarantine), and
        # not yet expired by the database's clock.
        self.ours = f"id = {p} AND holder = {p} AND fence = {p} AND grant_token <> '' AND busy_before > {now}"
        self.free = (
            f"kind = {p} AND busy_before <= {now} AND enabled = {self.true}"
            f" AND (quarantined_until IS NULL OR quarantined_until <= {now})"
        )
        # The grant's SET list. Order matters on MySQL, which evaluates assignments left to
        # right with already-updated values: read the old holder and token first.
        self.grant_set = (
            f"took_over = (grant_token <> ''), previous_holder = holder,"
            f" fence = fence + 1, holder = {p}, grant_token = {p},"
            f" busy_before = {self.expiry_sql()}, acquired_at = {now}, renewed_at = {now},"
            f" released_at = NULL"
        )
        # After release the row sorts as most recently used; a quarantine decided while it
        # was held takes effect now by pushing busy_before out of the acquire's index range.
        self.freed_at = f"CASE WHEN quarantined_until > {now} THEN quarantined_until ELSE {now} END"

    true = "TRUE"
    false = "FALSE"
    #: Between the table and WHERE of a read of the acquire index (MySQL names the index).
    index_hint = ""
    #: The acquire index's order for the free rows of one kind.
    free_order = "busy_before"
    #: ``INSERT ... <this>``: a row whose (kind, name) exists already is kept as it is.
    on_conflict_keep = "ON CONFLICT (kind, name) DO NOTHING"

    # -- vendor pieces ---------------------------------------------------------------

    def expiry_sql(self) -> str:
        """``now + ttl`` where the ttl (seconds, a float) is the statement's next parameter."""
        raise NotImplementedError

    def ttl_param(self, ttl: float) -> Any:
        return ttl

    def setup_session(self, raw_connection: Any, lock_wait_timeout: float) -> None:
        """Per-connection settings for the engine's own connections."""

    def connect(self, lock_wait_timeout: float) -> None:
        """Open this dialect's connection and set its session up (MySQL: on one of several
        cluster nodes)."""
        self.connection.ensure_connection()
        self.setup_session(self.connection.connection, lock_wait_timeout)

    def disconnected(self) -> None:
        """The connection was lost: the next ``connect`` may choose another server."""

    @staticmethod
    def connect_options(options: dict[str, Any], io_timeout: float) -> None:
        """Driver options (timeouts) for the engine's own connections; the user's win."""

    def classify(self, exc: BaseException) -> Failure:
        raise NotImplementedError

    # -- statements ------------------------------------------------------------------

    def acquire(self, cursor: Any, *, kind: str, holder: str, token: str, ttl: float) -> Row | None:
        """Grant any free resource of ``kind`` in one conditional statement; return its row."""
        raise NotImplementedError

    def free_rows(self, cursor: Any, *, kind: str, limit: int) -> tuple[list[Row], Any]:
        """Up to ``limit`` rows of ``kind`` free now, least recently used first, and the
        database's clock when they were read (raw): the sample ``acquire()`` probes (a hint
        only: every grant re-checks its row)."""
        cursor.execute(
            f"SELECT {self.columns}, {self.now_sql} FROM {self.table} {self.index_hint} WHERE {self.free}"
            f" ORDER BY {self.free_order} LIMIT {int(limit)}",
            (kind,),
        )
        rows = cursor.fetchall()
        if not rows:
            cursor.execute(f"SELECT {self.now_sql}")
            return [], cursor.fetchall()[0][0]
        return [row[:-1] for row in rows], rows[0][-1]

    def grant_sampled(
        self, cursor: Any, *, sampled: Row, kind: str, holder: str, token: str, ttl: float, clock: Any
    ) -> Row | None:
        """Grant the sampled row if it is free (``grant``); its row as granted.

        ``sampled`` is the row as the sample read it and ``clock`` estimates the database's
        clock now (``Clock``); a vendor whose grant cannot return the row cheaply may build
        it from them (MySQL), anything that decides the grant stays in the statement."""
        return self.grant(cursor, pk=sampled[0], kind=kind, holder=holder, token=token, ttl=ttl)

    def grant(self, cursor: Any, *, pk: int, kind: str, holder: str, token: str, ttl: float) -> Row | None:
        """Grant one chosen resource (the holder's lock step) if it is free; return its row.

        The same SET list as ``acquire`` (fence + 1, holder, token, expiry by the database's
        clock), conditional on the row being free; the matched-row count decides a race
        between callers that chose the same row.
        """
        p = self.placeholder
        return self.update_returning(
            cursor,
            f"UPDATE {self.table} SET {self.grant_set} WHERE id = {p} AND {self.free}",
            (holder, token, self.ttl_param(ttl), pk, kind),
            returning=self.columns,
            read_back=(f"id = {p} AND grant_token = {p}", (pk, token)),
        )

    def renew(self, cursor: Any, *, pk: int, holder: str, fence: int, ttl: float) -> dt.datetime | None:
        """Extend a live grant of ours; return the new expiry, or None if it is not ours."""
        p = self.placeholder
        row = self.update_returning(
            cursor,
            f"UPDATE {self.table} SET busy_before = {self.expiry_sql()}, renewed_at = {self.now_sql} WHERE {self.ours}",
            (self.ttl_param(ttl), pk, holder, fence),
            returning="busy_before",
            read_back=(f"id = {p} AND fence = {p}", (pk, fence)),
        )
        return None if row is None else self.to_datetime(row[0])

    def grant_named(self, cursor: Any, *, kind: str, name: str, holder: str, token: str, ttl: float) -> Row | None:
        """Grant the row (kind, name) if it is free; return its row (locks, elections, members).

        The same SET list and free condition as ``acquire``; the unique (kind, name) index
        finds the row, and the matched-row count decides the race.
        """
        p = self.placeholder
        return self.update_returning(
            cursor,
            f"UPDATE {self.table} SET {self.grant_set} WHERE name = {p} AND {self.free}",
            (holder, token, self.ttl_param(ttl), name, kind),
            returning=self.columns,
            read_back=(f"kind = {p} AND name = {p} AND grant_token = {p}", (kind, name, token)),
        )

    def limit_slots(self, cursor: Any, *, kind: str, below: str) -> int:
        """Enable the rows of ``kind`` whose name sorts before ``below`` and disable the others
        (a semaphore's slot count: slot names are zero-padded numbers). A held row that gets
        disabled keeps its holder; it is never granted again while disabled. Returns how many
        rows changed (none when the count is already in force)."""
        p = self.placeholder
        cursor.execute(
            f"UPDATE {self.table} SET enabled = (name < {p}) WHERE kind = {p} AND enabled <> (name < {p})",
            (below, kind, below),
        )
        return int(cursor.rowcount)

    def insert_missing(self, cursor: Any, *, kind: str, names: Sequence[str], data: str = "{}") -> None:
        """Create the rows (kind, name) that do not exist yet, free and never leased.

        Race-safe: a row that another connection creates at the same moment is kept as it is
        (no IntegrityError); ``data`` (JSON text) goes only into rows this statement creates.
        """
        if not names:
            return
        p = self.placeholder
        never = self.connection.ops.adapt_datetimefield_value(NEVER)
        row = f"({p}, {p}, {p}, {self.true}, {p}, '', 0, '', {self.false}, '', '', {self.now_sql})"
        params: list[Any] = []
        for name in names:
            params += [kind, name, data, never]
        cursor.execute(
            f"INSERT INTO {self.table} (kind, name, data, enabled, busy_before, holder, fence, grant_token,"
            f" took_over, previous_holder, quarantine_reason, created_at)"
            f" VALUES {', '.join([row] * len(names))} {self.on_conflict_keep}",
            params,
        )

    def read_named(self, cursor: Any, *, kind: str, names: Sequence[str] | None = None) -> tuple[list[Row], Any]:
        """The rows of ``kind`` (only ``names`` if given; in no order), and the database's
        clock when they were read (raw; ``to_datetime`` converts it)."""
        p = self.placeholder
        where, params = f"kind = {p}", [kind]
        if names is not None:
            if not names:
                return [], None
            where += f" AND name IN ({', '.join([p] * len(names))})"
            params += list(names)
        cursor.execute(f"SELECT {self.columns}, {self.now_sql} FROM {self.table} WHERE {where}", params)
        rows = cursor.fetchall()
        if not rows:
            cursor.execute(f"SELECT {self.now_sql}")
            return [], cursor.fetchall()[0][0]
        return [row[:-1] for row in rows], rows[0][-1]

    def update_returning(
        self, cursor: Any, update: str, params: Sequence[Any], *, returning: str, read_back: tuple[str, Sequence[Any]]
    ) -> Row | None:
        """Run a single-row ``update``; the ``returning`` columns of the row it changed, or None
        if it matched none. Here ``UPDATE ... RETURNING``; a vendor without it reads the row
        back by ``read_back`` (a WHERE clause and its parameters naming that row)."""
        cursor.execute(f"{update} RETURNING {returning}", params)
        rows = cursor.fetchall()  # every row: SQLite ends the statement (and its lock) only then
        return rows[0] if rows else None

    def release(self, cursor: Any, *, pk: int, holder: str, fence: int) -> bool:
        cursor.execute(
            f"UPDATE {self.table} SET busy_before = {self.freed_at}, released_at = {self.now_sql},"
            f" grant_token = '' WHERE {self.ours}",
            (pk, holder, fence),
        )
        return bool(cursor.rowcount == 1)

    def write_data(self, cursor: Any, *, pk: int, holder: str, fence: int, data: str) -> bool:
        """Replace a live grant's payload (JSON text) if the grant is still ours: a fenced write."""
        cursor.execute(
            f"UPDATE {self.table} SET data = {self.placeholder} WHERE {self.ours}", (data, pk, holder, fence)
        )
        return bool(cursor.rowcount == 1)

    def was_released(self, cursor: Any, *, pk: int, holder: str, fence: int) -> bool:
        """Whether this grant (holder and fence) has been given back: its token cleared.

        Settles a release whose answer was lost; an operator's force_release counts too
        (the grant was ours and the resource is free).
        """
        p = self.placeholder
        cursor.execute(
            f"SELECT 1 FROM {self.table} WHERE id = {p} AND holder = {p} AND fence = {p} AND grant_token = ''",
            (pk, holder, fence),
        )
        return bool(cursor.fetchall())

    def is_held(self, cursor: Any, *, pk: int, holder: str, fence: int) -> bool:
        cursor.execute(f"SELECT 1 FROM {self.table} WHERE {self.ours}", (pk, holder, fence))
        return bool(cursor.fetchall())

    def find_grant(self, cursor: Any, *, kind: str, token: str) -> Row | None:
        """The row granted under ``token``, if that grant committed and is still live."""
        p = self.placeholder
        cursor.execute(
            f"SELECT {self.columns} FROM {self.table}"
            f" WHERE kind = {p} AND grant_token = {p} AND busy_before > {self.now_sql}",
            (kind, token),
        )
        rows = cursor.fetchall()
        return rows[0] if rows else None

    def kind_exists(self, cursor: Any, kind: str) -> bool:
        cursor.execute(f"SELECT 1 FROM {self.table} WHERE kind = {self.placeholder} LIMIT 1", (kind,))
        return bool(cursor.fetchall())

    # -- rows ------------------------------------------------------------------------

    @staticmethod
    def _converters_for(
        connection: BaseDatabaseWrapper, field: Field[Any, Any]
    ) -> list[tuple[Callable[..., Any], Any]]:
        # The same converters Django's SQL compiler applies to a selected column.
        col = field.get_col(Resource._meta.db_table)
        funcs = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
        return [(func, col) for func in funcs]

    def to_resource(self, row: Row) -> Resource:
        """The Resource of a raw row; a value that is ``DEFERRED`` is loaded on first access."""
        values = list(row)
        for i, converters in self._converting:
            if values[i] is DEFERRED:
                continue
            for func, col in converters:
                values[i] = func(values[i], col, self.connection)
        return Resource.from_db(self.alias, self.attnames, values)

    def to_datetime(self, value: Any) -> dt.datetime:
        for func, col in self._datetime_converters:
            value = func(value, col, self.connection)
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value
