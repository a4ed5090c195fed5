"""The statements of sticky sessions (``models.SessionBinding``, ``resource_lease.sessions``),
per vendor: the binding read with its resource, judged by the database's clock, and the
binding written (an upsert: a new binding, or the old one moved)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from resource_lease.db import cooldowns
from resource_lease.models import SessionBinding

if TYPE_CHECKING:
    from resource_lease.db.base import Dialect

# A session's binding if it lives (its last grant less than ``idle`` seconds ago), with what
# decides whether its resource can serve a call: the resource (its id, NULL if it was deleted,
# name, enabled, quarantined until, data), the database's clock, and the end of its cooldown
# for ``target`` if one runs. (target, kind, session, idle)
BINDING_READ = (
    "SELECT b.resource_id, r.name, r.enabled, r.quarantined_until, r.data, {now},"
    " (SELECT MAX(c.until) FROM {cooldowns} c WHERE c.resource_id = b.resource_id AND c.target = {p_target}"
    " AND c.until > {now})"
    " FROM {bindings} b LEFT JOIN {table} r ON r.id = b.resource_id"
    " WHERE b.kind = {p_kind} AND b.session = {p_session} AND b.last_used > {plus_open}0 - {p_idle}{plus_close}"
)

_NEW = "INSERT INTO {bindings} (kind, session, resource_id, last_used) VALUES ({p_kind}, {p_session}, {p_pk}, {now})"
# Bind a session to a resource now: (kind, session, pk).
BIND = {
    "postgresql": _NEW + " ON CONFLICT (kind, session) DO UPDATE SET resource_id = EXCLUDED.resource_id,"
    " last_used = EXCLUDED.last_used",
    "mysql": _NEW + " ON DUPLICATE KEY UPDATE resource_id = VALUES(resource_id), last_used = VALUES(last_used)",
    "sqlite": _NEW + " ON CONFLICT (kind, session) DO UPDATE SET resource_id = excluded.resource_id,"
    " last_used = excluded.last_used",
}


def templates(vendor: str) -> dict[str, str]:
    """The statements, as ``vendor`` writes them."""
    return {"BINDING_READ": BINDING_READ, "BIND": BIND[vendor]}


def pieces(dialect: Dialect) -> dict[str, str]:
    """What these templates leave open, for ``dialect``'s vendor and tables: the cooldowns'
    pieces (``db/cooldowns.py``) and the bindings' table."""
    qn = dialect.connection.ops.quote_name
    return {**cooldowns.pieces(dialect), "bindings": qn(SessionBinding._meta.db_table)}
