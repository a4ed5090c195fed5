"""The statements of shared health (``Lease.report``, ``resource_lease.health``), per vendor.

A report is one fenced UPDATE of the leased row (holder, fence, token and expiry in its
WHERE, as every statement of a grant of ours): a report from a lease that is no longer held
matches nothing and changes nothing. The new score and backoff are computed by the database
from the row's own values in that statement, so two reports never lose each other's update
(``tests/test_health.py``: concurrent reports, and a read-then-write negative control).

MySQL/MariaDB assign left to right with the values already assigned (docs/pitfalls.md#set-order):
every SET below reads only columns that are assigned after it (or itself), so the statement
means the same on every database. ``_TRIP`` (this report quarantines the resource) reads
``health_score`` and ``backoff_level``, assigned last.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resource_lease.db.statements import Returning
from resource_lease.models import PoolPolicy, Resource

if TYPE_CHECKING:
    from resource_lease.db.base import Dialect

# A live grant of ours (named parameters pk, holder, fence).
_OURS = "id = {p_pk} AND holder = {p_holder} AND fence = {p_fence} AND grant_token <> '' AND busy_before > {now}"

# This failure quarantines the resource: a probation grant's failure, or the score reaching the
# threshold; once per grant (the level is still the one the grant saw: a second failure of the
# same grant while its quarantine runs adds to the score, no more).
_TRIP = "(({p_probation} = 1 OR health_score + 1 >= {p_threshold}) AND backoff_level = {p_level})"
# The backoff of the next automatic quarantine, before its jitter: base, then doubling, to the cap.
_NEXT = "{least}({p_cap}, CASE WHEN backoff_level = 0 THEN {p_base} ELSE backoff_seconds * 2 END)"
_STATE = "health_score, backoff_level, quarantined_until"

# A success: the score decays; a probation grant's success makes the resource healthy again
# (if no failure of the same grant has quarantined it since: the level is still the grant's).
# (probation, level, decay, pk, holder, fence) -> (score, level, quarantined_until)
_HEALED = "({p_probation} = 1 AND backoff_level = {p_level})"
REPORT_OK = Returning(
    update=(
        "UPDATE {table} SET"
        " health_score = CASE WHEN " + _HEALED + " THEN 0 ELSE health_score * {p_decay} END,"
        " backoff_seconds = CASE WHEN " + _HEALED + " THEN 0 ELSE backoff_seconds END,"
        " backoff_level = CASE WHEN " + _HEALED + " THEN 0 ELSE backoff_level END"
        " WHERE " + _OURS
    ),
    returning=_STATE,
    read_back="id = {p_pk}",
)
# A failure ("error", "blocked"): the score goes up by one; on a trip the resource is
# quarantined for jitter x the next backoff (at least ``hold`` seconds), one level up; a
# "blocked" with retry_after and no trip quarantines it for ``hold`` seconds.
# (probation, level, threshold, base, cap, jitter, hold, reason, hold_reason, pk, holder, fence)
REPORT_FAILURE = Returning(
    update=(
        "UPDATE {table} SET"
        " quarantined_until = CASE WHEN " + _TRIP + " THEN {plus_open}{greatest}({p_jitter} * " + _NEXT + ","
        " {p_hold}){plus_close} WHEN {p_hold} > 0 THEN {plus_open}{p_hold}{plus_close} ELSE quarantined_until END,"
        " quarantine_reason = CASE WHEN " + _TRIP + " THEN {p_reason} WHEN {p_hold} > 0 THEN {p_hold_reason}"
        " ELSE quarantine_reason END,"
        " backoff_seconds = CASE WHEN " + _TRIP + " THEN " + _NEXT + " ELSE backoff_seconds END,"
        " backoff_level = CASE WHEN " + _TRIP + " THEN backoff_level + 1 ELSE backoff_level END,"
        " health_score = health_score + 1"
        " WHERE " + _OURS
    ),
    returning=_STATE,
    read_back="id = {p_pk}",
)
# Retire a resource that has been granted ``max_uses`` times or is ``max_age`` seconds old
# (a policy without one passes a bound never reached). (reason, pk, max_uses, age) -> rowcount
RETIRE = (
    "UPDATE {table} SET enabled = {false}, quarantine_reason = {p_reason}"
    " WHERE id = {p_pk} AND enabled = {true}"
    " AND (fence >= {p_max_uses} OR created_at <= {plus_open}0 - {p_max_age}{plus_close})"
)
# A granted row's backoff level, where its grant did not carry it (a PostgreSQL hand-off, a MySQL
# probe): read on the engine's connection, never a snapshot of the caller's transaction. (pk)
LEVEL_READ = "SELECT backoff_level FROM {table} WHERE id = {p_pk}"
# A kind's stored policy. (kind)
POLICY_READ = (
    "SELECT error_threshold, error_decay, backoff_base, backoff_cap, target_rate_n, target_rate_per,"
    " cooldown, session_idle, max_uses, max_age FROM {policies} WHERE kind = {p_kind}"
)

TEMPLATES: dict[str, str | Returning] = {
    "REPORT_OK": REPORT_OK,
    "REPORT_FAILURE": REPORT_FAILURE,
    "RETIRE": RETIRE,
    "LEVEL_READ": LEVEL_READ,
    "POLICY_READ": POLICY_READ,
}

# ``now`` plus an SQL expression of seconds (a float), per vendor: what goes before and after it.
_PLUS = {
    "postgresql": ("({now} + make_interval(secs => ", "))"),
    "mysql": ("({now} + INTERVAL ROUND((", ") * 1000000) MICROSECOND)"),
    "sqlite": ("strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.3f seconds', ", "))"),
}
_LEAST_GREATEST = {"sqlite": ("MIN", "MAX")}


def pieces(dialect: Dialect) -> dict[str, str]:
    """What these templates leave open, for ``dialect``'s vendor and tables."""
    qn = dialect.connection.ops.quote_name
    plus_open, plus_close = _PLUS[dialect.vendor]
    least, greatest = _LEAST_GREATEST.get(dialect.vendor, ("LEAST", "GREATEST"))
    return {
        "table": qn(Resource._meta.db_table),
        "policies": qn(PoolPolicy._meta.db_table),
        "now": dialect.now_sql,
        "plus_open": plus_open.format(now=dialect.now_sql),
        "plus_close": plus_close,
        "least": least,
        "greatest": greatest,
        "true": dialect.true,
        "false": dialect.false,
        "named": dialect.named_placeholder,
        "quote": qn("{}"),
    }
