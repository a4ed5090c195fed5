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
``{free}``, ``{ours}``, ``{grant_set}``, ``{freed_at}``, ``{missing_row}``
    The fragments below, rendered first: a template may use any template above it, by its
    name in lower case.
``{limit}``, ``{rows}``, ``{names}``
    Filled per call (``fill``), for the few statements whose size the caller chooses.
"""

from __future__ import annotations

from typing import NamedTuple


class Returning(NamedTuple):
    """A single-row UPDATE and the row it changed.

    The vendor's ``RETURNING`` template joins the parts: ``UPDATE ... RETURNING {returning}``,
    or on MySQL, which has no RETURNING (docs/pitfalls.md#no-returning), the UPDATE and a
    SELECT of the ``read_back`` row sent as one query. ``read_back`` names the changed row by
    its own parameters, which the caller passes after the UPDATE's.
    """

    update: str
    returning: str = "{columns}"
    read_back: str = ""


#: How a ``Returning`` becomes one statement.
RETURNING = "{update} RETURNING {returning}"

#: Pieces filled per call; any other unknown name in a template is an error.
PER_CALL = ("limit", "rows", "names")

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

# The grant's SET list. Order matters on MySQL, which evaluates assignments left to right
# with already-updated values (docs/pitfalls.md#set-order): read the old holder and token first.
GRANT_SET = (
    "took_over = (grant_token <> ''), previous_holder = holder,"
    " fence = fence + 1, holder = {p}, grant_token = {p},"
    " busy_before = {expiry}, acquired_at = {now}, renewed_at = {now},"
    " released_at = NULL"
)

# After release the row sorts as most recently used; a quarantine decided while it was held
# takes effect now by pushing busy_before out of the acquire's index range.
FREED_AT = "CASE WHEN quarantined_until > {now} THEN quarantined_until ELSE {now} END"

# One new row of INSERT_MISSING: (kind, name, data, never), free and never leased.
MISSING_ROW = "({p}, {p}, {p}, {true}, {p}, '', 0, '', {false}, '', '', {now})"

# -- grants ------------------------------------------------------------------------------------

# Grant one chosen row (the holder's lock step, the probe) if it is free:
# (holder, token, ttl, id, kind), read back by (id, token).
GRANT_BY_ID = Returning(
    "UPDATE {table} SET {grant_set} WHERE id = {p} AND {free}",
    read_back="id = {p} AND grant_token = {p}",
)

# Grant the row (kind, name) if it is free (locks, elections, members); the unique (kind,
# name) index finds it: (holder, token, ttl, name, kind), read back by (kind, name, token).
GRANT_BY_NAME = Returning(
    "UPDATE {table} SET {grant_set} WHERE name = {p} AND {free}",
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

# Whether this grant was given back, its token cleared (an operator's force release counts):
# settles a release whose answer was lost (docs/pitfalls.md#unknown-outcome). (id, holder, fence)
WAS_RELEASED = "SELECT 1 FROM {table} WHERE id = {p} AND holder = {p} AND fence = {p} AND grant_token = ''"

# The row granted under a token, if that grant committed and is still live: settles a grant
# whose answer was lost (docs/pitfalls.md#unknown-outcome). (kind, token)
FIND_GRANT = "SELECT {columns} FROM {table} WHERE kind = {p} AND grant_token = {p} AND busy_before > {now}"

# -- rows by kind and name ---------------------------------------------------------------------

# (kind)
KIND_EXISTS = "SELECT 1 FROM {table} WHERE kind = {p} LIMIT 1"

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
    "GRANT_SET": GRANT_SET,
    "FREED_AT": FREED_AT,
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
    "KIND_EXISTS": KIND_EXISTS,
    "LIMIT_SLOTS": LIMIT_SLOTS,
    "INSERT_MISSING": INSERT_MISSING,
    "READ_KIND": READ_KIND,
    "READ_NAMED": READ_NAMED,
}


class _Pieces(dict[str, str]):
    """The pieces for ``str.format_map``: a per-call name stays as it is, for ``fill``."""

    def __missing__(self, key: str) -> str:
        if key in PER_CALL:
            return "{" + key + "}"
        raise KeyError(f"no piece {key!r} for a lease statement template")


def render(templates: dict[str, str | Returning], pieces: dict[str, str], returning: str) -> dict[str, str]:
    """Every template with ``pieces`` put in, in order; each rendered one is a piece (its name in
    lower case) for those after it. A ``Returning`` is joined by the vendor's ``returning``."""
    known = _Pieces(pieces)
    sql: dict[str, str] = {}
    for name, template in templates.items():
        if isinstance(template, Returning):
            if "{read_back}" in returning and not template.read_back:
                raise ValueError(f"{name} names no row to read back, and this vendor has no RETURNING")
            parts = {field: value.format_map(known) for field, value in template._asdict().items()}
            text = returning.format(table=known["table"], **parts)
        else:
            text = template.format_map(known)
        sql[name] = known[name.lower()] = text
    return sql


def fill(sql: str, **holes: str) -> str:
    """A rendered statement with its per-call pieces (``PER_CALL``) put in."""
    for name, value in holes.items():
        sql = sql.replace("{" + name + "}", value)
    return sql
