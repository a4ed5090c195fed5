"""The statements of notifications and live configuration, per vendor.

Every change is one upsert judged by the database: it creates the row on first use (two
processes using a new name at once create one row) or raises its ``version`` by one, and
hands back the new version from the same statement (``RETURNING``; on MySQL/MariaDB
``version = LAST_INSERT_ID(version + 1)`` read back in the same round trip, see
docs/pitfalls.md#no-returning). On PostgreSQL the same statement also calls ``pg_notify``, so
the wake-up is sent exactly when the change commits; ``db/listen.py`` is the watchers' side
of it. Reads are one indexed row per topic (a namespace's few rows for a configuration).

JSON travels as text both ways (PostgreSQL casts it), so a payload reads back the same on
every vendor whatever loaders the driver has registered. The statements are named templates,
written whole, rendered once per vendor by the dialect (``dialect.sql``); ``db/operations.py``
runs them.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from resource_lease.models import ConfigEntry, Topic

if TYPE_CHECKING:
    from resource_lease.db.base import Dialect


def channel(kind: str, name: str) -> str:
    """The PostgreSQL NOTIFY channel of a topic or a config namespace: a fixed-length
    identifier (names may be 200 characters; channels at most 63)."""
    return "rl_" + hashlib.md5(f"{kind}:{name}".encode(), usedforsecurity=False).hexdigest()


# The statements, each whole under its name, rendered per vendor by the dialect (as
# ``db/statements.py``'s). Parameters are named (``{p_name}``); ``{q_key}`` is the column
# ``key`` quoted for the vendor; ``{topics}`` and ``{configs}`` the tables; ``{name_json}``
# the JSON parameter ``name`` as the vendor stores it; ``{json_text}`` ... the column as text.

# Create or bump a topic: its new version (PostgreSQL also wakes its watchers). (name, payload)
TOPIC_NOTIFY = (
    "INSERT INTO {topics} ({q_name}, {q_version}, {q_payload}, {q_updated_at})"
    " VALUES ({p_name}, 1, {payload_json}, {now})"
    " ON CONFLICT ({q_name}) DO UPDATE SET {q_version} = {topics}.{q_version} + 1,"
    " {q_payload} = excluded.{q_payload}, {q_updated_at} = excluded.{q_updated_at}"
    " RETURNING {q_version}"
)
# (version, payload as JSON text) of a topic. (name)
TOPIC_READ = "SELECT {q_version}, {q_payload} FROM {topics} WHERE {q_name} = {p_name}"
# Record a config key's type and default (for the admin); its value and version stay. The
# first declaration's type holds: a later one of the same type updates the default, one of
# another type changes nothing (Config reads the types back and refuses it; CONFIG_RETYPE is
# the explicit change). (namespace, key, type, default)
CONFIG_DECLARE = (
    "INSERT INTO {configs} ({q_namespace}, {q_key}, {q_type}, {q_default}, {q_value}, {q_version}, {q_updated_at})"
    " VALUES ({p_namespace}, {p_key}, {p_type}, {default_json}, NULL, 0, {now})"
    " ON CONFLICT ({q_namespace}, {q_key}) DO UPDATE SET {q_default} = excluded.{q_default}"
    " WHERE {configs}.{q_type} = excluded.{q_type}"
)
# (key, type) of every declared key of a namespace. (namespace)
CONFIG_TYPES = "SELECT {q_key}, {q_type} FROM {configs} WHERE {q_namespace} = {p_namespace}"
# Change a declared key's type and default (Config.retype); its value and version stay.
# (type, default, namespace, key)
CONFIG_RETYPE = (
    "UPDATE {configs} SET {q_type} = {p_type}, {q_default} = {default_json}, {q_updated_at} = {now}"
    " WHERE {q_namespace} = {p_namespace} AND {q_key} = {p_key}"
)
# Store a value (NULL: back to the default) and raise the key's version; the new version.
# (namespace, key, type, default, value)
CONFIG_SET = (
    "INSERT INTO {configs} ({q_namespace}, {q_key}, {q_type}, {q_default}, {q_value}, {q_version}, {q_updated_at})"
    " VALUES ({p_namespace}, {p_key}, {p_type}, {default_json}, {value_json}, 1, {now})"
    " ON CONFLICT ({q_namespace}, {q_key}) DO UPDATE SET {q_version} = {configs}.{q_version} + 1,"
    " {q_value} = excluded.{q_value}, {q_updated_at} = excluded.{q_updated_at}"
    " RETURNING {q_version}"
)
# Store a value only if the key's version is still the one the caller read (compare-and-set:
# the version stands for the value read, so one conditional statement decides); the version
# goes up by one. (value, namespace, key, version)
CONFIG_CAS = (
    "UPDATE {configs} SET {q_value} = {value_json}, {q_version} = {q_version} + 1, {q_updated_at} = {now}"
    " WHERE {q_namespace} = {p_namespace} AND {q_key} = {p_key} AND {q_version} = {p_version}"
)
# (key, value as JSON text or NULL, version) of every stored key of a namespace. (namespace)
CONFIG_READ = "SELECT {q_key}, {q_value}, {q_version} FROM {configs} WHERE {q_namespace} = {p_namespace}"

TEMPLATES: dict[str, str] = {
    "TOPIC_NOTIFY": TOPIC_NOTIFY,
    "TOPIC_READ": TOPIC_READ,
    "CONFIG_DECLARE": CONFIG_DECLARE,
    "CONFIG_TYPES": CONFIG_TYPES,
    "CONFIG_RETYPE": CONFIG_RETYPE,
    "CONFIG_SET": CONFIG_SET,
    "CONFIG_CAS": CONFIG_CAS,
    "CONFIG_READ": CONFIG_READ,
}

# -- PostgreSQL: pg_notify in the same statement, JSON read as text --------------------------

# The wake-up is queued in the bump's own transaction and delivered when (and only if) it
# commits. (name, payload, channel)
PG_TOPIC_NOTIFY = (
    "WITH bumped AS (INSERT INTO {topics} ({q_name}, {q_version}, {q_payload}, {q_updated_at})"
    " VALUES ({p_name}, 1, {payload_json}, {now})"
    " ON CONFLICT ({q_name}) DO UPDATE SET {q_version} = {topics}.{q_version} + 1,"
    " {q_payload} = excluded.{q_payload}, {q_updated_at} = excluded.{q_updated_at}"
    " RETURNING {q_version})"
    " SELECT version, pg_notify({p_channel}, version::text) FROM bumped"
)
PG_TOPIC_READ = "SELECT {q_version}, {q_payload}::text FROM {topics} WHERE {q_name} = {p_name}"
# (namespace, key, type, default, value, channel)
PG_CONFIG_SET = (
    "WITH bumped AS (INSERT INTO {configs} ({q_namespace}, {q_key}, {q_type}, {q_default}, {q_value},"
    " {q_version}, {q_updated_at}) VALUES ({p_namespace}, {p_key}, {p_type}, {default_json}, {value_json}, 1, {now})"
    " ON CONFLICT ({q_namespace}, {q_key}) DO UPDATE SET {q_version} = {configs}.{q_version} + 1,"
    " {q_value} = excluded.{q_value}, {q_updated_at} = excluded.{q_updated_at}"
    " RETURNING {q_version})"
    " SELECT version, pg_notify({p_channel}, version::text) FROM bumped"
)
# (value, namespace, key, version, channel)
PG_CONFIG_CAS = (
    "WITH changed AS (UPDATE {configs} SET {q_value} = {value_json}, {q_version} = {q_version} + 1,"
    " {q_updated_at} = {now} WHERE {q_namespace} = {p_namespace} AND {q_key} = {p_key} AND {q_version} = {p_version}"
    " RETURNING {q_version})"
    " SELECT version, pg_notify({p_channel}, version::text) FROM changed"
)
PG_CONFIG_READ = "SELECT {q_key}, {q_value}::text, {q_version} FROM {configs} WHERE {q_namespace} = {p_namespace}"
POSTGRESQL_TEMPLATES = {
    **TEMPLATES,
    "TOPIC_NOTIFY": PG_TOPIC_NOTIFY,
    "TOPIC_READ": PG_TOPIC_READ,
    "CONFIG_SET": PG_CONFIG_SET,
    "CONFIG_CAS": PG_CONFIG_CAS,
    "CONFIG_READ": PG_CONFIG_READ,
}

# -- MySQL / MariaDB: ON DUPLICATE KEY, the new version through LAST_INSERT_ID ----------------

# LAST_INSERT_ID(expr) remembers the new version for this session: the bump and its answer
# are one statement, so no other change can slip in between (a read-back by name could see a
# later version). The read is sent with it as one query (the engine's connections allow
# several statements); an insert (affected rows 1, with CLIENT.FOUND_ROWS) is version 1.
MYSQL_TOPIC_NOTIFY = (
    "INSERT INTO {topics} ({q_name}, {q_version}, {q_payload}, {q_updated_at})"
    " VALUES ({p_name}, 1, {payload_json}, {now})"
    " ON DUPLICATE KEY UPDATE {q_version} = LAST_INSERT_ID({q_version} + 1),"
    " {q_payload} = VALUES({q_payload}), {q_updated_at} = VALUES({q_updated_at}); SELECT LAST_INSERT_ID()"
)
MYSQL_CONFIG_DECLARE = (
    "INSERT INTO {configs} ({q_namespace}, {q_key}, {q_type}, {q_default}, {q_value}, {q_version}, {q_updated_at})"
    " VALUES ({p_namespace}, {p_key}, {p_type}, {default_json}, NULL, 0, {now})"
    " ON DUPLICATE KEY UPDATE {q_default} = IF({q_type} = VALUES({q_type}), VALUES({q_default}), {q_default})"
)
MYSQL_CONFIG_SET = (
    "INSERT INTO {configs} ({q_namespace}, {q_key}, {q_type}, {q_default}, {q_value}, {q_version}, {q_updated_at})"
    " VALUES ({p_namespace}, {p_key}, {p_type}, {default_json}, {value_json}, 1, {now})"
    " ON DUPLICATE KEY UPDATE {q_version} = LAST_INSERT_ID({q_version} + 1),"
    " {q_value} = VALUES({q_value}), {q_updated_at} = VALUES({q_updated_at}); SELECT LAST_INSERT_ID()"
)
MYSQL_TEMPLATES = {
    **TEMPLATES,
    "TOPIC_NOTIFY": MYSQL_TOPIC_NOTIFY,
    "CONFIG_DECLARE": MYSQL_CONFIG_DECLARE,
    "CONFIG_SET": MYSQL_CONFIG_SET,
}


def pieces(dialect: Dialect) -> dict[str, str]:
    """What these templates leave open, for ``dialect``'s vendor and tables."""
    named, qn = dialect.named_placeholder, dialect.connection.ops.quote_name
    return {
        "topics": qn(Topic._meta.db_table),
        "configs": qn(ConfigEntry._meta.db_table),
        "now": dialect.now_sql,
        "named": named,
        "quote": qn("{}"),
        **{f"{name}_json": dialect.json_cast.format(named.format(name)) for name in ("payload", "default", "value")},
    }
