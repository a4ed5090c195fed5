"""The statements of targets' cooldowns (``models.Cooldown``, ``resource_lease.targets``), per
vendor.

Each write is one fenced upsert: its row comes from a SELECT of the leased resource that is
still ours (holder, fence, token and expiry, as every statement of a grant of ours), so a
lease that is no longer held writes nothing. A cooldown only ever moves later: the new end is
the later of the stored one and the new one, by the database's clock. The grant statements
read these rows (``statements.OWN_TARGET``, ``WAITER_COOLS``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resource_lease.db import health
from resource_lease.models import Cooldown, Resource

if TYPE_CHECKING:
    from resource_lease.db.base import Dialect

# A live grant of ours (named parameters pk, holder, fence).
_OURS = "id = {p_pk} AND holder = {p_holder} AND fence = {p_fence} AND grant_token <> '' AND busy_before > {now}"

# The row for the leased resource and a target, cooling down for ``seconds`` from now (with
# the grant times ``recent``, JSON text), if the lease is still ours.
_NEW_ROW = (
    "INSERT INTO {cooldowns} (resource_id, target, until, recent)"
    " SELECT id, {p_target}, {plus_open}{p_seconds}{plus_close}, {recent} FROM {table} WHERE " + _OURS
)

# Cool the leased resource down for its target: (target, seconds, recent, pk, holder, fence);
# the stored grant times are kept. The rows written: 0 if the lease is no longer ours.
COOL = {
    "postgresql": _NEW_ROW
    + " ON CONFLICT (target, resource_id) DO UPDATE SET until = GREATEST({cooldowns}.until, EXCLUDED.until)",
    "mysql": _NEW_ROW + " ON DUPLICATE KEY UPDATE until = GREATEST(until, VALUES(until))",
    "sqlite": _NEW_ROW + " ON CONFLICT (target, resource_id) DO UPDATE SET until = MAX(until, excluded.until)",
}

# A targeted grant counted for the policy's target_rate: the grant times ``recent`` stored, the
# cooldown moved to ``seconds`` from now if that is later. Same parameters as COOL.
COUNT_GRANT = {
    "postgresql": _NEW_ROW
    + " ON CONFLICT (target, resource_id) DO UPDATE SET until = GREATEST({cooldowns}.until, EXCLUDED.until),"
    " recent = EXCLUDED.recent",
    "mysql": _NEW_ROW + " ON DUPLICATE KEY UPDATE until = GREATEST(until, VALUES(until)), recent = VALUES(recent)",
    "sqlite": _NEW_ROW
    + " ON CONFLICT (target, resource_id) DO UPDATE SET until = MAX(until, excluded.until), recent = excluded.recent",
}

# The grant times stored for a resource and a target: (pk, target).
RECENT_READ = "SELECT recent FROM {cooldowns} WHERE resource_id = {p_pk} AND target = {p_target}"


def templates(vendor: str) -> dict[str, str]:
    """The statements, as ``vendor`` writes them."""
    return {"COOL": COOL[vendor], "COUNT_GRANT": COUNT_GRANT[vendor], "RECENT_READ": RECENT_READ}


def pieces(dialect: Dialect) -> dict[str, str]:
    """What these templates leave open, for ``dialect``'s vendor and tables."""
    qn = dialect.connection.ops.quote_name
    shared = health.pieces(dialect)
    return {
        "table": qn(Resource._meta.db_table),
        "cooldowns": qn(Cooldown._meta.db_table),
        "now": dialect.now_sql,
        "plus_open": shared["plus_open"],
        "plus_close": shared["plus_close"],
        "named": dialect.named_placeholder,
        "recent": dialect.json_cast.format(dialect.named_placeholder.format("recent")),
    }
