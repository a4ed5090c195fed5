"""The lease statements, each whole under its name, with the vendor's pieces left open.

A dialect (``resource_lease.db.base.Dialect``) renders these once, when it is made, into
``dialect.sql[NAME]``; the methods that run thousands of times a second only look them up.
A vendor module overrides only the templates that differ (each vendor's ACQUIRE_SCAN, MySQL's
RETURNING and its probe).

The pieces a template may use:

``{table}``, ``{columns}``
    The lease table and its columns in model order (the row every method returns).
``{p}``
    The driver's placeholder (``%s``, SQLite's ``?``).
``{now}``, ``{expiry}``
    The database's clock in UTC, and ``now + ttl`` whose ttl is the next parameter.
``{true}``, ``{false}``, ``{index_hint}``, ``{on_conflict_keep}``
    Vendor spellings (see ``Dialect``).
``{delay_end}``
    The end of the row's lock delay: ``busy_before`` plus the row's ``lock_delay`` seconds.
``{waiters}``, ``{json_param}``
    The line of waiters' table (``models.Waiter``), and a placeholder for JSON text.
``{waiter_matches}``, ``{param_matches}``
    Whether the row's ``data`` has every key of a ``where`` filter with an equal value: the
    filter of the waiter ``w`` (``Waiter.filter``), or the filter given as the next parameter
    (the vendor's JSON functions; ``Dialect.encode_where`` writes what they compare).
``{own_filter}``
    Empty in the statements of a caller without a ``where=`` filter; `` AND {param_matches}``
    in those with one.
``{own_target}``
    Empty in the statements of a caller without a ``target=``; `` AND NOT {param_cools}`` in
    those with one (``OWN_TARGET``): the row is not cooling down for the target given as the
    next parameter (``models.Cooldown``).
``{cooldowns}``, ``{waiter_cools}``
    The cooldowns' table, and whether the row is cooling down for the target of the waiter
    ``w`` (false for a waiter without one).
``{line_check}``
    How a grant honours the line of waiters: ``LINE_CLEAR`` (the line form, for a caller with a
    place in line, and for a newcomer when the other form found the row marked) or
    ``UNMARKED`` (the newcomer's first try). ``Dialect.forms`` holds the statements in each
    of the four forms (line form or not, with a filter or not); ``Dialect.sql`` is the line
    form without a filter.
``{free}``, ``{ours}``, ``{grant_set}``, ``{freed_at}``, ``{missing_row}``, ...
    The fragments below, rendered first: a template may use any template above it, by its
    name in lower case.
``{limit}``, ``{rows}``, ``{names}``
    Filled per call (``fill``), for the few statements whose size the caller chooses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from resource_lease.db.returning import Returning as Returning  # where the vendors import it from
from resource_lease.db.rw_statements import TEMPLATES as RW_TEMPLATES

#: How a ``Returning`` becomes one statement.
RETURNING = "{update} RETURNING {returning}"

#: Pieces filled per call; any other unknown name in a template is an error.
PER_CALL = (
    "limit",
    "rows",
    "names",
    # the dispenser's (db/dispenser.py)
    "pattern",
    "pattern_r",
    "pattern_plus",
    "keys",
    "fences",
    "key_filter",
    "fence_filter",
    "tokens",
    "token_order",
    "ids",
    "row_key",
    "row_payload",
    "matching",
)


# -- fragments -------------------------------------------------------------------------------

# Where the lease condition of a grant is checked: ours (holder and fence in the WHERE,
# because Django's MySQL backend counts the rows an UPDATE matched, not the rows it changed:
# docs/pitfalls.md#found-rows), not given back (a release or force release clears the token,
# and may leave busy_before in the future: the end of a quarantine), and not yet expired by
# the database's clock.
OURS = "id = {p} AND holder = {p} AND fence = {p} AND grant_token <> '' AND busy_before > {now}"

# Free to grant: the kind's rows whose grant ended, enabled, not in quarantine. The same
# rows as ResourceQuerySet.free() (tests/test_states.py proves it on every database).
FREE = (
    "kind = {p} AND busy_before <= {now} AND enabled = {true}"
    " AND (quarantined_until IS NULL OR quarantined_until <= {now})"
)

# The lock delay is over: the last grant was given back (a release or force release clears the
# token: free at once), or asked for no delay, or expired more than its lock delay ago. A plain
# comparison on the row's own columns (no subquery), judged by the database's clock.
DELAY_OVER = "(grant_token = '' OR lock_delay = 0 OR {delay_end} <= {now})"

# -- the line of waiters (models.Waiter) ---------------------------------------------------------

#: Free rows a grant in the line form counts at most (LINE_CLEAR's room) and a waiter's look
#: counts at most (LOOK_ANY): waiters further back than this wait until they are this close
#: to the front, whatever else is free.
LINE_ROOM = 64

# Whether the row ({table}) is cooling down for a target: the waiter w's (none: false), or the
# caller's, given as the next parameter (OWN_TARGET). A cooldown ends by the database's clock.
WAITER_COOLS = (
    "(w.target <> '' AND EXISTS (SELECT 1 FROM {cooldowns} c WHERE c.target = w.target"
    " AND c.resource_id = {table}.id AND c.until > {now}))"
)
OWN_TARGET = " AND NOT EXISTS (SELECT 1 FROM {cooldowns} c WHERE c.target = {p} AND c.resource_id = {table}.id AND c.until > {now})"

# A grant's turn: the row's line (its kind, and its name or '' for any row) leaves room for the
# caller. Ahead of it: the live waiters with a higher priority, or the same and an older place;
# a caller without a live place (a newcomer, timeout=0; a waiter paused past its place's ttl)
# has every live waiter ahead of it. Room: fewer waiters ahead of it without a where= (any row
# serves them) than there are free rows, and no waiter ahead of it whose where= this row
# matches (each counts LINE_ROOM, so one sum says both). Waiters whose where= the row does not
# match do not count, nor those whose target the row is cooling down for (WAITER_COOLS): a
# waiter cannot block the rows it may not take. So a pool's line serves as many of its first waiters at once as it has
# free rows (up to LINE_ROOM), each with a row of its own, rather than one at a time through
# the head of the line. A caller without a live place has room for one only: it takes a row
# only if no live waiter wants it, as if the pool had that one free row. (Callers without a
# place all stand at the same rank: were they to count the free rows, two of them reading the
# same snapshot would each take one of two rows meant for a waiter and one of them.)
# A named row's line has room for its first waiter only.
# (line name, id, priority, priority, id, id, line name, id, kind)
LINE_CLEAR = (
    "(SELECT COALESCE(SUM(CASE WHEN {waiter_cools} THEN 0 WHEN w.filter IS NULL THEN 1 WHEN {waiter_matches} THEN "
    + str(LINE_ROOM)
    + " ELSE 0 END), 0)"
    " FROM {waiters} w WHERE w.kind = {table}.kind AND w.name = {p}"
    " AND w.expires_at > {now} AND w.id <> {p}"
    " AND (w.priority > {p} OR (w.priority = {p} AND w.id < {p})"
    " OR NOT EXISTS (SELECT 1 FROM {waiters} me WHERE me.id = {p} AND me.expires_at > {now})))"
    " < CASE WHEN {p} = '' AND EXISTS (SELECT 1 FROM {waiters} me WHERE me.id = {p} AND me.expires_at > {now})"
    " THEN (SELECT COUNT(*) FROM (SELECT 1 FROM {table} {index_hint}"
    " WHERE {free} AND {delay_over} LIMIT " + str(LINE_ROOM) + ") room) ELSE 1 END"
)

# The newcomer's first try: no waiter has marked the row (Resource.line_until, written by
# the waiters before they take or keep a place: MARK_LINE). A plain comparison on the row,
# because on MariaDB any subquery in the statement costs its optimizer more than the whole
# grant otherwise does, executed or not (docs/pitfalls.md#subquery-cost). A marked row is
# tried again in the line form (LINE_CLEAR), whose answer may be yes (the waiters left, or
# their where= does not match). No parameters.
UNMARKED = "(line_until IS NULL OR line_until <= {now})"

# What a grant may take: free, past its lock delay, the caller's turn ({line_check}:
# LINE_CLEAR, or UNMARKED for a newcomer's first try), the caller's where= ({own_filter}) and
# not cooling down for its target ({own_target}). (kind, [*line], [where], [target])
GRANTABLE = "{free} AND {delay_over} AND {line_check}{own_filter}{own_target}"

# The grant's SET list. Order matters on MySQL, which evaluates assignments left to right
# with already-updated values (docs/pitfalls.md#set-order): read the old holder and token first.
# (holder, token, ttl, lock_delay)
GRANT_SET = (
    "took_over = (grant_token <> ''), previous_holder = holder,"
    " fence = fence + 1, holder = {p}, grant_token = {p},"
    " busy_before = {expiry}, acquired_at = {now}, renewed_at = {now},"
    " released_at = NULL, lock_delay = {p}"
)

# When a row may next be granted, as far as its grant says: its expiry, or for a grant that
# is not given back, the end of its lock delay (a waiter's next look).
FREE_AT = "CASE WHEN grant_token <> '' AND lock_delay > 0 THEN {delay_end} ELSE busy_before END"

# After release the row sorts as most recently used; a quarantine decided while it was held
# takes effect now by pushing busy_before out of the acquire's index range.
FREED_AT = "CASE WHEN quarantined_until > {now} THEN quarantined_until ELSE {now} END"

# One new row of INSERT_MISSING: (kind, name, data, never), free and never leased.
MISSING_ROW = "({p}, {p}, {p}, {true}, {p}, '', 0, '', {false}, '', '', {now})"

# -- grants ------------------------------------------------------------------------------------

# Grant one chosen row (the holder's lock step, the probe) if it is free:
# (holder, token, ttl, lock_delay, id, kind, *line, [where]), read back by (id, token).
GRANT_BY_ID = Returning(
    "UPDATE {table} SET {grant_set} WHERE id = {p} AND {grantable}",
    read_back="id = {p} AND grant_token = {p}",
)

# Grant the row (kind, name) if it is free (locks, elections, members); the unique (kind,
# name) index finds it: (holder, token, ttl, lock_delay, name, kind, *line), read back by
# (kind, name, token).
GRANT_BY_NAME = Returning(
    "UPDATE {table} SET {grant_set} WHERE name = {p} AND {grantable}",
    read_back="kind = {p} AND name = {p} AND grant_token = {p}",
)

# Up to {limit} free rows of a kind, and the database's clock: the sample acquire() probes.
# No ORDER BY: any free rows will do, and with statistics older than the pool a sort let the
# planner read every row of the kind to sort them (MariaDB: 100,000 rows, 0.5 s, each time;
# docs/pitfalls.md#stale-statistics). Walked in the acquire index's order where it is
# named ({index_hint}), which is least recently used first. (kind)
FREE_ROWS = "SELECT {columns}, {now} FROM {table} {index_hint} WHERE {free} LIMIT {limit}"

# The database's clock alone, when a read found no rows to carry it.
READ_CLOCK = "SELECT {now}"

# -- a grant of ours ----------------------------------------------------------------------------

# Extend a live grant: (ttl, id, holder, fence), read back by (id, fence).
RENEW = Returning(
    "UPDATE {table} SET busy_before = {expiry}, renewed_at = {now} WHERE {ours}",
    returning="busy_before",
    read_back="id = {p} AND fence = {p}",
)

# Give a live grant back: (id, holder, fence).
RELEASE = "UPDATE {table} SET busy_before = {freed_at}, released_at = {now}, grant_token = '' WHERE {ours}"

# A fenced write of the payload: (data, id, holder, fence).
WRITE_DATA = "UPDATE {table} SET data = {p} WHERE {ours}"

# Whether a grant is still live: (id, holder, fence).
IS_HELD = "SELECT 1 FROM {table} WHERE {ours}"

# Whether this grant was given back, its token cleared (an operator's force release counts),
# or the next grant followed a release of it (not its expiry: took_over false), as when
# PostgreSQL's RELEASE handed it to a waiter: settles a release whose answer was lost
# (docs/pitfalls.md#unknown-outcome). (id, holder, fence, holder, fence)
WAS_RELEASED = (
    "SELECT 1 FROM {table} WHERE id = {p} AND ((holder = {p} AND fence = {p} AND grant_token = '')"
    " OR (previous_holder = {p} AND fence = {p} + 1 AND took_over = {false}))"
)

# The row granted under a token, if that grant committed and is still live: settles a grant
# whose answer was lost (docs/pitfalls.md#unknown-outcome). (kind, token)
FIND_GRANT = "SELECT {columns} FROM {table} WHERE kind = {p} AND grant_token = {p} AND busy_before > {now}"

# -- places in line ----------------------------------------------------------------------------

# Mark the rows a waiter may be waiting for (the kind's rows matching its where=, or the
# named row), before it takes or keeps a place: until the mark ends, a grant of them checks
# the line. A mark lasts twice the place's ttl and is written again once less than 1.5 ttl of
# it is left, so it always outlasts the places kept after it (RENEW_PLACE: at most one ttl);
# a line kept by several waiters is marked about once every half ttl, by one of them.
# (2 * ttl, kind, 1.5 * ttl, [where]); MARK_NAMED adds the name after the kind.
MARK_LINE = "UPDATE {table} SET line_until = {expiry} WHERE kind = {p} AND (line_until IS NULL OR line_until < {expiry}){own_filter}"
MARK_NAMED = (
    "UPDATE {table} SET line_until = {expiry} WHERE kind = {p} AND name = {p}"
    " AND (line_until IS NULL OR line_until < {expiry})"
)

# Take a place at the back of a line: (kind, name, holder, priority, filter, target, shared,
# token, channel, grant_ttl, ttl), its id read back by (token). The channel: where the waiter's
# process hears its turn (PostgreSQL's RELEASE), '' elsewhere; grant_ttl: the ttl of the grant
# a release may hand the waiter (PostgreSQL's RELEASE), 0 elsewhere.
ENTER_LINE = Returning(
    "INSERT INTO {waiters} (kind, name, holder, priority, filter, target, shared, token, channel, grant_ttl, since,"
    " expires_at) VALUES ({p}, {p}, {p}, {p}, {json_param}, {p}, {p}, {p}, {p}, {p}, {now}, {expiry})",
    returning="id",
    read_back="token = {p}",
    table="{waiters}",
)

# The place taken under a token, if that insert committed: settles an ENTER_LINE whose answer
# was lost (docs/pitfalls.md#unknown-outcome). (token)
FIND_PLACE = "SELECT id FROM {waiters} WHERE token = {p}"

# Keep a live place: (ttl, id). A place already expired is lost: its waiter goes to the back.
RENEW_PLACE = "UPDATE {waiters} SET expires_at = {expiry} WHERE id = {p} AND expires_at > {now}"

# Leave the line (served, gave up, cancelled): (id).
LEAVE_LINE = "DELETE FROM {waiters} WHERE id = {p}"

# Places of a line that expired (their waiters died or were paused): they no longer count, and
# whoever enters the line next drops them. (kind, name)
PURGE_LINE = "DELETE FROM {waiters} WHERE kind = {p} AND name = {p} AND expires_at <= {now}"

# Every line's expired places, now and then: a line nobody enters again is never purged by
# PURGE_LINE (its newcomers run it). ()
PURGE_LINES = "DELETE FROM {waiters} WHERE expires_at <= {now}"

# A waiter's look at its line, all reads (no row lock, cheap enough to run often): whether its
# place is live, how many live waiters are ahead of it (and how many of those have a where=
# or a target of their own: they may not want the rows it could take), whether a row it could
# take is free (up to {limit} of them), when the first held row of the line expires, the
# database's clock, and when the first cooldown of its target on a row of the kind ends (no
# release tells a waiter that: it looks again then; NULL for a waiter without a target).
# Any row of a kind: (id, kind, id, priority, priority, id, kind, id, priority, priority, id,
# kind, [where], [target], kind, target or '', kind).
LOOK_ANY = (
    "SELECT (SELECT COUNT(*) FROM {waiters} me WHERE me.id = {p} AND me.expires_at > {now}),"
    " (SELECT COUNT(*) FROM {waiters} w WHERE w.kind = {p} AND w.name = '' AND w.expires_at > {now}"
    " AND w.id <> {p} AND (w.priority > {p} OR (w.priority = {p} AND w.id < {p}))),"
    " (SELECT COUNT(*) FROM {waiters} w WHERE w.kind = {p} AND w.name = '' AND w.expires_at > {now}"
    " AND w.id <> {p} AND (w.priority > {p} OR (w.priority = {p} AND w.id < {p}))"
    " AND (w.filter IS NOT NULL OR w.target <> '')),"
    " {look_free},"
    " (SELECT MIN(busy_before) FROM {table} WHERE kind = {p} AND busy_before > {now} AND enabled = {true}),"
    " {now},"
    " (SELECT MIN(c.until) FROM {cooldowns} c WHERE c.target = {p} AND c.until > {now}"
    " AND c.resource_id IN (SELECT id FROM {table} WHERE kind = {p}))"
)

# The look's free rows the waiter could take, up to {limit}: how many (MySQL: which, LOOK_FREE
# in db/mysql.py). ([where], [target])
LOOK_FREE = (
    "(SELECT COUNT(*) FROM (SELECT 1 FROM {table} {index_hint} WHERE {free} AND {delay_over}{own_filter}{own_target}"
    " LIMIT {limit}) f)"
)

# The same for one named row (its line has no where= filters nor targets); the row frees up at the end of
# its lock delay if its grant is not given back:
# (id, kind, name, id, priority, priority, id, kind, name, kind, name).
LOOK_NAMED = (
    "SELECT (SELECT COUNT(*) FROM {waiters} me WHERE me.id = {p} AND me.expires_at > {now}),"
    " (SELECT COUNT(*) FROM {waiters} w WHERE w.kind = {p} AND w.name = {p} AND w.expires_at > {now}"
    " AND w.id <> {p} AND (w.priority > {p} OR (w.priority = {p} AND w.id < {p}))),"
    " 0,"
    " (SELECT COUNT(*) FROM {table} WHERE {free} AND {delay_over} AND name = {p}),"
    " (SELECT MAX({free_at}) FROM {table} WHERE kind = {p} AND name = {p}),"
    " {now}, NULL"
)

# The live places of a line in the order they are served, first {limit}: (kind, name).
LINE_WAITERS = (
    "SELECT id, holder, priority, since, expires_at FROM {waiters}"
    " WHERE kind = {p} AND name = {p} AND expires_at > {now} ORDER BY priority DESC, id LIMIT {limit}"
)

# -- rows by kind and name ---------------------------------------------------------------------

# (kind)
KIND_EXISTS = "SELECT 1 FROM {table} WHERE kind = {p} LIMIT 1"

# A few of the pools' kinds, for the error of a kind that has none (coordination rows, whose
# kinds start with '@', left out). (coordination prefix pattern)
SOME_KINDS = "SELECT DISTINCT kind FROM {table} WHERE kind NOT LIKE {p} ORDER BY kind LIMIT {limit}"

# A semaphore's slot count: enable the names before a bound, disable the others; a row that
# already agrees is not touched. (below, kind, below)
LIMIT_SLOTS = "UPDATE {table} SET enabled = (name < {p}) WHERE kind = {p} AND enabled <> (name < {p})"

# Create the rows that do not exist yet, keeping any that another connection creates at the
# same moment: {rows} is MISSING_ROW once per name.
INSERT_MISSING = (
    "INSERT INTO {table} (kind, name, data, enabled, busy_before, holder, fence, grant_token,"
    " took_over, previous_holder, quarantine_reason, created_at)"
    " VALUES {rows} {on_conflict_keep}"
)

# The rows of a kind with the database's clock: (kind).
READ_KIND = "SELECT {columns}, {now} FROM {table} WHERE kind = {p}"

# The same for some names: (kind, *names); {names} is one placeholder per name.
READ_NAMED = "SELECT {columns}, {now} FROM {table} WHERE kind = {p} AND name IN ({names})"

#: Every template a dialect renders, in order (a template may use the ones before it).
TEMPLATES: dict[str, str | Returning] = {
    "OURS": OURS,
    "FREE": FREE,
    "UNMARKED": UNMARKED,
    "WAITER_COOLS": WAITER_COOLS,
    "LINE_CLEAR": LINE_CLEAR,
    "GRANTABLE": GRANTABLE,
    "GRANT_SET": GRANT_SET,
    "FREED_AT": FREED_AT,
    "DELAY_OVER": DELAY_OVER,
    "FREE_AT": FREE_AT,
    "MISSING_ROW": MISSING_ROW,
    "GRANT_BY_ID": GRANT_BY_ID,
    "GRANT_BY_NAME": GRANT_BY_NAME,
    "FREE_ROWS": FREE_ROWS,
    "READ_CLOCK": READ_CLOCK,
    "RENEW": RENEW,
    "RELEASE": RELEASE,
    "WRITE_DATA": WRITE_DATA,
    "IS_HELD": IS_HELD,
    "WAS_RELEASED": WAS_RELEASED,
    "FIND_GRANT": FIND_GRANT,
    "MARK_LINE": MARK_LINE,
    "MARK_NAMED": MARK_NAMED,
    "ENTER_LINE": ENTER_LINE,
    "FIND_PLACE": FIND_PLACE,
    "RENEW_PLACE": RENEW_PLACE,
    "LEAVE_LINE": LEAVE_LINE,
    "PURGE_LINE": PURGE_LINE,
    "PURGE_LINES": PURGE_LINES,
    "LOOK_ANY": LOOK_ANY,
    "LOOK_FREE": LOOK_FREE,
    "LOOK_NAMED": LOOK_NAMED,
    "LINE_WAITERS": LINE_WAITERS,
    **RW_TEMPLATES,
    "KIND_EXISTS": KIND_EXISTS,
    "SOME_KINDS": SOME_KINDS,
    "LIMIT_SLOTS": LIMIT_SLOTS,
    "INSERT_MISSING": INSERT_MISSING,
    "READ_KIND": READ_KIND,
    "READ_NAMED": READ_NAMED,
}


class _Pieces(dict[str, str]):
    """The pieces for ``str.format_map``: another template by its name in lower case
    (rendered first, whatever the order of the set); a per-call name stays as it is, for
    ``fill``; ``p_<name>`` is the named parameter ``name`` in the driver's style
    (``pieces["named"]``, e.g. ``%({})s``), ``q_<name>`` the column ``name`` quoted
    (``pieces["quote"]``, e.g. ``"{}"``)."""

    def __init__(self, pieces: dict[str, str], render_one: Callable[[str], str | None]) -> None:
        super().__init__(pieces)
        self._render_one = render_one

    def __missing__(self, key: str) -> str:
        if key in PER_CALL:
            return "{" + key + "}"
        if key.startswith("p_") and "named" in self:
            return self["named"].format(key[2:])
        if key.startswith("q_") and "quote" in self:
            return self["quote"].format(key[2:])
        rendered = self._render_one(key.upper())
        if rendered is None:
            raise KeyError(f"no piece {key!r} for a statement template")
        return rendered


def render(
    templates: Mapping[str, str | Returning], pieces: dict[str, str], returning: str = RETURNING
) -> dict[str, str]:
    """Every template with ``pieces`` put in; a template may use any other of the set by its
    name in lower case. A ``Returning`` is joined by the vendor's ``returning``."""
    sql: dict[str, str] = {}

    def render_one(name: str) -> str | None:
        if name in sql:
            return sql[name]
        template = templates.get(name)
        if template is None:
            return None
        if isinstance(template, Returning):
            if "{read_back}" in returning and not template.read_back:
                raise ValueError(f"{name} names no row to read back, and this vendor has no RETURNING")
            parts = {field: value.format_map(known) for field, value in template._asdict().items()}
            text = returning.format(**parts)
        else:
            text = template.format_map(known)
        sql[name] = text
        return text

    known = _Pieces(pieces, render_one)
    for name in templates:
        render_one(name)
    return {name: sql[name] for name in templates}


def fill(sql: str, **holes: str) -> str:
    """A rendered statement with its per-call pieces (``PER_CALL``) put in."""
    for name, value in holes.items():
        sql = sql.replace("{" + name + "}", value)
    return sql
