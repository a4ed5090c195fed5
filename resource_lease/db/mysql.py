"""MySQL and MariaDB: UPDATE ... ORDER BY ... LIMIT 1, the chosen id handed back by LAST_INSERT_ID.

Neither has UPDATE ... RETURNING (docs/pitfalls.md#no-returning). ``SET id =
LAST_INSERT_ID(id)`` makes the server remember the updated row's id, so the race is decided
by one statement on the lease table's own columns (on MySQL, an ORM update whose filter needs
a join or a subquery on the same table is split into a SELECT and an UPDATE that does not
re-check it, so two workers could both win: docs/pitfalls.md#split-update) and the row is
then read by that id and the grant's token. The read travels in the same round trip as the
UPDATE: the engine's own connections are opened with CLIENT.MULTI_STATEMENTS, and the two
statements are sent as one query (each still its own autocommit transaction, the UPDATE's
result read first). rowcount counts matched rows (CLIENT.FOUND_ROWS, which an
``OPTIONS["client_flag"]`` in settings would silently drop: docs/pitfalls.md#found-rows):
every condition that decides ownership is in the WHERE.

On a MariaDB Galera node (``wsrep_on``) the sessions also wait for causality, errors of nodes
that cannot serve are classified, and an alias that lists several nodes fails over between
them: see ``resource_lease.db.galera`` (docs/pitfalls.md#galera).
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.base import DEFERRED

from resource_lease.conf import lease_settings
from resource_lease.db import counters as counter_sql
from resource_lease.db import dispenser as item_sql
from resource_lease.db import galera, statements
from resource_lease.db import terms as term_sql
from resource_lease.db import topics as topic_sql
from resource_lease.db.base import Dialect, Failure, Row
from resource_lease.db.clock import NOW_SQL
from resource_lease.db.grants import LeaseStatements
from resource_lease.db.line import NEWCOMER, Ask, Turn, own
from resource_lease.db.statements import Returning

ACQUIRE_INDEX = "resource_lease_acquire_idx"  # models.Resource.Meta.indexes

# Server errors after which the statement was rolled back and can run again.
# Galera reports a write set that failed certification (another node's write to the same row
# won) as a deadlock, 1213, after its own retry of an autocommit statement.
_TRANSIENT = {1213, 1614}  # deadlock (or certification conflict), transaction branch rolled back
_LOCK_TIMEOUT = {1205, 1969, 3024}  # innodb_lock_wait_timeout, MariaDB max_statement_time, MySQL max_execution_time


def _found_row_locked(exc: Exception) -> bool:
    """Whether a grant that must not wait gave up on a row another transaction has locked."""
    return bool(exc.args) and exc.args[0] in _LOCK_TIMEOUT


# Client and server errors meaning the connection is gone.
_DISCONNECT = {2002, 2003, 2006, 2013, 2026, 2055, 4031, 1053, 1927}
#: MySQLdb.constants.CLIENT.FOUND_ROWS (the MySQL protocol's CLIENT_FOUND_ROWS), without
#: importing the driver for a check (docs/pitfalls.md#found-rows).
_CLIENT_FOUND_ROWS = 2
#: "BIGINT value is out of range": a counter's sum would leave BIGINT (nothing changed).
ER_DATA_OUT_OF_RANGE = 1690
ER_MAX_PREPARED_STMT_COUNT_REACHED = 1461
ER_UNKNOWN_STMT_HANDLER = 1243


# The probe's LAST_INSERT_ID: fence << 25 | took_over << 24 | the clock's low 24 bits (us).
_CLOCK_BITS = 24
_CLOCK_MASK = (1 << _CLOCK_BITS) - 1
_FENCE_SHIFT = _CLOCK_BITS + 1
_FENCE_LIMIT = 1 << 37  # (fence + 1) << 25 stays inside a signed BIGINT
_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_UTC = _EPOCH.replace(tzinfo=dt.UTC)
_MICROSECOND = dt.timedelta(microseconds=1)
_HALF_SPAN = 1 << (_CLOCK_BITS - 1)


# -- the statements that differ on MySQL (resource_lease.db.statements has the others) -------

# No RETURNING: the changed row is read back in the same round trip, the UPDATE and the
# SELECT sent as one query (docs/pitfalls.md#no-returning).
RETURNING = "{update}; SELECT {returning} FROM {table} WHERE {read_back}"

# The acquire, where a locking read cannot skip locked rows. FORCE INDEX and ORDER BY the
# whole index prefix: without them a small table is planned as a scan plus filesort that
# reads and locks every free row of the kind, so one open transaction on any of them (a fenced
# write) held up every acquire (InnoDB's UPDATE locks every index record it scans:
# docs/pitfalls.md#index-locks). LAST_INSERT_ID() is the granted row's id when the UPDATE
# matched; when it did not, it is some earlier id, but the fresh token matches no row then.
# (holder, token, ttl, lock_delay, kind, *line, [where]), read back by (token)
ACQUIRE_SCAN = Returning(
    "UPDATE {table} {index_hint} SET {grant_set}, id = LAST_INSERT_ID(id)"
    " WHERE {grantable} ORDER BY kind, busy_before LIMIT 1",
    read_back="id = LAST_INSERT_ID() AND grant_token = {p}",
)

# MariaDB 10.6+ / MySQL 8: the row is chosen by a locking read that skips rows other acquires
# are granting, inside the same single statement, so contenders spread over the free rows
# instead of queueing behind the first one's commit (docs/pitfalls.md#index-locks). The outer
# condition re-checks the locked row's current version. The picked row drives the join
# (STRAIGHT_JOIN, then r by primary key): joined the other way round, MariaDB scans and locks
# every row of the table, waiting on any row lock held anywhere (a fenced write on another
# resource). (kind, *line, [where], holder, token, ttl, lock_delay), read back by (token)
ACQUIRE_SCAN_SKIP_LOCKED = Returning(
    "UPDATE (SELECT id FROM {table} {index_hint} WHERE {grantable}"
    " ORDER BY kind, busy_before LIMIT 1 FOR UPDATE SKIP LOCKED) AS pick"
    " STRAIGHT_JOIN {table} AS r ON r.id = pick.id"
    " SET {grant_set}, r.id = LAST_INSERT_ID(r.id) WHERE r.busy_before <= {now}",
    read_back="id = LAST_INSERT_ID() AND grant_token = {p}",
)

# A grant in the line form (LINE_CLEAR) is never the join above: in a multi-table UPDATE every
# read is a locking read, so the line's subqueries would take shared locks on the waiters'
# rows and on the free rows they count, and deadlock with the waiters leaving the line and with
# the other grants' SKIP LOCKED picks (docs/pitfalls.md#locking-subqueries). A single-table
# UPDATE under READ COMMITTED reads its subqueries as a consistent read, without locks. So a
# caller in line first reads some free rows (a plain SELECT: no locks), then tries them one by
# one by primary key: LINE_PICKS, then GRANT_LINE (MariaDB: not waiting for a row another
# grant has locked, like the probe; MySQL: GRANT_BY_ID). (kind, [where], [target])
LINE_PICKS = (
    "SELECT id FROM {table} {index_hint} WHERE {free} AND {delay_over}{own_filter}{own_target}"
    " ORDER BY kind, busy_before LIMIT {limit}"
)
# (holder, token, ttl, lock_delay, id, kind, *line, [where]), read back by (id, token).
GRANT_LINE_NOWAIT = Returning(
    "SET STATEMENT innodb_lock_wait_timeout = 0 FOR UPDATE {table} SET {grant_set} WHERE id = {p} AND {grantable}",
    read_back="id = {p} AND grant_token = {p}",
)

# A look lists the free rows it counts (their ids, comma-separated; NULL for none), so that a
# waiter's try right after it need not read them again (acquire_in_line): LOOK_FREE in
# statements.py with GROUP_CONCAT for COUNT. group_concat_max_len is raised per session
# (setup_session: 1024 bytes by default on MySQL, 20-digit ids overflow it at 52 rows).
LOOK_FREE = (
    "(SELECT GROUP_CONCAT(id) FROM (SELECT id FROM {table} {index_hint} WHERE {free} AND {delay_over}{own_filter}{own_target}"
    " LIMIT {limit}) f)"
)

# The probe's LAST_INSERT_ID (the packing above).
PROBE_PACKED = (
    "(fence + 1) * {fence_unit} + took_over * {took_over_unit}"
    " + MOD(FLOOR(UNIX_TIMESTAMP({now}) * 1000000), {clock_span})"
)

# The probe's fence assignment, which replaces GRANT_SET's ``fence = fence + 1``: it also hands
# the packing back. took_over is assigned first (left to right: docs/pitfalls.md#set-order),
# so the packing reads this grant's; past the limit the fence goes up alone and the row is read back.
PROBE_FENCE = (
    "fence = CASE WHEN fence < {fence_limit} THEN LAST_INSERT_ID({probe_packed}) DIV {fence_unit}"
    " ELSE fence + 1 + LAST_INSERT_ID(0) END"
)

# The probe's SET list: GRANT_SET (statements.py) with PROBE_FENCE for its fence, as
# tests/test_statements.py checks.
PROBE_SET = (
    "took_over = (grant_token <> ''), previous_holder = holder,"
    " {probe_fence}, holder = {p}, grant_token = {p},"
    " busy_before = {expiry}, acquired_at = {now}, renewed_at = {now},"
    " released_at = NULL, lock_delay = {p}"
)

# The probe's grant (GRANT_BY_ID without a read): (holder, token, ttl, lock_delay, id, kind,
# *line, [where]). A free row that another transaction has locked (an operator's edit, a SELECT ...
# FOR UPDATE) must be a miss, not a wait: the scan skips locked rows. MariaDB: no lock wait for
# this statement alone (an error at once, 1205: GRANT_PROBE_NOWAIT); MySQL has no
# per-statement form, so there the probe waits at most LOCK_WAIT_TIMEOUT.
GRANT_PROBE = "UPDATE {table} SET {probe_set} WHERE id = {p} AND {grantable}"
GRANT_PROBE_NOWAIT = "SET STATEMENT innodb_lock_wait_timeout = 0 FOR {grant_probe}"

# The probe's row when it cannot be built from the sample: (id, token).
PROBE_READ_BACK = "SELECT {columns} FROM {table} WHERE id = {p} AND grant_token = {p}"


# A read grant of an rwlock hands its fence back in LAST_INSERT_ID: the row read back in the
# same round trip may already carry a later reader's grant (RW_READ in rw_statements.py).
RW_NEXT_FENCE = "LAST_INSERT_ID(fence + 1)"
RW_READ = Returning(
    "UPDATE {table} SET {rw_read_set} WHERE name = {p} AND kind = {p} AND {rw_readable} AND {rw_read_clear}",
    returning="{columns}, LAST_INSERT_ID()",
    read_back="kind = {p} AND name = {p}",
)


def _unfold(low: int, estimate: dt.datetime) -> dt.datetime | None:
    """The naive UTC datetime whose microseconds since the epoch end in ``low`` (24 bits) and
    lie nearest ``estimate``; None if even that is more than 4 s away (the estimate is off).
    Integer microseconds throughout (it runs once per probed grant)."""
    approx = (estimate - _EPOCH_UTC) // _MICROSECOND
    best = approx - (approx & _CLOCK_MASK) + low  # within a span of approx, either side
    if best - approx >= _HALF_SPAN:
        best -= 1 << _CLOCK_BITS
    elif approx - best > _HALF_SPAN:
        best += 1 << _CLOCK_BITS
    if abs(best - approx) > 4_000_000:
        return None
    return _EPOCH + dt.timedelta(microseconds=best)


#: The lease statements on this vendor: the common ones, with these of its own.
TEMPLATES: dict[str, str | Returning] = {
    **statements.TEMPLATES,
    "ACQUIRE_SCAN": ACQUIRE_SCAN,
    "ACQUIRE_SCAN_SKIP_LOCKED": ACQUIRE_SCAN_SKIP_LOCKED,
    "PROBE_PACKED": PROBE_PACKED,
    "PROBE_FENCE": PROBE_FENCE,
    "PROBE_SET": PROBE_SET,
    "GRANT_PROBE": GRANT_PROBE,
    "GRANT_PROBE_NOWAIT": GRANT_PROBE_NOWAIT,
    "PROBE_READ_BACK": PROBE_READ_BACK,
    "LINE_PICKS": LINE_PICKS,
    "LOOK_FREE": LOOK_FREE,
    "GRANT_LINE_NOWAIT": GRANT_LINE_NOWAIT,
    "RW_NEXT_FENCE": RW_NEXT_FENCE,
    "RW_READ": RW_READ,
}


class MySQLLeases(LeaseStatements):
    """The lease statements on MySQL/MariaDB: the probe hands back what it decided through
    LAST_INSERT_ID, and the scan picks its row in a derived table (ACQUIRE_SCAN above)."""

    d: MySQLDialect

    def grant_sampled(
        self, cursor: Any, ask: Ask, *, sampled: Row, token: str, clock: Any, turn: Turn = NEWCOMER
    ) -> Row | None:
        """The probe's grant in one statement and no read: the row is the sample's, with what
        the grant wrote put in.

        The UPDATE is the grant's, by primary key and conditional on the row being free and
        the caller's turn; it also hands back, in LAST_INSERT_ID (which the client reads from
        the statement's OK packet), the new fence, whether it took an expired lease over, and
        the low 24 bits of the database's clock in microseconds (``PROBE_PACKED``). The
        clock's high bits come from the sample's reading of the database's clock (``clock``,
        at most PROBE_REFRESH old, carried forward by this machine's monotonic clock): the 24
        bits span 16.8 s, so the result is exact while the estimate is within 8 s.
        ``acquired_at``, ``renewed_at`` and ``busy_before`` (that time plus the ttl in
        microseconds, the server's own arithmetic) are then exactly what the server wrote.
        The payload (name, data) is the sample's, so an operator's new URL shows up within
        PROBE_REFRESH. A take-over, a clock estimate too far out and a fence past 2**37 read
        the row back instead. ``previous_holder`` and the health columns are left for Django to
        load on first access (``DEFERRED``).
        """
        d = self.d
        ttl_us = d.ttl_param(ask.ttl)
        # MariaDB: no lock wait for this statement alone.
        in_line = turn.forms[0]  # a probe is a guess: the scan after it tries the line form
        sql = d.statement(
            "GRANT_PROBE_NOWAIT" if d.mariadb else "GRANT_PROBE", ask.where_sql, in_line=in_line, target=ask.target
        )
        params = (*self.grant_params(ask, token), sampled[0], *self.grantable(ask, turn, in_line=in_line))
        try:
            d.run_hot(cursor, sql, params, label="grant")
        except Exception as exc:
            if _found_row_locked(exc):
                return None  # another transaction has the row locked: a miss, the scan skips it
            raise
        if cursor.rowcount != 1:
            return None
        packed = int(cursor.lastrowid or 0)
        fence, taken, low = packed >> _FENCE_SHIFT, packed >> _CLOCK_BITS & 1, packed & _CLOCK_MASK
        granted_at = _unfold(low, clock.now()) if packed and not taken else None
        if granted_at is None:
            cursor.execute(d.sql["PROBE_READ_BACK"], (sampled[0], token))
            rows = cursor.fetchall()
            return rows[0] if rows else None
        row = list(sampled)
        at = d.at
        row[at["took_over"]] = False
        row[at["previous_holder"]] = DEFERRED
        # The sample's health may be PROBE_REFRESH old: loaded on first access (``Lease.probation``).
        row[at["health_score"]] = row[at["backoff_level"]] = row[at["backoff_seconds"]] = DEFERRED
        row[at["fence"]] = fence
        row[at["holder"]] = ask.holder
        row[at["grant_token"]] = token
        row[at["acquired_at"]] = row[at["renewed_at"]] = granted_at
        row[at["busy_before"]] = granted_at + dt.timedelta(microseconds=ttl_us)
        row[at["released_at"]] = None
        row[at["lock_delay"]] = float(ask.lock_delay)
        return row

    def acquire(self, cursor: Any, ask: Ask, *, token: str, turn: Turn = NEWCOMER) -> Row | None:
        d = self.d
        grant = self.grant_params(ask, token)
        for in_line in turn.forms:
            if in_line:
                row = acquire_in_line(d, cursor, ask, grant=grant, token=token, turn=turn)
                if row is not None:
                    return row
                continue
            grantable = self.grantable(ask, turn, in_line=in_line)
            if d.skip_locked:
                sql = d.statement("ACQUIRE_SCAN_SKIP_LOCKED", ask.where_sql, in_line=in_line, target=ask.target)
                params = (*grantable, *grant)
            else:
                sql = d.statement("ACQUIRE_SCAN", ask.where_sql, in_line=in_line, target=ask.target)
                params = (*grant, *grantable)
            row = d.returning_row(cursor, sql, params, read_params=(token,))
            if row is not None:
                return row
        return None


def _unknown_prepared(exc: BaseException) -> bool:
    """Whether ``exc`` says the session has no such prepared statement (nothing ran)."""
    return bool(getattr(exc, "args", None)) and exc.args[0] == ER_UNKNOWN_STMT_HANDLER


def _execute(name: bytes, values: Sequence[bytes]) -> bytes:
    """The ``EXECUTE`` of the prepared statement ``name`` with ``values`` (bound literals)."""
    return b"EXECUTE " + name + (b" USING " + b", ".join(values) if values else b"")


class MySQLDialect(Dialect):
    vendor = "mysql"
    # UTC whatever the session time zone (NOW() follows the session's zone), with
    # microseconds (NOW() without (6) has whole seconds, Django's columns have six digits).
    now_sql = NOW_SQL["mysql"]
    on_conflict_keep = "ON DUPLICATE KEY UPDATE id = id"
    # See ACQUIRE_SCAN: the planner must be told to walk the acquire index in its order.
    index_hint = f"FORCE INDEX ({ACQUIRE_INDEX})"
    templates, item_templates, topic_templates = TEMPLATES, item_sql.MYSQL_TEMPLATES, topic_sql.MYSQL_TEMPLATES
    counter_templates, term_templates = counter_sql.MYSQL_TEMPLATES, term_sql.MYSQL_TEMPLATES
    returning_template = RETURNING
    leases_part = MySQLLeases
    where_types = {"str": "STRING", "int": "INTEGER", "true": "BOOLEAN", "false": "BOOLEAN", "null": "NULL"}

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        super().__init__(connection)
        self.at = {name: i for i, name in enumerate(self.attnames)}
        # Several nodes of one Galera cluster: this connection moves between them.
        hosts = galera.cluster_hosts(connection.settings_dict)
        self.rotation = galera.HostRotation(hosts) if len(hosts) > 1 else None
        #: Whether the server this connection last set up is a Galera node (wsrep_on).
        self.galera = False
        #: Statements bound to their parameters by ``run_repeated`` (the newest last).
        self._bound: dict[tuple[str, tuple[Any, ...]], bytes] = {}
        #: This session's prepared statements (``run_hot``): the name of each text, or None
        #: for a text the server would not prepare; and whether this session prepares.
        self._prepared: dict[str, bytes | None] = {}
        self._prepares = False

    #: The most statements one session prepares (``run_hot``, ``run_repeated``): the release,
    #: the probe's grant and a waiter's look in the forms the session uses (where=, target=,
    #: in line or not). Every session of
    #: the server shares its ``max_prepared_stmt_count`` (16,382 by default); past it, or
    #: past this, a statement is sent as text.
    PREPARED_KEPT = 16

    def run_hot(self, cursor: Any, sql: str, params: Sequence[Any], *, label: str) -> None:
        """On MariaDB, a server-side prepared statement (docs/pitfalls.md#prepared-statements):
        ``PREPARE`` once per session, then ``EXECUTE ... USING`` the values as literals,
        bound on the client exactly as the driver binds them. The server then parses the
        statement's text once per session instead of at every call: a third of the engine's
        statements' server CPU above the lease floor's in ``cycle_cost``. Elsewhere (MySQL's
        ``EXECUTE`` takes user variables only), or with ``PREPARED_STATEMENTS`` off (a proxy
        that routes each statement to another server session), the text as any other. The
        prepared statement is named after ``label`` (``rl_grant_0``, ``rl_release_1``): what
        an EXECUTE runs can be told from its bytes (tests/faults/test_database.py)."""
        name = self._prepared_name(cursor, sql, label)
        if name is None:
            cursor.execute(sql, params)
            return
        self._send(cursor, _execute(name, tuple(map(self.connection.connection.literal, params))), sql, params)

    def _send(self, cursor: Any, bound: bytes, sql: str, params: Sequence[Any]) -> None:
        """Send ``bound`` (``sql`` bound to ``params``, or the EXECUTE of its prepared form).
        An EXECUTE the session no longer knows (a proxy or the server reset it behind our
        back) ran nothing: ``sql`` goes as text, and is prepared again from the next call on."""
        try:
            cursor.execute(bound)
        except Exception as exc:
            if not _unknown_prepared(exc):
                raise
            self._forget_prepared()
            cursor.execute(sql, params)

    def _forget_prepared(self) -> None:
        """This session has no prepared statements (a new one, or one reset), nor their bound
        EXECUTEs."""
        self._prepared, self._bound = {}, {}

    def _prepared_name(self, cursor: Any, sql: str, label: str) -> bytes | None:
        """The name of ``sql`` prepared in this session (prepared now if need be), or None:
        not prepared (``PREPARED_STATEMENTS`` off, not MariaDB, past the limits)."""
        if not self._prepares:
            return None
        if sql in self._prepared:
            return self._prepared[sql]
        return self._prepare(cursor, sql, label)

    def _prepare(self, cursor: Any, sql: str, label: str) -> bytes | None:
        """``PREPARE`` ``sql`` (driver placeholders made the server's) in this session; its
        name, or None (recorded: sent as text from then on) past PREPARED_KEPT or the server's
        limit. Any other error is the statement's own (a lost connection)."""
        if len(self._prepared) >= self.PREPARED_KEPT:
            self._prepared[sql] = None
            return None
        name = b"rl_%s_%d" % (label.lower().encode(), len(self._prepared))
        raw = self.connection.connection
        try:
            cursor.execute(b"PREPARE " + name + b" FROM " + raw.literal(sql.replace("%s", "?").replace("%%", "%")))
        except Exception as exc:
            if getattr(exc, "args", None) and exc.args[0] == ER_MAX_PREPARED_STMT_COUNT_REACHED:
                self._prepared[sql] = None
                return None
            raise
        self._prepared[sql] = name
        return name

    #: How many bound statements one connection keeps (one per waiter's line and place).
    BOUND_KEPT = 64

    def run_repeated(self, cursor: Any, sql: str, params: tuple[Any, ...]) -> None:
        """MySQLdb binds each statement's parameters on the client, escaping every value and
        formatting the whole text, every time (a waiter's look carries 11 values; binding was
        16% of a waiting process's main-thread CPU, about half of it the looks'). A statement
        sent again with the same parameters is bound once, exactly as the driver binds it
        (``Connection.literal``, then ``%``: the same bytes go to the server), and sent as it
        is; on MariaDB as the ``EXECUTE`` of the statement prepared once per session
        (``run_hot``), so that the server does not parse a look's text at every look either."""
        key = (sql, params)
        bound = self._bound.get(key)
        if bound is None:
            raw = self.connection.connection
            values = tuple(map(raw.literal, params))
            name = self._prepared_name(cursor, sql, "repeated")
            bound = sql.encode(raw.encoding) % values if name is None else _execute(name, values)
            if len(self._bound) >= self.BOUND_KEPT:
                del self._bound[next(iter(self._bound))]
            self._bound[key] = bound
        self._send(cursor, bound, sql, params)

    def pieces(self) -> dict[str, str]:
        # The probe's packing of LAST_INSERT_ID (PROBE_PACKED).
        return {
            **super().pieces(),
            "fence_unit": str(1 << _FENCE_SHIFT),
            "took_over_unit": str(1 << _CLOCK_BITS),
            "clock_span": str(1 << _CLOCK_BITS),
            "fence_limit": str(_FENCE_LIMIT),
        }

    def connect(self, lock_wait_timeout: float) -> None:
        if self.rotation is None:
            super().connect(lock_wait_timeout)
            return
        galera.connect(self.connection, self.rotation, lambda raw: self.setup_session(raw, lock_wait_timeout))

    def disconnected(self) -> None:
        if self.rotation is not None:
            self.rotation.skip()

    def expiry_sql(self, placeholder: str | None = None) -> str:
        return f"{self.now_sql} + INTERVAL {placeholder or '%s'} MICROSECOND"

    def delay_end_sql(self) -> str:
        return "busy_before + INTERVAL ROUND(lock_delay * 1000000) MICROSECOND"

    def matches_sql(self, where: str, data: str) -> str:
        # docs/pitfalls.md#json-compared. JSON_TABLE (MariaDB 10.6+, MySQL 8.0) walks the filter's entries; each key's value in
        # the row must have the same JSON type and, compared byte for byte (BINARY: the
        # connection's collation may ignore case), the same unquoted text.
        # The key is looked up as the document spells it (base.key_paths: escaped as Python
        # writes it, or in UTF-8); a path can hold neither a raw control character nor an
        # escape the document does not use.
        value = f"JSON_EXTRACT({data}, IF(JSON_CONTAINS_PATH({data}, 'one', f.pa), f.pa, f.pu))"
        return (
            f"NOT EXISTS (SELECT 1 FROM JSON_TABLE({where}, '$[*]' COLUMNS ("
            "pa LONGTEXT CHARACTER SET utf8mb4 PATH '$.pa',"
            " pu LONGTEXT CHARACTER SET utf8mb4 PATH '$.pu',"
            " t VARCHAR(16) CHARACTER SET utf8mb4 PATH '$.t',"
            " s LONGTEXT CHARACTER SET utf8mb4 PATH '$.s')) AS f"
            f" WHERE NOT COALESCE(JSON_TYPE({value}) = f.t"
            f" AND (f.t = 'NULL' OR BINARY JSON_UNQUOTE({value}) = BINARY f.s), FALSE))"
        )

    def ttl_param(self, ttl: float) -> Any:
        return round(ttl * 1_000_000)

    def setup_session(self, raw_connection: Any, lock_wait_timeout: float) -> None:
        cursor = raw_connection.cursor()
        try:
            # READ COMMITTED takes no gap locks, so acquires and releases on the
            # (kind, busy_before) index deadlock less (docs/pitfalls.md#read-committed); a
            # bounded lock wait keeps a renewal from hanging past its ttl
            # (innodb_lock_wait_timeout is 50 s by default: docs/pitfalls.md#lock-wait).
            cursor.execute(
                "SET SESSION time_zone = '+00:00', SESSION innodb_lock_wait_timeout = %s,"
                " SESSION group_concat_max_len = 65536",
                (max(1, round(lock_wait_timeout)),),
            )
            cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        finally:
            cursor.close()
        # Galera: causal reads and UPDATEs (wsrep_sync_wait), only when wsrep is on; with
        # several nodes to choose from, a node that cannot serve is refused here.
        self.galera = galera.setup_session(raw_connection, require_ready=self.rotation is not None)
        self._forget_prepared()  # a new session
        self._prepares = self.mariadb and bool(lease_settings.PREPARED_STATEMENTS)

    def returning_row(
        self, cursor: Any, sql: str, params: Sequence[Any], *, read_params: Sequence[Any] = ()
    ) -> Row | None:
        # No RETURNING: the UPDATE and the SELECT of its row are one query (RETURNING above,
        # docs/pitfalls.md#no-returning). An error in either raises here (a lost connection
        # during the SELECT leaves the UPDATE's outcome for the caller to settle).
        cursor.execute(sql, (*params, *read_params))
        matched = cursor.rowcount == 1
        if not cursor.nextset():
            raise RuntimeError("the read of a pipelined UPDATE; SELECT returned no result")
        rows = cursor.fetchall()
        return rows[0] if matched and rows else None

    @property
    def mariadb(self) -> bool:
        """Whether the server is MariaDB (Django reads it once per connection)."""
        return bool(getattr(self.connection, "mysql_is_mariadb", False))

    @property
    def skip_locked(self) -> bool:
        """Whether the server skips locked rows (MariaDB 10.6+, MySQL 8; Django reads the
        server's version once per connection)."""
        return bool(self.connection.features.has_select_for_update_skip_locked)

    def claim_statement(self, name: str) -> str:
        return name if self.skip_locked else f"{name}_LOCKING"

    def run_bump(self, cursor: Any, sql: str, params: dict[str, Any]) -> int:
        # The upsert and its read of LAST_INSERT_ID() are one query (MYSQL_TOPIC_NOTIFY).
        # Affected rows (CLIENT.FOUND_ROWS, docs/pitfalls.md#found-rows): 1 inserted
        # (version 1), 2 updated.
        cursor.execute(sql, params)
        inserted = cursor.rowcount == 1
        if not cursor.nextset():
            raise RuntimeError("the read of a pipelined upsert; SELECT returned no result")
        rows = cursor.fetchall()
        return 1 if inserted else int(rows[0][0])

    def run_add(self, cursor: Any, sql: str, params: dict[str, Any]) -> int | None:
        # The upsert and its read of LAST_INSERT_ID() are one query (MYSQL_COUNTER_ADD):
        # affected rows 1 is an insert (the value is n; LAST_INSERT_ID() holds the new id),
        # 2 an update. The caller never adds 0 (a row left as it was would also count 1).
        try:
            cursor.execute(sql, params)
        except Exception as exc:
            if exc.args and exc.args[0] == ER_DATA_OUT_OF_RANGE:
                return None  # the sum would leave BIGINT: the statement changed nothing
            raise
        inserted = cursor.rowcount == 1
        if not cursor.nextset():
            raise RuntimeError("the read of a pipelined upsert; SELECT returned no result")
        rows = cursor.fetchall()
        return int(params["n"]) if inserted else int(rows[0][0])

    @staticmethod
    def connect_options(options: dict[str, Any], io_timeout: float, *, prepared: bool) -> None:
        from MySQLdb.constants import CLIENT

        # Matched rows, never "changed rows" (Django's backend sets CLIENT.FOUND_ROWS, but an
        # OPTIONS["client_flag"] in settings replaces it: docs/pitfalls.md#found-rows), whatever
        # flags the user set; and several statements per query, so a grant and its read share
        # one round trip.
        options["client_flag"] = int(options.get("client_flag", 0)) | CLIENT.FOUND_ROWS | CLIENT.MULTI_STATEMENTS
        # A renewal must fail, not hang, when the server stops answering
        # (docs/pitfalls.md#dropped-connections).
        options.setdefault("connect_timeout", max(1, round(io_timeout)))
        options.setdefault("read_timeout", max(1, round(io_timeout)))
        options.setdefault("write_timeout", max(1, round(io_timeout)))

    @staticmethod
    def session_zone_offset(connection: BaseDatabaseWrapper) -> int:
        # NOW() and CURRENT_TIMESTAMP follow the session's time zone (docs/pitfalls.md#database-clock).
        with connection.cursor() as cursor:
            cursor.execute("SELECT TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(), NOW())")
            (offset,) = cursor.fetchone()
        return int(offset or 0)

    @staticmethod
    def counts_changed_rows(options: dict[str, Any]) -> bool:
        # Django sets CLIENT.FOUND_ROWS; a client_flag of the user's replaces it.
        client_flag = options.get("client_flag")
        return client_flag is not None and not int(client_flag) & _CLIENT_FOUND_ROWS

    def classify(self, exc: BaseException) -> Failure:
        if isinstance(exc, galera.NodeNotUsable):
            return Failure.DISCONNECT  # no node of the alias could serve; nothing ran
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        if code == galera.ER_WSREP_NOT_READY:
            # Galera: the node is not ready (joining) or left the primary component. The
            # statement did not run; retried like a deadlock, or handled as a disconnect.
            verdict = galera.classify_not_ready(self.connection.connection, several_hosts=self.rotation is not None)
            return Failure.TRANSIENT if verdict == "transient" else Failure.DISCONNECT
        if code in _TRANSIENT:
            return Failure.TRANSIENT
        if code in _LOCK_TIMEOUT:
            return Failure.LOCK_TIMEOUT
        if code in _DISCONNECT:
            return Failure.DISCONNECT
        import MySQLdb

        if isinstance(exc, MySQLdb.InterfaceError):
            return Failure.DISCONNECT
        return Failure.FATAL


#: Free rows a grant in the line form reads, of which it tries ``LINE_TRIES`` in a random order
#: (so that the waiters served at once spread over them rather than meet at the first). A try
#: refused by the line's rule is likely to be refused on any row: the second try is for a row
#: taken between the read and the try.
LINE_PICK_LIMIT = 8
LINE_TRIES = 2


def acquire_in_line(
    dialect: MySQLDialect, cursor: Any, ask: Ask, *, grant: tuple[Any, ...], token: str, turn: Turn
) -> Row | None:
    """A grant in the line form, without the join of the scan (LINE_PICKS above): some free
    rows read (or those the caller's look listed: ``turn.candidates``), then tried by primary
    key until one is granted."""
    if turn.candidates:  # what the caller's look has just seen free (LOOK_FREE)
        ids = list(turn.candidates)
    else:
        sql = statements.fill(
            dialect.statement("LINE_PICKS", ask.where_sql, target=ask.target), limit=str(LINE_PICK_LIMIT)
        )
        cursor.execute(sql, (ask.kind, *own(ask.where_sql, ask.target)))
        ids = [pk for (pk,) in cursor.fetchall()]
    random.shuffle(ids)
    grant_sql = dialect.statement(
        "GRANT_LINE_NOWAIT" if dialect.mariadb else "GRANT_BY_ID", ask.where_sql, target=ask.target
    )
    grantable = dialect.leases.grantable(ask, turn)
    for pk in ids[:LINE_TRIES]:
        try:
            row = dialect.returning_row(cursor, grant_sql, (*grant, pk, *grantable), read_params=(pk, token))
        except Exception as exc:
            if _found_row_locked(exc):
                continue  # another grant has the row locked: it is taking it
            raise
        if row is not None:
            return row
    return None
