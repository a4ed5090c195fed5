"""The lease statements' dialects: the templates of ``statements`` rendered per vendor, and run.

A dialect runs on the raw DB-API cursor of a Django connection (native paramstyle, no
Django cursor wrapper), because the lease statements are on the hot path and need
vendor features the ORM does not expose (UPDATE ... RETURNING, LIMIT on UPDATE,
SKIP LOCKED, LAST_INSERT_ID). Everything vendor-specific lives in this package.
"""

from __future__ import annotations

import abc
import datetime as dt
import json
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field
from django.db.models.base import DEFERRED

from resource_lease.db import cooldowns as cooldown_sql
from resource_lease.db import counters as counter_sql
from resource_lease.db import dispenser as item_sql
from resource_lease.db import health as health_sql
from resource_lease.db import sessions as session_sql
from resource_lease.db import statements
from resource_lease.db import terms as term_sql
from resource_lease.db import topics as topic_sql
from resource_lease.db.answers import Answer
from resource_lease.db.grants import LeaseStatements
from resource_lease.db.line import LineStatements
from resource_lease.db.rwlock import RwLockStatements
from resource_lease.db.statements import Returning
from resource_lease.models import Cooldown, Resource, Waiter

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


class Dialect(abc.ABC):
    """One vendor: its statements rendered, how they run, and what only it does.

    The statements are the named templates of ``resource_lease.db.statements`` (and of the
    other statement modules), rendered once per dialect into ``self.sql``; a vendor's subclass
    sets its pieces (``now_sql``, the expiry expression, the placeholder, how a ``where=`` is
    compared), overrides only the templates that differ (``templates``,
    ``returning_template``), and says how to connect and how to read an error.

    The statements are run by three parts, composed (``leases``: grants, renewals, releases;
    ``line``: the line of waiters' places; ``rw``: an rwlock's read grants), each a class a
    vendor may replace by its own (``leases_part``, ``line_part``, ``rw_part``: MySQL's probe
    and scan, PostgreSQL's hand-off); a statement that only needs running and one shape of
    answer runs through ``execute``.
    """

    vendor = ""
    placeholder = "%s"
    #: One writer for the whole database (SQLite): a caller's open write transaction blocks
    #: every other connection, the engine's included, so acquiring inside it must be refused.
    single_writer = False
    #: The database's clock, in UTC, as an SQL expression.
    now_sql = ""
    true = "TRUE"
    false = "FALSE"
    #: Between the table and WHERE of a read of the acquire index (MySQL names the index).
    index_hint = ""
    #: ``INSERT ... <this>``: a row whose (kind, name) exists already is kept as it is.
    on_conflict_keep = "ON CONFLICT (kind, name) DO NOTHING"
    #: The dialect's statement sets, each rendered into ``self.sql``: the lease statements by
    #: name (``statements.TEMPLATES``; a vendor adds its ACQUIRE_SCAN), the dispenser's
    #: (``db/dispenser.py``), the topics' and configs' (``db/topics.py``), the counters'
    #: (``db/counters.py``) and the leadership log's (``db/terms.py``).
    templates: dict[str, str | Returning] = statements.TEMPLATES
    item_templates: dict[str, str] = item_sql.TEMPLATES
    topic_templates: dict[str, str] = topic_sql.TEMPLATES
    counter_templates: dict[str, str] = counter_sql.TEMPLATES
    term_templates: dict[str, str] = term_sql.TEMPLATES
    #: How an UPDATE hands back the row it changed (``statements.Returning``).
    returning_template = statements.RETURNING
    #: A named parameter (the dispenser's and topics' statements), and a JSON parameter as
    #: the vendor stores it.
    named_placeholder = "%({})s"
    json_cast = "{}"
    #: The NOTIFY channel a release wakes the line's waiters on ('': this vendor cannot push;
    #: the waiters look).
    line_channel = ""
    #: Whether the engine's connection keeps one cursor for its statements (``db.connections``)
    #: rather than opening one per statement: cheaper where the driver's cursor is dear to
    #: make (psycopg: some 8 us of client CPU per statement here), dearer where reusing one
    #: costs more than a new one (MySQLdb discards the last result first).
    keeps_cursor = False
    #: How a ``where=`` value's type is named by the vendor's JSON functions (``encode_where``):
    #: for str, int, True, False, None.
    where_types: Mapping[str, str] = {}
    #: The parts that run the statements (see the class's docstring).
    leases_part: type[LeaseStatements] = LeaseStatements
    line_part: type[LineStatements] = LineStatements
    rw_part: type[RwLockStatements] = RwLockStatements

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
        self.waiters = qn(Waiter._meta.db_table)
        self.cooldowns = qn(Cooldown._meta.db_table)
        #: Every statement rendered once. Lease statements in eight ``forms[in_line, filtered,
        #: targeted]`` (LINE_CLEAR or UNMARKED; a ``where=`` or not; a ``target=`` or not);
        #: ``sql``: the line form, no filter, no target.
        pieces = self.pieces()
        checks = statements.render(
            {
                name: ({**self.templates, "OWN_TARGET": statements.OWN_TARGET})[name]
                for name in ("FREE", "DELAY_OVER", "UNMARKED", "WAITER_COOLS", "LINE_CLEAR", "OWN_TARGET")
            },
            pieces,
        )
        self.forms: dict[tuple[bool, bool, bool], dict[str, str]] = {
            (in_line, filtered, targeted): statements.render(
                self.templates,
                {
                    **pieces,
                    "line_check": checks["LINE_CLEAR" if in_line else "UNMARKED"],
                    "own_filter": " AND " + pieces["param_matches"] if filtered else "",
                    "own_target": checks["OWN_TARGET"] if targeted else "",
                },
                self.returning_template,
            )
            for in_line in (True, False)
            for filtered in (False, True)
            for targeted in (False, True)
        }
        self.sql = dict(self.forms[True, False, False])
        self.sql.update(statements.render(self.item_templates, item_sql.pieces(self)))
        self.sql.update(statements.render(self.topic_templates, topic_sql.pieces(self)))
        self.sql.update(statements.render(self.counter_templates, counter_sql.pieces(self)))
        self.sql.update(statements.render(self.term_templates, term_sql.pieces(self)))
        self.sql.update(statements.render(health_sql.TEMPLATES, health_sql.pieces(self), self.returning_template))
        self.sql.update(statements.render(cooldown_sql.templates(self.vendor), cooldown_sql.pieces(self)))
        self.sql.update(statements.render(session_sql.templates(self.vendor), session_sql.pieces(self)))
        # The conditions and the SET list on their own (tests, tests/procs).
        self.ours = self.sql["OURS"]
        self.free = self.sql["FREE"]
        self.grant_set = self.sql["GRANT_SET"]
        self.freed_at = self.sql["FREED_AT"]
        self.line = self.line_part(self)
        self.leases = self.leases_part(self)
        self.rw = self.rw_part(self)

    def pieces(self) -> dict[str, str]:
        """What the templates leave open, for this vendor and table."""
        return {
            "table": self.table,
            "columns": self.columns,
            "p": self.placeholder,
            "now": self.now_sql,
            "expiry": self.expiry_sql(),
            "delay_end": self.delay_end_sql(),
            "true": self.true,
            "false": self.false,
            "index_hint": self.index_hint,
            "on_conflict_keep": self.on_conflict_keep,
            "waiters": self.waiters,
            "cooldowns": self.cooldowns,
            "json_param": self.json_cast.format(self.placeholder),
            "waiter_matches": self.matches_sql("w.filter", f"{self.table}.data"),
            "param_matches": self.matches_sql(self.json_cast.format(self.placeholder), f"{self.table}.data"),
        }

    # -- vendor pieces ---------------------------------------------------------------

    @abc.abstractmethod
    def expiry_sql(self, placeholder: str | None = None) -> str:
        """``now + ttl`` where the ttl (as ``ttl_param`` passes it) is the statement's next
        parameter (or the named ``placeholder``)."""

    @abc.abstractmethod
    def delay_end_sql(self) -> str:
        """``busy_before`` plus the row's ``lock_delay`` seconds (a float column), as an SQL
        expression comparable with ``now_sql``."""

    @abc.abstractmethod
    def matches_sql(self, where: str, data: str) -> str:
        """An SQL condition, never NULL: the JSON ``data`` has every key of the filter
        ``where`` (JSON text, as ``encode_where`` wrote it: [{"k": key, "t": type, "s":
        text}, ...]) with a value of the same type and text (docs/pitfalls.md#json-compared)."""

    def encode_where(self, where: Mapping[str, Any]) -> str:
        """A checked ``where=`` filter (keys: str; values: str, int, bool or None) as the JSON
        text ``matches_sql`` compares: each key with its value's type as this vendor's JSON
        functions name it, and its text (booleans and null: their type says it all)."""
        entries = []
        for key, value in sorted(where.items()):
            if value is None:
                kind, text = "null", ""
            elif value is True or value is False:
                kind, text = str(value).lower(), str(value).lower()
            elif isinstance(value, int):
                kind, text = "int", str(value)
            else:
                kind, text = "str", value
            entries.append({"k": key, "t": self.where_types[kind], "s": text, **key_paths(key)})
        return json.dumps(entries)

    # -- running a statement ------------------------------------------------------------

    def statement(self, name: str, where: str | None, *, in_line: bool = True, target: str = "") -> str:
        """The lease statement ``name`` in its line form or not (``Turn.forms``), and with the
        caller's ``where=`` filter and ``target`` if any."""
        return self.forms[in_line, where is not None, bool(target)][name]

    def run_repeated(self, cursor: Any, sql: str, params: tuple[Any, ...]) -> None:
        """Run ``sql`` with ``params`` as a statement that one caller sends again and again
        with the same parameters (a waiter's look): here as any other; a vendor whose driver
        binds on the client may keep the bound text (``MySQLDialect``)."""
        cursor.execute(sql, params)

    def run_hot(self, cursor: Any, sql: str, params: Sequence[Any], *, label: str) -> None:
        """Run ``sql``, a statement every uncontended cycle sends (the probe's grant, the
        release; ``label`` names it: "grant", "release"): here as any other; a
        vendor that parses each statement's text anew may prepare it on the server once per
        session (``MySQLDialect`` on MariaDB)."""
        cursor.execute(sql, params)

    def execute(
        self, cursor: Any, name: str, params: Sequence[Any] | Mapping[str, Any] = (), *, answer: Answer = Answer.NOTHING
    ) -> Any:
        """Run the statement ``name`` (``self.sql``) and read its ``answer``. A result set is
        read whole: SQLite ends the statement (and its lock) only then
        (docs/pitfalls.md#sqlite)."""
        cursor.execute(self.sql[name], params)
        if answer is Answer.NOTHING:
            return None
        if answer is Answer.COUNT:
            return int(cursor.rowcount or 0)
        if answer is Answer.CHANGED_ONE:
            return cursor.rowcount == 1
        rows = cursor.fetchall()
        if answer is Answer.ANY:
            return bool(rows)
        if answer is Answer.FIRST:
            return rows[0] if rows else None
        if answer is Answer.VALUE:
            return rows[0][0] if rows else None
        return rows

    def claim_statement(self, name: str) -> str:
        """The name of the dispenser's claim statement ``name`` on this server (MySQL without
        SKIP LOCKED has another)."""
        return name

    def run_bump(self, cursor: Any, sql: str, params: dict[str, Any]) -> int:
        """Run an upsert that raises a version and answers the new one (``db/topics.py``)."""
        cursor.execute(sql, params)
        # Every row: SQLite ends the statement (and its lock) only then (docs/pitfalls.md#sqlite).
        rows = cursor.fetchall()
        return int(rows[0][0])

    def run_add(self, cursor: Any, sql: str, params: dict[str, Any]) -> int | None:
        """Run a counter's upsert (``db/counters.py``): the new value, or None if the sum
        would leave BIGINT (nothing changed)."""
        cursor.execute(sql, params)
        rows = cursor.fetchall()  # every row: SQLite ends the statement only then
        return int(rows[0][0]) if rows else None

    def run_conditional(self, cursor: Any, sql: str, params: dict[str, Any]) -> bool:
        """Run a conditional write of one row (``CONFIG_CAS``): whether it matched."""
        cursor.execute(sql, params)
        if cursor.description is not None:  # PostgreSQL's form selects the changed row
            return len(cursor.fetchall()) == 1
        return bool(cursor.rowcount == 1)

    def ttl_param(self, ttl: float) -> Any:
        return ttl

    def setup_session(self, raw_connection: Any, lock_wait_timeout: float) -> None:  # noqa: B027 (a vendor's hook; none by default)
        """Per-connection settings for the engine's own connections."""

    def connect(self, lock_wait_timeout: float) -> None:
        """Open this dialect's connection and set its session up (MySQL: on one of several
        cluster nodes)."""
        self.connection.ensure_connection()
        self.setup_session(self.connection.connection, lock_wait_timeout)

    def disconnected(self) -> None:  # noqa: B027 (a vendor's hook; none by default)
        """The connection was lost: the next ``connect`` may choose another server."""

    @staticmethod  # noqa: B027 (a vendor's hook; none by default)
    def connect_options(options: dict[str, Any], io_timeout: float, *, prepared: bool) -> None:
        """Driver options (timeouts; server-side prepared statements if ``prepared`` and the
        driver has them) for the engine's own connections; the user's win."""

    @abc.abstractmethod
    def classify(self, exc: BaseException) -> Failure:
        """How the engine should treat ``exc``, raised by one of this dialect's statements."""

    # -- checks on the user's own connections (resource_lease/checks.py) -------------

    @staticmethod
    def session_zone_offset(connection: BaseDatabaseWrapper) -> int:
        """Seconds by which the session's local clock (``NOW()``) is off UTC on a Django
        connection; 0 where the session's time zone cannot skew stored datetimes."""
        return 0

    @staticmethod
    def counts_changed_rows(options: dict[str, Any]) -> bool:
        """Whether a ``DATABASES`` OPTIONS makes an UPDATE's row count report changed rows,
        not matched rows, on the user's connections (docs/pitfalls.md#found-rows)."""
        return False

    def returning_row(
        self, cursor: Any, sql: str, params: Sequence[Any], *, read_params: Sequence[Any] = ()
    ) -> Row | None:
        """Run a rendered ``statements.Returning``: the row its UPDATE changed, or None if it
        matched none. ``read_params`` are its read-back's, for a vendor without RETURNING."""
        cursor.execute(sql, params)
        # Every row: SQLite ends the statement (and its lock) only then (docs/pitfalls.md#sqlite).
        rows = cursor.fetchall()
        return rows[0] if rows else None

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


def key_paths(key: str) -> dict[str, str]:
    """The JSON paths of ``key`` for the vendors that look a key up as its document spells
    it (MySQL/MariaDB, SQLite: the stored text, escapes and all): ``pa`` as Python (Django's
    JSONField, ``json.dumps``) writes it, non-ASCII and control characters escaped
    (``\\u00e9``), and ``pu`` as writers that keep UTF-8 write it (``é``). A key found under
    neither is missing (docs/pitfalls.md#json-compared). ``check_where`` refuses the quote and
    backslash a path cannot carry."""
    return {
        "pa": '$."' + json.dumps(key)[1:-1] + '"',
        "pu": '$."' + json.dumps(key, ensure_ascii=False)[1:-1] + '"',
    }


def some_kinds(dialect: Dialect, cursor: Any, *, limit: int) -> list[str]:
    """Up to ``limit`` of the pools' kinds, sorted (``SOME_KINDS``: coordination rows left out)."""
    cursor.execute(statements.fill(dialect.sql["SOME_KINDS"], limit=str(int(limit))), ("@%",))
    return [row[0] for row in cursor.fetchall()]
