"""PostgreSQL: UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.db.models.base import DEFERRED

from resource_lease.db import dispenser as item_sql
from resource_lease.db import statements
from resource_lease.db import terms as term_sql
from resource_lease.db import topics as topic_sql
from resource_lease.db.answers import Answer
from resource_lease.db.base import Dialect, Failure, Row
from resource_lease.db.clock import NOW_SQL
from resource_lease.db.grants import LeaseStatements
from resource_lease.db.line import NEWCOMER, Ask, LineStatements, Turn
from resource_lease.db.rwlock import RwLockStatements
from resource_lease.db.statements import Returning

# SQLSTATEs after which the statement was rolled back and can run again.
_TRANSIENT = {"40001", "40P01"}  # serialization failure, deadlock
_LOCK_TIMEOUT = {"55P03", "57014"}  # lock_timeout, statement_timeout
# Class 08 (connection exception) and the server shutting down or killing the backend.
_DISCONNECT_PREFIXES = ("08", "57P0")

# The acquire. SKIP LOCKED: contenders never queue behind a row another acquire is granting
# (docs/pitfalls.md#index-locks); rows that are not the caller's turn are filtered out before
# any is locked. (holder, token, ttl, kind, *line, [where])
ACQUIRE_SCAN = Returning(
    "UPDATE {table} SET {grant_set}"
    " WHERE id = (SELECT id FROM {table} WHERE {grantable}"
    " ORDER BY busy_before LIMIT 1 FOR UPDATE SKIP LOCKED)"
)

# The free condition of a row already chosen by primary key. The kind is compared as an
# expression, which no index serves: with statistics older than the pool (a kind seeded after
# the last ANALYZE is estimated at one row), the planner would otherwise walk the (kind, ...)
# indexes over every row of the kind and filter on id (docs/pitfalls.md#stale-statistics).
# Otherwise FREE (statements.py), as tests/test_statements.py checks.
FREE_BY_ID = (
    "kind || '' = {p} AND busy_before <= {now} AND enabled = {true}"
    " AND (quarantined_until IS NULL OR quarantined_until <= {now})"
)

# GRANTABLE with FREE_BY_ID: (kind, *line, [where], [target]).
GRANTABLE_BY_ID = "{free_by_id} AND {delay_over} AND {line_check}{own_filter}{own_target}"

# Grant one chosen row (the holder's lock step): (holder, token, ttl, id, kind, *line, [where]).
GRANT_BY_ID = Returning("UPDATE {table} SET {grant_set} WHERE id = {p} AND {grantable_by_id}")

# The probe's grant, by primary key, and SKIP LOCKED: a free row that another transaction has
# locked (an operator's edit, a SELECT ... FOR UPDATE) is a miss, not a wait.
# (holder, token, ttl, id, kind, *line, [where])
GRANT_SAMPLED = Returning(
    "UPDATE {table} SET {grant_set}"
    " WHERE id = (SELECT id FROM {table} WHERE id = {p} AND {grantable_by_id} FOR UPDATE SKIP LOCKED)"
)

# The NOTIFY channel every process with waiters listens on: the payload names a line (JSON
# [kind, name]) and wakes the process's waiters of it (RW_READ_RELEASE, readers' turns, places
# without a channel of their own).
LINE_CHANNEL = "rl_line"

# The waiters whose turn a freed row may be (``r``: its kind, name, data), as served
# (LINE_CLEAR): the first of the row's own line, and of the kind's line the one at the place
# the kind's free rows say, those whose where= the row does not match aside. With k other
# rows free (as the statement's snapshot has them, before this release; up to LINE_ROOM), the
# first k waiters were told by their releases (or, rows that expired, find them by looking):
# this row is the next one's, and one NOTIFY per release tells it (telling all k + 1 made
# every listening backend read k + 1 queue entries per release: at 64 processes on 40 rows,
# utilisation fell from 0.23 to 0.12). Waiters of the kind whose target the row is cooling
# down for are aside too (WAITER_COOLS, without its test of an empty target: no cooldown has
# one, and RELEASE must stay short; the row's id is ``r.{row_id}``), and the free rows that
# are cooling down for some target are not counted: their releases may have told nobody (the
# waiters they could serve may all be behind a waiter for that target), so counting them would
# pass over a waiter nobody told (tests/test_targets.py). Counting fewer tells a waiter that
# may have been told already, which passes the turn on if it does not take it (``pass_turn``).
# ``{less}``: '' (RELEASE) or ' - 1' (PASS_TURN: the free rows include the one passed on).
# (id, channel, shared, the line's name); no parameters.
LINE_TURNS = (
    "(SELECT w.id, w.channel, w.shared, w.name FROM {waiters} w"
    " WHERE w.kind = r.kind AND w.name = r.name AND r.name <> '' AND w.expires_at > {now}"
    " AND (w.filter IS NULL OR {turn_matches}) ORDER BY w.priority DESC, w.id LIMIT 1)"
    " UNION ALL"
    " (SELECT w.id, w.channel, w.shared, w.name FROM {waiters} w"
    " WHERE w.kind = r.kind AND w.name = '' AND w.expires_at > {now}"
    " AND (w.filter IS NULL OR {turn_matches}) AND NOT EXISTS (SELECT FROM {cooldowns} c WHERE c.target = w.target"
    " AND c.resource_id = r.{row_id} AND c.until > {now}) ORDER BY w.priority DESC, w.id"
    " OFFSET GREATEST(0, (SELECT COUNT(*) FROM (SELECT FROM {table} f WHERE f.kind = r.kind"
    " AND f.busy_before <= {now} AND f.enabled = {true}"
    " AND (f.quarantined_until IS NULL OR f.quarantined_until <= {now})"
    " AND NOT EXISTS (SELECT FROM {cooldowns} c WHERE c.resource_id = f.id AND c.until > {now}) LIMIT "
    + str(statements.LINE_ROOM)
    + ") n){less}) LIMIT 1)"
)

# Tell each of LINE_TURNS's waiters ({line_turns}) it may be its turn: on its process's channel, its place
# (JSON [id, kind, line name]), so that only that waiter tries; a reader of an rwlock (the
# readers behind it may be served with it) or a place without a channel wakes its whole line
# on LINE_CHANNEL instead. How many were told.
TELL_TURNS = (
    "SELECT COUNT(pg_notify(CASE WHEN t.channel = '' OR t.shared THEN '{line_channel}' ELSE t.channel END,"
    " CASE WHEN t.channel = '' OR t.shared THEN json_build_array(r.kind, r.name)::text"
    " ELSE json_build_array(t.id, r.kind, t.name)::text END)) FROM ({line_turns}) t"
)

# The first live waiter of a released row (``me``: its kind, name and data, read before), as
# served (LINE_CLEAR): of the row's own line first, then of the kind's, higher priority first,
# then who asked first, those whose where= the row does not match aside (a waiter with a target
# takes no hand-off: its grant_ttl is 0, ``line.places.take_place``); locked, so that two
# releases never hand their rows to one waiter, and a waiter that leaves meanwhile
# (LEAVE_LINE, its own grant deleting its place) is either handed the row before it leaves,
# or not at all. A place locked by another transaction is skipped, not waited for: releases
# at the same instant all pick the same head of line, and each queued behind the commit of
# the one before it (3.6-3.8 ms a RELEASE at 64 processes on a pool of 40 here, 0.35-0.42
# with SKIP LOCKED: docs/benchmarks.md, tenth session); the next one hands its row to the
# next waiter instead, and the place skipped is served by the release that locked it (or by
# the next release, if that one handed nothing: a release of a grant it no longer held).
# Where every place is locked, the release frees the row and tells turns. Only a row marked
# for its line (a waiter may be in it), enabled and not in quarantine is handed. (id)
HEAD_OF_LINE = (
    "me AS (SELECT id, kind, name, data FROM {table} WHERE id = {p} AND line_until > {now} AND enabled = {true}"
    " AND (quarantined_until IS NULL OR quarantined_until <= {now})),"
    " h AS (SELECT w.id AS place, w.holder AS who, w.token AS tok, w.grant_ttl AS ttl,"
    " w.channel AS chan, w.name AS line_name FROM {waiters} w, me"
    " WHERE w.kind = me.kind AND (w.name = '' OR (w.name = me.name AND me.name <> ''))"
    " AND w.expires_at > {now} AND (w.filter IS NULL OR {head_matches})"
    " ORDER BY w.name = '', w.priority DESC, w.id LIMIT 1 FOR UPDATE OF w SKIP LOCKED)"
)

#: The most bytes of a handed row's ``data`` (as JSON text) its hand-off NOTIFY carries: escaped
#: again inside the payload it at most doubles, well inside NOTIFY's 8000 bytes with the
#: names (255 characters each). A larger payload is read (``CLAIM_HANDED``).
HANDED_DATA_MAX = 2000

# What a release tells the waiter it handed its row to (RELEASE's NOTIFY, ``r``: the row as
# granted): [place, kind, line name, row id, fence, name, previous holder, acquired_at,
# busy_before, data as JSON text or null if longer than HANDED_DATA_MAX]. The waiter builds
# its grant from it (``PostgreSQLDialect.handed_row``) and reads nothing.
HANDED_GRANT = (
    "json_build_array(r.place, r.kind, r.line_name, r.row_id, r.fence, r.name, r.previous_holder,"
    " r.acquired_at, r.busy_before, CASE WHEN octet_length(r.data::text) <= "
    + str(HANDED_DATA_MAX)
    + " THEN r.data::text END)"
)

# Whether the release hands its row to the head of its line (HEAD_OF_LINE): a waiter that
# takes hand-offs (its grant_ttl, written as it took its place: not an rwlock's, not one with a
# lock_delay, not a ResourceHolder's). NULL when nobody is at the head (LEFT JOIN h): every use
# is a CASE WHEN or a WHERE, where NULL is not true. (Short on purpose: RELEASE names it twelve
# times, and psycopg caches the parsing of a statement up to 4096 bytes only:
# tests/test_statements.py.)
HANDED = "h.ttl > 0"

# Give a live grant back (RELEASE). If the head of the row's line takes hand-offs, the row is
# granted to it in the same statement, as a grant would (GRANT_SET: fence + 1, its holder,
# its place's token, expiry by the database's clock after its grant_ttl), its place leaves the
# line, and its process is told on its channel: the grant itself (HANDED_GRANT), which the
# waiter takes without a statement of its own, or reads by its token (CLAIM_HANDED). The
# expiry counts from clock_timestamp(), read while the statement runs, so after its snapshot,
# which saw the waiter's place: after that place's ENTER_LINE committed, so after its waiter
# sent it. A grant handed to a place lasts at least grant_ttl from when its waiter sent
# ENTER_LINE: the waiter's local deadline may count from then (``line.handoff.claim``). Else
# the row is freed and the waiters whose turn it may be are told (TELL_TURNS), delivered when
# the release commits, only while the row is marked (a waiter may be in line: MARK_LINE;
# NOTIFY takes a lock at commit that every notifying transaction shares, so a release nobody
# waits for skips it). One row if released: (waiters told, NULL if the row is not marked;
# the place handed the row or 0). A marked row that told nobody is told again after the
# commit (TELL_TURNS_AFTER). (id, id, holder, fence)
RELEASE = (
    "WITH " + HEAD_OF_LINE + ", r AS (UPDATE {table} SET"
    " took_over = CASE WHEN {handed} THEN {false} ELSE took_over END,"
    " previous_holder = CASE WHEN {handed} THEN holder ELSE previous_holder END,"
    " fence = CASE WHEN {handed} THEN fence + 1 ELSE fence END,"
    " holder = CASE WHEN {handed} THEN h.who ELSE holder END,"
    " grant_token = CASE WHEN {handed} THEN h.tok ELSE '' END,"
    " busy_before = CASE WHEN {handed} THEN clock_timestamp() + make_interval(secs => h.ttl) ELSE {freed_at} END,"
    " acquired_at = CASE WHEN {handed} THEN {now} ELSE acquired_at END,"
    " renewed_at = CASE WHEN {handed} THEN {now} ELSE renewed_at END,"
    " released_at = CASE WHEN {handed} THEN NULL ELSE {now} END,"
    " lock_delay = CASE WHEN {handed} THEN 0 ELSE lock_delay END"
    " FROM (SELECT) o LEFT JOIN h ON TRUE WHERE {ours}"
    " RETURNING {table}.id AS row_id, kind, name, data, line_until, {handed} AS handed, h.place, h.chan,"
    " h.line_name, fence, previous_holder, acquired_at, busy_before),"
    " gone AS (DELETE FROM {waiters} WHERE id = (SELECT place FROM r WHERE handed))"
    " SELECT CASE WHEN r.handed AND r.chan <> '' THEN (SELECT COUNT(*) FROM pg_notify(r.chan,"
    " " + HANDED_GRANT + "::text)) WHEN r.handed THEN 0"
    " WHEN r.line_until > {now} THEN ("
    + TELL_TURNS.replace("{line_turns}", LINE_TURNS.replace("{less}", "").replace("{row_id}", "row_id"))
    + ") END, CASE WHEN r.handed THEN r.place ELSE 0 END FROM r"
)

# A release of a row no waiter has marked (no line kept it lately: MARK_LINE): the plain release
# of statements.py, which RELEASE is for such a row, without the hand-off's CTEs to plan and run
# (issue 39: a caller pays for the line only when there is one). A marked row matches nothing,
# and the release runs RELEASE. A waiter that marks the row while this runs waits for its row
# lock: marked first, this matches nothing; released first, the waiter finds it free at its
# look, as after a RELEASE of an unmarked row. (id, holder, fence)
RELEASE_UNMARKED = (
    "UPDATE {table} SET busy_before = {freed_at}, released_at = {now}, grant_token = ''"
    " WHERE {ours} AND (line_until IS NULL OR line_until <= {now})"
)

# A freed row's turns told again, with a snapshot taken after its RELEASE committed, when that
# release told nobody while the row was marked (a waiter may be in line): a place committed
# while the release ran was not in its snapshot, and its waiter's look, made before the release
# committed, saw the row held, so nobody would tell it before its LINE_POLL_MAX look
# (tests/test_release_race.py). The released row now counts among the kind's free rows, as in
# PASS_TURN. Only while the row is still free: a grant since has served someone. (id)
TELL_TURNS_AFTER = (
    "SELECT ("
    + TELL_TURNS.replace("{line_turns}", LINE_TURNS.replace("{less}", " - 1").replace("{row_id}", "id"))
    + ") FROM {table} r WHERE r.id = {p} AND r.line_until > {now} AND r.busy_before <= {now}"
)

# A grant a release handed to a waiter (RELEASE), read by the token of the waiter's place,
# with the seconds it has left by the database's clock (the waiter's local deadline counts
# from when it sent this read, not from the release it never saw). (id, token) / (kind, token)
CLAIM_HANDED_BY_ID = (
    "SELECT {columns}, EXTRACT(EPOCH FROM busy_before - {now}) FROM {table}"
    " WHERE id = {p} AND grant_token = {p} AND busy_before > {now}"
)
CLAIM_HANDED = (
    "SELECT {columns}, EXTRACT(EPOCH FROM busy_before - {now}) FROM {table}"
    " WHERE kind = {p} AND grant_token = {p} AND busy_before > {now}"
)

# A turn told to a waiter that did not take it (it was served by then, or gave up) passed on
# to the first waiters of its line (``wakeups.pass_turn``), as RELEASE tells them, the where=
# of each taken as matching and no row as cooling down. (kind, name)
PASS_TURN = (
    "WITH r AS (SELECT CAST({p} AS text) AS kind, CAST({p} AS text) AS name, CAST(NULL AS jsonb) AS data,"
    " CAST(NULL AS bigint) AS row_id)"
    " SELECT ("
    + TELL_TURNS.replace(
        "{line_turns}",
        LINE_TURNS.replace("{less}", " - 1").replace("{turn_matches}", "{true}").replace("{row_id}", "row_id"),
    )
    + ") FROM r"
)


# Give a read grant of an rwlock back (RW_READ_RELEASE), and wake the row's line when the last
# reader of the period lets go, as RELEASE does. One row if released: (waiters' lines told,
# whether the last reader let go of a marked row). A last reader of a marked row that told
# nobody tells again after its commit (RW_TELL_AFTER, as RELEASE's TELL_TURNS_AFTER). (id, fence)
RW_READ_RELEASE = (
    "WITH r AS (UPDATE {table} SET {rw_read_give_back} WHERE {rw_read_ours} RETURNING kind, name, readers, line_until)"
    " SELECT (SELECT COUNT(*) FROM (SELECT pg_notify('{line_channel}', json_build_array(r.kind, r.name)::text)"
    " WHERE r.readers = 0 AND EXISTS (SELECT 1 FROM {waiters} w WHERE w.kind = r.kind AND w.name = r.name"
    " AND w.expires_at > {now})) n), r.readers = 0 AND r.line_until > {now} FROM r"
)

# The line of a row whose last reader let go woken again, with a snapshot taken after that
# release committed (RW_READ_RELEASE told nobody): a place committed while it ran. Only while
# no reader has come since. (id)
RW_TELL_AFTER = (
    "SELECT pg_notify('{line_channel}', json_build_array(r.kind, r.name)::text) FROM {table} r"
    " WHERE r.id = {p} AND r.readers = 0 AND r.line_until > {now}"
    " AND EXISTS (SELECT 1 FROM {waiters} w WHERE w.kind = r.kind AND w.name = r.name AND w.expires_at > {now})"
)


# A waiter's grant in the line form ({grant}: ACQUIRE_SCAN, GRANT_BY_ID, GRANT_BY_NAME,
# GRANT_SAMPLED, or an rwlock's RW_READ and RW_WRITE, rendered) that also leaves its place if
# it granted, in the same statement and commit: the waiter's LEAVE_LINE after it then deletes nothing and writes no WAL, so the
# grant's hand-off costs one commit flush, not two. The DELETE reads the grant's own RETURNING
# (the same snapshot), so a refused grant leaves nothing. The grant's row comes with one more
# column: whether the place was there to delete (0: a release handed it a row a moment before,
# which its waiter gives back: ``line.Waiting.cleanup``). (the grant's parameters, place id)
LEAVING_LINE = (
    "WITH g AS ({grant}), gone AS (DELETE FROM {waiters} WHERE id = {p} AND EXISTS (SELECT 1 FROM g) RETURNING id)"
    " SELECT g.*, (SELECT COUNT(*) FROM gone) FROM g"
)
#: The grant statements a waiter's place leaves with (``LEAVING_LINE``).
LEAVING_GRANTS = ("ACQUIRE_SCAN", "GRANT_BY_ID", "GRANT_BY_NAME", "GRANT_SAMPLED", "RW_READ", "RW_WRITE")

#: Executions of one statement on a connection before psycopg prepares it (psycopg's default):
#: a lease statement is prepared on its sixth run, a one-off read never.
PREPARE_THRESHOLD = 5


#: The lease statements on this vendor: the common ones, with these of its own.
TEMPLATES: dict[str, str | Returning] = {
    **statements.TEMPLATES,
    "ACQUIRE_SCAN": ACQUIRE_SCAN,
    "FREE_BY_ID": FREE_BY_ID,
    "GRANTABLE_BY_ID": GRANTABLE_BY_ID,
    "GRANT_BY_ID": GRANT_BY_ID,
    "GRANT_SAMPLED": GRANT_SAMPLED,
    "RELEASE": RELEASE,
    "RELEASE_UNMARKED": RELEASE_UNMARKED,
    "TELL_TURNS_AFTER": TELL_TURNS_AFTER,
    "CLAIM_HANDED_BY_ID": CLAIM_HANDED_BY_ID,
    "CLAIM_HANDED": CLAIM_HANDED,
    "PASS_TURN": PASS_TURN,
    "RW_READ_RELEASE": RW_READ_RELEASE,
    "RW_TELL_AFTER": RW_TELL_AFTER,
}


class PostgreSQLLeases(LeaseStatements):
    """The lease statements on PostgreSQL: the probe's own statement (GRANT_SAMPLED), and a
    release that hands its row to the head of its line (``PostgreSQLLine.release_to_line``)."""

    def grant_sampled(
        self, cursor: Any, ask: Ask, *, sampled: Row, token: str, clock: Any, turn: Turn = NEWCOMER
    ) -> Row | None:
        in_line = turn.forms[0]  # a probe is a guess: the scan after it tries the line form
        return self.grant_row(
            cursor,
            "GRANT_SAMPLED",
            (*self.grant_params(ask, token), sampled[0], *self.grantable(ask, turn, in_line=in_line)),
            ask=ask,
            turn=turn,
            in_line=in_line,
        )

    def release(self, cursor: Any, *, pk: int, holder: str, fence: int) -> bool:
        return self.d.line.release_to_line(cursor, pk=pk, holder=holder, fence=fence)[0]


class PostgreSQLLine(LineStatements):
    """The line on PostgreSQL: a release hands its row to the head of the line in its own
    statement (RELEASE), and the grant of a waiter in the line form leaves its place in the
    same statement (LEAVING_LINE)."""

    hands_off = True
    #: Whether a release that told nobody of a marked row tells its turns again after its
    #: commit (TELL_TURNS_AFTER); off only for the negative control of tests/test_release_race.py.
    tells_again = True

    def __init__(self, dialect: Dialect) -> None:
        super().__init__(dialect)
        #: The rows whose last release on this connection found them marked (RELEASE told
        #: turns, or handed the row to a place): their next release runs RELEASE first.
        self._marked: set[int] = set()
        pieces = dialect.pieces()
        self.leaving = {
            (name, filtered, targeted): LEAVING_LINE.format(
                grant=dialect.forms[True, filtered, targeted][name], **pieces
            )
            for name in LEAVING_GRANTS
            for filtered in (False, True)
            for targeted in (False, True)
        }

    #: How many rows a connection remembers as marked (``release_to_line``): a hint, forgotten
    #: all at once when full (a pool larger than this with a line at every row pays the
    #: refused RELEASE_UNMARKED again, no more).
    MARKED_HINTS = 4096

    def release_to_line(self, cursor: Any, *, pk: int, holder: str, fence: int) -> tuple[bool, int]:
        # A row whose last release here found it marked (a line kept it) is released with
        # RELEASE at once: RELEASE_UNMARKED, which a marked row refuses, would cost every
        # release in a busy line a second statement. Either statement alone is a whole
        # release; the hint only chooses which one runs first.
        marked = self._marked
        if pk not in marked and self.d.execute(
            cursor, "RELEASE_UNMARKED", (pk, holder, fence), answer=Answer.CHANGED_ONE
        ):
            return True, 0
        # Autocommit (``connections.run``): RELEASE has committed when the second statement
        # takes its snapshot.
        rows = self.d.execute(cursor, "RELEASE", (pk, pk, holder, fence), answer=Answer.ROWS)
        if not rows:
            return False, 0
        told, handed_to = rows[0]
        if told is None and not handed_to:
            marked.discard(pk)  # no line keeps the row now: RELEASE_UNMARKED first again
        elif pk not in marked:
            if len(marked) >= self.MARKED_HINTS:
                marked.clear()
            marked.add(pk)
        if told == 0 and not handed_to and self.tells_again:
            self.d.execute(cursor, "TELL_TURNS_AFTER", (pk,), answer=Answer.ROWS)
        return True, int(handed_to)

    def handed_row(self, grant: Sequence[Any], *, holder: str, token: str) -> Row | None:
        # HANDED_GRANT: [place, kind, line name, row id, fence, name, previous holder,
        # acquired_at, busy_before, data]. The columns it does not carry load on first access.
        try:
            _, kind, _, pk, fence, name, previous, acquired, busy, data = grant
            values = {
                "id": int(pk),
                "kind": str(kind),
                "name": str(name),
                "data": DEFERRED if data is None else str(data),
                "enabled": True,  # HEAD_OF_LINE hands only an enabled row
                "busy_before": _aware(busy),
                "holder": holder,
                "fence": int(fence),
                "grant_token": token,
                "acquired_at": _aware(acquired),
                "renewed_at": _aware(acquired),
                "released_at": None,
                "took_over": False,
                "previous_holder": str(previous),
                "lock_delay": 0.0,
            }
        except (TypeError, ValueError):
            return None  # not what RELEASE sends: read the grant instead
        return tuple(values.get(name, DEFERRED) for name in self.d.attnames)

    def claim_handed(self, cursor: Any, *, kind: str, token: str, pk: int = 0) -> tuple[Row, float] | None:
        if pk:
            rows = self.d.execute(cursor, "CLAIM_HANDED_BY_ID", (pk, token), answer=Answer.ROWS)
        else:
            rows = self.d.execute(cursor, "CLAIM_HANDED", (kind, token), answer=Answer.ROWS)
        return (tuple(rows[0][:-1]), float(rows[0][-1])) if rows else None


class PostgreSQLRw(RwLockStatements):
    """An rwlock's statements on PostgreSQL: the last reader's release tells the writers
    waiting (RW_READ_RELEASE)."""

    def read_release(self, cursor: Any, *, pk: int, fence: int) -> bool:
        rows = self.d.execute(cursor, "RW_READ_RELEASE", (pk, fence), answer=Answer.ROWS)
        if not rows:
            return False
        told, last_of_marked = rows[0]
        if told == 0 and last_of_marked and PostgreSQLLine.tells_again:
            self.d.execute(cursor, "RW_TELL_AFTER", (pk,), answer=Answer.ROWS)
        return True


class PostgreSQLDialect(Dialect):
    vendor = "postgresql"
    # statement_timestamp() is the statement's start even inside a transaction (now() is
    # frozen at the transaction's BEGIN, so a long transaction would judge expiries by an
    # old clock) and, being stable, lets the planner use the index
    # (docs/pitfalls.md#database-clock).
    now_sql = NOW_SQL["postgresql"]
    templates, item_templates, topic_templates = (
        TEMPLATES,
        item_sql.POSTGRESQL_TEMPLATES,
        topic_sql.POSTGRESQL_TEMPLATES,
    )
    term_templates = term_sql.POSTGRESQL_TEMPLATES
    json_cast = "CAST({} AS jsonb)"
    where_types = {"str": "string", "int": "number", "true": "boolean", "false": "boolean", "null": "null"}
    line_channel = LINE_CHANNEL
    keeps_cursor = True
    leases_part = PostgreSQLLeases
    line_part = PostgreSQLLine
    rw_part = PostgreSQLRw

    def pieces(self) -> dict[str, str]:
        return {
            **super().pieces(),
            "line_channel": LINE_CHANNEL,
            "turn_matches": self.matches_sql("w.filter", "r.data"),
            "head_matches": self.matches_sql("w.filter", "me.data"),
            "handed": HANDED,
        }

    def expiry_sql(self, placeholder: str | None = None) -> str:
        return f"{self.now_sql} + make_interval(secs => {placeholder or '%s'})"

    def ttl_param(self, ttl: float) -> Any:
        return float(ttl)

    def delay_end_sql(self) -> str:
        return "busy_before + make_interval(secs => lock_delay)"

    def matches_sql(self, where: str, data: str) -> str:
        # docs/pitfalls.md#json-compared. The filter's entries as rows; each key's value in the row must have the same jsonb
        # type and text (->>: a string unquoted, a number as written, so 1 is not 1.0).
        return (
            f"NOT EXISTS (SELECT FROM jsonb_to_recordset({where}) AS f(k text, t text, s text)"
            f" WHERE NOT COALESCE(jsonb_typeof({data}->f.k) = f.t AND (f.t = 'null' OR ({data}->>f.k) = f.s),"
            " FALSE))"
        )

    def setup_session(self, raw_connection: Any, lock_wait_timeout: float) -> None:
        with raw_connection.cursor() as cursor:
            # Generic plans: a prepared statement is planned once per session, never again per
            # execution. With PostgreSQL's default ("auto") it may keep planning one for its
            # parameters at every execution when the generic plan's estimate looks dearer: a
            # waiter's look (LOOK_ANY) was planned every time, 0.64 ms of server CPU to plan
            # 0.1 ms of work, and a waiter's own grant leaving its place 0.55 ms
            # (docs/pitfalls.md#prepared-statements). Every statement here is by primary key
            # or by a kind's index, which a generic plan serves as well.
            cursor.execute(
                "SELECT set_config('lock_timeout', %s, false), set_config('statement_timeout', %s, false),"
                " set_config('plan_cache_mode', 'force_generic_plan', false)",
                (f"{int(lock_wait_timeout * 1000)}ms", f"{int(lock_wait_timeout * 2000)}ms"),
            )
        load_timestamps_natively(raw_connection)

    @staticmethod
    def connect_options(options: dict[str, Any], io_timeout: float, *, prepared: bool) -> None:
        options.setdefault("connect_timeout", max(2, round(io_timeout)))
        # TCP keepalives notice a vanished server while a renewal waits for an answer
        # (docs/pitfalls.md#dropped-connections).
        options.setdefault("keepalives_idle", max(1, round(io_timeout)))
        options.setdefault("keepalives_interval", 1)
        options.setdefault("keepalives_count", 3)
        # Keepalives are not sent while a statement waits for its answer: when the network
        # drops every packet (a partition, not a closed connection), the kernel retransmits
        # for about 15 minutes before the read fails, and the keeper thread, every renewal of
        # the process with it, waits that long. This bounds how long sent data may stay
        # unacknowledged (libpq's tcp_user_timeout, in ms; tests/test_partitions.py).
        options.setdefault("tcp_user_timeout", max(1000, round(io_timeout * 1000)))
        # Parse and plan each lease statement once per connection: bound parameters (Django's
        # default binds them into the text, which PostgreSQL must then parse and plan on every
        # execution: about 0.18 ms of server CPU per lease cycle here, docs/benchmarks.md) and
        # psycopg's automatic prepared statements. An alias that chose either itself keeps its
        # choice (docs/pitfalls.md#prepared-statements).
        if prepared and "server_side_binding" not in options and "prepare_threshold" not in options:
            options["server_side_binding"] = True
            options["prepare_threshold"] = PREPARE_THRESHOLD

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


def load_timestamps_natively(raw_connection: Any) -> None:
    """Read ``timestamptz`` on an engine session with psycopg's own loader (compiled, with
    psycopg[binary]) instead of the one Django registers on each connection it opens.

    Django's is a Python subclass of psycopg's pure-Python loader that sets the ``tzinfo``
    Django wants: about 7 µs per value here, and a grant's row carries four or five
    (``busy_before``, ``acquired_at``, ``renewed_at``, ``created_at``, a line's mark), a look
    two or three. psycopg's loader gives datetimes in the session's time zone; only when that
    is UTC, which is what Django sets with ``USE_TZ`` (the app requires it: ``checks.py``)
    and no ``TIME_ZONE`` of the alias, are they the very values Django's gives (aware, with
    ``datetime.timezone.utc``), so only then is it swapped. A session in another zone keeps
    Django's loader, and Django's own connections are never touched.
    """
    import psycopg

    if raw_connection.info.parameter_status("TimeZone") != "UTC":
        return
    oid = psycopg.adapters.types["timestamptz"].oid
    for form in (psycopg.pq.Format.TEXT, psycopg.pq.Format.BINARY):
        native = psycopg.adapters.get_loader(oid, form)
        if native is not None:
            raw_connection.adapters.register_loader(oid, native)


def _aware(text: Any) -> dt.datetime:
    """A timestamptz as json_build_array writes it (ISO 8601 with its offset), in UTC."""
    value = dt.datetime.fromisoformat(str(text))
    if value.tzinfo is None:
        raise ValueError(f"a timestamp without an offset: {text!r}")
    return value.astimezone(dt.UTC)
