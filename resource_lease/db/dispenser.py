"""The dispenser's statements: claim, renew, finish, give back work items, per vendor.

Every race over an item is decided by one conditional UPDATE judged by the database's clock,
with every ownership condition (worker, state, live claim, fence) in its WHERE: Django's MySQL
backend counts the rows an UPDATE matched, not the rows it changed
(docs/pitfalls.md#found-rows). Claims pick rows with ``FOR UPDATE SKIP LOCKED`` where the
vendor has it, so concurrent assigns spread over the pending items instead of queueing on one
(docs/pitfalls.md#index-locks).

The statements are named templates, written whole (as ``db/statements.py``'s), rendered once per
vendor by the dialect into ``dialect.sql``; ``db/operations.py`` runs them. A claim writes a
fresh random token on every row it takes; the assign then reads its rows
back by that token. The same read settles an assign whose connection was lost during its
commit (its outcome unknown: docs/pitfalls.md#unknown-outcome), and MySQL, which has no
``UPDATE ... RETURNING`` (docs/pitfalls.md#no-returning), needs no other path. Outcome
statements (done, fail, release) write a token of their own too, so a count lost with the
connection is settled by counting rows with that token.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.db.backends.base.schema import BaseDatabaseSchemaEditor

if TYPE_CHECKING:
    from resource_lease.db.base import Dialect

from resource_lease.models import DispenserItem

NEXT_INDEX = "resource_lease_item_next_idx"  # models.DispenserItem.Meta.indexes
WORKER_INDEX = "resource_lease_item_worker_idx"

# The statements, each whole under its name (rendered per vendor by the dialect, as the lease
# statements of ``db/statements.py`` are). Parameters are named: ``{p_worker}`` is the
# parameter ``worker``. The pieces: ``{items}`` the item table, ``{now}`` the database's
# clock, ``{claim_expiry}`` now + the parameter ``ttl``, ``{payload_json}`` /
# ``{result_json}`` a JSON parameter as the vendor stores it, ``{key_match}`` the vendor's
# match of the parameter ``pattern`` as ``sql_pattern`` wrote it (LIKE, SQLite's GLOB); filled per call: ``{pattern}`` (ITEM_PATTERN or nothing; its
# ``_r`` and ``_plus`` forms), ``{key_filter}`` (ITEM_KEYS or nothing), ``{fence_filter}``
# (ITEM_FENCES or nothing), ``{keys}``, ``{fences}``, ``{tokens}``, ``{token_order}``,
# ``{ids}``, ``{rows}``: lists of placeholders of numbered parameters (``k0``, ``f0``, ...).

# -- fragments ----------------------------------------------------------------------------

# A live claim, and one that expired (the item goes back to the pool, or fails).
ITEM_LIVE = "state = 'assigned' AND expires_at > {now}"
ITEM_EXPIRED = "state = 'assigned' AND expires_at <= {now}"

# The SET list of a claim of a pending or expired item: a new attempt, a new fence.
ITEM_CLAIM_SET = (
    "attempts = attempts + 1, fence = fence + 1, state = 'assigned', worker = {p_worker},"
    " claim_token = {p_token}, expires_at = {claim_expiry}, claimed_at = {now}"
)
# The same in a multi-table UPDATE, whose columns are qualified by the updated table (r).
ITEM_CLAIM_SET_R = (
    "r.attempts = r.attempts + 1, r.fence = r.fence + 1, r.state = 'assigned', r.worker = {p_worker},"
    " r.claim_token = {p_token}, r.expires_at = {claim_expiry}, r.claimed_at = {now}"
)

# Only keys the pattern matches (a worker's pattern in the portable subset, as sql_pattern
# writes it for the vendor: never a database's own regular expressions, which differ).
ITEM_PATTERN = " AND item_key {key_match}"
ITEM_PATTERN_R = " AND r.item_key {key_match}"
ITEM_PATTERN_PLUS = " AND +item_key {key_match}"

# The items a claim may take: pending ones (oldest first), or expired claims with attempts
# left (longest expired first). The order is the index's after its equality columns (never
# "dispenser, state, ..."): MariaDB then reads the index in order and stops at n, instead of a
# filesort that locks every pending item (docs/pitfalls.md#index-locks).
ITEM_PENDING = "dispenser = {p_dispenser} AND state = 'pending'"
ITEM_PENDING_R = "r.dispenser = {p_dispenser} AND r.state = 'pending'"
ITEM_RETAKE = "dispenser = {p_dispenser} AND state = 'assigned' AND expires_at <= {now} AND attempts < {p_max_attempts}"
ITEM_RETAKE_R = (
    "r.dispenser = {p_dispenser} AND r.state = 'assigned' AND r.expires_at <= {now} AND r.attempts < {p_max_attempts}"
)

# These keys are live claims of this worker ({keys}: one placeholder per key), and with these
# fences ({fences}: WHEN key THEN fence, once per key).
ITEM_OURS = "dispenser = {p_dispenser} AND worker = {p_worker} AND " + ITEM_LIVE
ITEM_KEYS = " AND item_key IN ({keys})"
ITEM_FENCES = " AND fence = CASE item_key {fences} END"

# -- claims (SQLite's form: one writer at a time; the vendors below override the picks) -----

# Claim afresh the worker's own unfinished items: live claims, and expired ones no one retook
# (an expired claim was an attempt: counted, unless attempts are used up). attempts is assigned
# first: MySQL evaluates SET left to right with new values (docs/pitfalls.md#set-order).
ITEMS_RECLAIM_OWN = (
    "UPDATE {items} SET attempts = attempts + CASE WHEN expires_at <= {now} THEN 1 ELSE 0 END,"
    " fence = fence + 1, claim_token = {p_token}, expires_at = {claim_expiry}, claimed_at = {now}"
    " WHERE dispenser = {p_dispenser} AND worker = {p_worker} AND state = 'assigned'"
    " AND (expires_at > {now} OR attempts < {p_max_attempts})"
)

# Claim up to {p_n} items of a pick: the ids picked by the inner SELECT, the condition checked
# again on each. The outer re-check is written with unary "+" (a no-op on the value) so that
# the planner drives the UPDATE by the picked ids, not by a scan of the whole range.
ITEMS_CLAIM_PENDING = (
    "UPDATE {items} SET {item_claim_set}"
    " WHERE id IN (SELECT id FROM {items} WHERE {item_pending}{pattern} ORDER BY expires_at, id LIMIT {p_n})"
    " AND +dispenser = {p_dispenser} AND +state = 'pending'{pattern_plus}"
)
ITEMS_CLAIM_EXPIRED = (
    "UPDATE {items} SET {item_claim_set}"
    " WHERE id IN (SELECT id FROM {items} WHERE {item_retake}{pattern} ORDER BY expires_at, id LIMIT {p_n})"
    " AND +dispenser = {p_dispenser} AND +state = 'assigned' AND +expires_at <= {now}"
    " AND +attempts < {p_max_attempts}{pattern_plus}"
)

# Mark failed the items whose last claim expired with no attempts left.
ITEMS_FAIL_EXPIRED = (
    "UPDATE {items} SET state = 'failed', finished_at = {now}, expires_at = NULL, error = {p_error}"
    " WHERE dispenser = {p_dispenser} AND {item_expired} AND attempts >= {p_max_attempts}"
)

# The live items claimed under these tokens, in the tokens' order, each oldest first: what an
# assign hands out, and how an assign whose answer was lost is settled
# (docs/pitfalls.md#unknown-outcome).
ITEMS_CLAIMED = (
    "SELECT id, item_key, payload, attempts, fence, expires_at FROM {items}"
    " WHERE dispenser = {p_dispenser} AND worker = {p_worker} AND {item_live}"
    " AND claim_token IN ({tokens}) ORDER BY CASE claim_token {token_order} END, id"
)

# -- a worker's live claims ({key_filter}: ITEM_KEYS or nothing; {fence_filter}: ITEM_FENCES or nothing) --

# Each outcome writes its own token, so a count lost with the connection is settled by
# counting the rows that carry it (ITEMS_COUNT_TOKEN).
ITEMS_DONE = (
    "UPDATE {items} SET state = 'done', result = {result_json}, error = '', finished_at = {now},"
    " expires_at = NULL, claim_token = {p_token} WHERE {item_ours}{key_filter}{fence_filter}"
)
# Back to the pool, or failed once the attempts are used up.
ITEMS_FAIL = (
    "UPDATE {items} SET finished_at = CASE WHEN attempts >= {p_max_attempts} THEN {now} ELSE NULL END,"
    " state = CASE WHEN attempts >= {p_max_attempts} THEN 'failed' ELSE 'pending' END,"
    " error = {p_error}, expires_at = NULL, claim_token = {p_token} WHERE {item_ours}{key_filter}{fence_filter}"
)
# Back to the pool; a claim given back unworked is not counted as an attempt.
ITEMS_RELEASE = (
    "UPDATE {items} SET state = 'pending', expires_at = NULL,"
    " attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END, claim_token = {p_token}"
    " WHERE {item_ours}{key_filter}{fence_filter}"
)
ITEMS_COUNT_TOKEN = (
    "SELECT COUNT(*) FROM {items} WHERE dispenser = {p_dispenser} AND worker = {p_worker} AND claim_token = {p_token}"
)
ITEMS_RENEW = "UPDATE {items} SET expires_at = {claim_expiry} WHERE {item_ours}{key_filter}{fence_filter}"
ITEMS_LIVE_CLAIMS = "SELECT item_key, fence FROM {items} WHERE {item_ours}"

# -- the pool ----------------------------------------------------------------------------------

# Insert the items whose keys are new ({rows}: ITEM_ROW once per item, its {row_key} and
# {row_payload} the item's numbered parameters: key0, payload0, ...), keeping every existing
# key as it is.
ITEM_ROW = "({p_dispenser}, {row_key}, {row_payload}, 'pending', '', 0, '', 0, '', {now})"
ITEMS_PUT = (
    "INSERT INTO {items} (dispenser, item_key, payload, state, worker, fence, claim_token, attempts, error,"
    " created_at) VALUES {rows} ON CONFLICT DO NOTHING"
)
# Queue one key afresh (attempts reset) with this payload, unless it is claimed now.
ITEMS_REQUEUE = (
    "UPDATE {items} SET state = 'pending', payload = {payload_json}, attempts = 0, error = '',"
    " result = NULL, finished_at = NULL, expires_at = NULL"
    " WHERE dispenser = {p_dispenser} AND item_key = {p_key} AND (state <> 'assigned' OR expires_at <= {now})"
)
# Queue failed items (all, or those of {key_filter}) again with attempts reset.
ITEMS_RETRY_FAILED = (
    "UPDATE {items} SET state = 'pending', attempts = 0, finished_at = NULL, expires_at = NULL"
    " WHERE dispenser = {p_dispenser} AND state = 'failed'{key_filter}"
)
# Delete these items ({ids}) if they are pending (or their claim expired).
ITEMS_DELETE_UNCLAIMED = (
    "DELETE FROM {items} WHERE dispenser = {p_dispenser} AND id IN ({ids}) AND (state = 'pending' OR {item_expired})"
)
# What recreate() reads: every pending or expired-claim item (id, key), and for some keys
# their state, payload and whether they are claimed live now.
ITEMS_UNCLAIMED = (
    "SELECT id, item_key FROM {items} WHERE dispenser = {p_dispenser} AND (state = 'pending' OR {item_expired})"
)
ITEMS_BY_KEY = (
    "SELECT item_key, state, payload, CASE WHEN {item_live} THEN 1 ELSE 0 END FROM {items}"
    " WHERE dispenser = {p_dispenser} AND item_key IN ({keys})"
)
# The unfinished items (pending or assigned), and how many of them a worker's pattern matches
# ({matching}: ITEM_MATCHING, or 1 without a pattern): what it could still claim, now or once
# another worker's claim expires (its run(until_empty=True) stops when none).
ITEM_MATCHING = "CASE WHEN item_key {key_match} THEN 1 ELSE 0 END"
ITEMS_UNFINISHED = (
    "SELECT COUNT(*), COALESCE(SUM({matching}), 0) FROM {items}"
    " WHERE dispenser = {p_dispenser} AND state IN ('pending', 'assigned')"
)
# Which of these keys are finished (done or failed): a FolderWorker tidies their files.
ITEMS_FINISHED = (
    "SELECT item_key, state FROM {items} WHERE dispenser = {p_dispenser} AND item_key IN ({keys})"
    " AND state IN ('done', 'failed')"
)

#: The statements every vendor renders, in order (a template may use the ones before it).
TEMPLATES: dict[str, str] = {
    name: value for name, value in dict(globals()).items() if name.startswith(("ITEM_", "ITEMS_"))
}

# -- PostgreSQL ----------------------------------------------------------------------------

# SKIP LOCKED: concurrent assigns take different rows; the outer WHERE re-checks the locked
# row's latest version (READ COMMITTED re-evaluates it after the lock, see
# docs/pitfalls.md#snapshot-reads). The pick is a MATERIALIZED CTE: as "id IN (subquery)" the
# planner may run the subquery again for each row, each run skipping the rows the last one
# locked, and claim more than n rows.
PG_CLAIM_PENDING = (
    "WITH pick AS MATERIALIZED (SELECT id FROM {items} WHERE {item_pending}{pattern}"
    " ORDER BY expires_at, id LIMIT {p_n} FOR UPDATE SKIP LOCKED)"
    " UPDATE {items} AS r SET attempts = r.attempts + 1, fence = r.fence + 1, state = 'assigned',"
    " worker = {p_worker}, claim_token = {p_token}, expires_at = {claim_expiry}, claimed_at = {now}"
    " FROM pick WHERE r.id = pick.id AND {item_pending_r}{pattern_r}"
)
PG_CLAIM_EXPIRED = (
    "WITH pick AS MATERIALIZED (SELECT id FROM {items} WHERE {item_retake}{pattern}"
    " ORDER BY expires_at, id LIMIT {p_n} FOR UPDATE SKIP LOCKED)"
    " UPDATE {items} AS r SET attempts = r.attempts + 1, fence = r.fence + 1, state = 'assigned',"
    " worker = {p_worker}, claim_token = {p_token}, expires_at = {claim_expiry}, claimed_at = {now}"
    " FROM pick WHERE r.id = pick.id AND {item_retake_r}{pattern_r}"
)
POSTGRESQL_TEMPLATES = {**TEMPLATES, "ITEMS_CLAIM_PENDING": PG_CLAIM_PENDING, "ITEMS_CLAIM_EXPIRED": PG_CLAIM_EXPIRED}

# -- MySQL / MariaDB -------------------------------------------------------------------------

# MariaDB 10.6+ / MySQL 8: as the lease acquire (db/mysql.py), the rows are picked by a
# locking read that skips rows other assigns are claiming, and drive the join (STRAIGHT_JOIN)
# so MariaDB does not scan (and lock) the table; the outer WHERE re-checks each picked row
# (docs/pitfalls.md#index-locks). Older servers: one UPDATE ... ORDER BY ... LIMIT on the index.
MYSQL_CLAIM_PENDING = (
    "UPDATE (SELECT id FROM {items} FORCE INDEX ({next_index}) WHERE {item_pending}{pattern}"
    " ORDER BY expires_at, id LIMIT {p_n} FOR UPDATE SKIP LOCKED) AS pick"
    " STRAIGHT_JOIN {items} AS r ON r.id = pick.id SET {item_claim_set_r} WHERE {item_pending_r}{pattern_r}"
)
MYSQL_CLAIM_EXPIRED = (
    "UPDATE (SELECT id FROM {items} FORCE INDEX ({next_index}) WHERE {item_retake}{pattern}"
    " ORDER BY expires_at, id LIMIT {p_n} FOR UPDATE SKIP LOCKED) AS pick"
    " STRAIGHT_JOIN {items} AS r ON r.id = pick.id SET {item_claim_set_r} WHERE {item_retake_r}{pattern_r}"
)
MYSQL_CLAIM_PENDING_LOCKING = (
    "UPDATE {items} FORCE INDEX ({next_index}) SET {item_claim_set}"
    " WHERE {item_pending}{pattern} ORDER BY expires_at, id LIMIT {p_n}"
)
MYSQL_CLAIM_EXPIRED_LOCKING = (
    "UPDATE {items} FORCE INDEX ({next_index}) SET {item_claim_set}"
    " WHERE {item_retake}{pattern} ORDER BY expires_at, id LIMIT {p_n}"
)
# IGNORE skips the keys that exist (counting only new rows, as ON CONFLICT DO NOTHING does;
# ON DUPLICATE KEY UPDATE would count every row under CLIENT.FOUND_ROWS). IGNORE also turns
# any other error of a row into a warning and drops the row (a payload MariaDB's JSON check
# refuses), so the put reads the warnings right after (ITEMS_PUT_WARNINGS) and fails loudly,
# naming the keys not stored, unless every one of them is a duplicate (MYSQL_DUPLICATE_KEY).
MYSQL_PUT = (
    "INSERT IGNORE INTO {items} (dispenser, item_key, payload, state, worker, fence, claim_token, attempts, error,"
    " created_at) VALUES {rows}"
)
# How many warnings the last statement left, then the first max_error_count of them.
MYSQL_PUT_WARNING_COUNT = "SHOW COUNT(*) WARNINGS"
MYSQL_PUT_WARNINGS = "SHOW WARNINGS"
#: The one warning an INSERT IGNORE is there for: a duplicate key (ER_DUP_ENTRY).
MYSQL_DUPLICATE_KEY = 1062
MYSQL_TEMPLATES = {
    **TEMPLATES,
    "ITEMS_CLAIM_PENDING": MYSQL_CLAIM_PENDING,
    "ITEMS_CLAIM_EXPIRED": MYSQL_CLAIM_EXPIRED,
    "ITEMS_CLAIM_PENDING_LOCKING": MYSQL_CLAIM_PENDING_LOCKING,
    "ITEMS_CLAIM_EXPIRED_LOCKING": MYSQL_CLAIM_EXPIRED_LOCKING,
    "ITEMS_PUT": MYSQL_PUT,
    "ITEMS_PUT_WARNING_COUNT": MYSQL_PUT_WARNING_COUNT,
    "ITEMS_PUT_WARNINGS": MYSQL_PUT_WARNINGS,
}

#: The items' pieces per vendor: how a pattern is matched, and the plan reader. LIKE compares
#: exactly on PostgreSQL and on MySQL/MariaDB's item_key (a binary NO PAD collation:
#: make_item_columns_exact); SQLite's LIKE ignores case, its GLOB does not.
KEY_MATCH = {"sqlite": "GLOB {}", "postgresql": "LIKE {} ESCAPE '!'", "mysql": "LIKE {} ESCAPE '!'"}
EXPLAIN = {"sqlite": "EXPLAIN QUERY PLAN", "postgresql": "EXPLAIN", "mysql": "EXPLAIN"}


def pieces(dialect: Dialect) -> dict[str, str]:
    """What these templates leave open, for ``dialect``'s vendor and tables."""
    named = dialect.named_placeholder
    return {
        "items": dialect.connection.ops.quote_name(DispenserItem._meta.db_table),
        "now": dialect.now_sql,
        "named": named,
        "claim_expiry": dialect.expiry_sql(named.format("ttl")),
        "payload_json": dialect.json_cast.format(named.format("payload")),
        "result_json": dialect.json_cast.format(named.format("result")),
        "key_match": KEY_MATCH[dialect.vendor].format(named.format("pattern")),
        "next_index": NEXT_INDEX,
    }


# -- patterns: one portable language ---------------------------------------------------------

#: The longest pattern (keys are at most 255 characters; escapes double that).
MAX_PATTERN = 1000
#: A pattern's parts: a character taken literally, ANY (``.``: one character) or RUN
#: (``.*``: any run of characters, none too).
ANY, RUN = "", None
Part = str | None
_SPECIAL = set("[](){}|?*+^$")


def pattern_parts(pattern: str) -> list[Part]:
    """A worker's ``pattern`` parsed: the one pattern language every database matches alike,
    a subset of Python's regular expressions (``re.fullmatch`` of the whole key): literal
    text, ``.`` (any one character, a newline too), ``.*`` (any run, empty too), ``.+`` (a
    run of at least one), and ``\\`` before a character that is not a letter or digit to
    take it literally (``\\.``, ``\\*``, ``\\\\``). ``ValueError`` (saying what and where)
    for anything else: classes, groups, alternation, anchors, other repeats, ``\\d`` and
    the like are each database's own dialect (POSIX classes, ``a{,2}``, inline flags, where
    ``$`` matches), and a pattern the database refuses would fail only after the claim
    had begun."""
    parts: list[Part] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            if i + 1 == len(pattern):
                raise ValueError("ends with a lone '\\'")
            following = pattern[i + 1]
            if following.isascii() and following.isalnum():
                raise ValueError(f"'\\{following}' at position {i} is not in the portable subset")
            parts.append(following)
            i += 2
        elif char == ".":
            after = pattern[i + 1 : i + 2]
            if after == "*":
                parts.append(RUN)
                i += 2
            elif after == "+":
                parts.extend((ANY, RUN))
                i += 2
            else:
                parts.append(ANY)
                i += 1
        elif char in _SPECIAL:
            raise ValueError(f"{char!r} at position {i} is not in the portable subset")
        else:
            parts.append(char)
            i += 1
    return parts


def sql_pattern(vendor: str, parts: list[Part]) -> str:
    """The parameter ``KEY_MATCH[vendor]`` matches the whole key with: a LIKE pattern (``_``
    one character, ``%`` any run; ``!`` escapes ``%``, ``_`` and itself) or, on SQLite, a
    GLOB pattern (``?``, ``*``; ``[*]``, ``[?]``, ``[[]`` for those characters)."""
    out = []
    for part in parts:
        if part is RUN:
            out.append("*" if vendor == "sqlite" else "%")
        elif part == ANY:
            out.append("?" if vendor == "sqlite" else "_")
        elif vendor == "sqlite":
            out.append(f"[{part}]" if part in "*?[" else part)
        else:
            out.append(f"!{part}" if part in "%_!" else part)
    return "".join(out)


def pattern_matches(parts: list[Part], key: str) -> bool:
    """Whether ``parts`` match the whole ``key``, as the databases judge it: the classic
    wildcard match, going back only to the last run (no backtracking blow-up)."""
    p = k = 0
    star, star_k = -1, 0
    while k < len(key):
        if p < len(parts) and parts[p] is not RUN and (parts[p] == ANY or parts[p] == key[k]):
            p += 1
            k += 1
        elif p < len(parts) and parts[p] is RUN:
            star, star_k = p, k
            p += 1
        elif star >= 0:
            star_k += 1
            p, k = star + 1, star_k
        else:
            return False
    while p < len(parts) and parts[p] is RUN:
        p += 1
    return p == len(parts)


def decode_json(value: Any) -> Any:
    """A JSON column as read raw: text on every vendor (Django loads jsonb as text too)."""
    return json.loads(value) if isinstance(value, (str, bytes, bytearray)) else value


# -- schema ------------------------------------------------------------------------------

#: Text columns of the item table that must compare exactly (case and trailing spaces).
_EXACT_COLUMNS = {"dispenser": 200, "item_key": 255, "worker": 200, "state": 10, "claim_token": 32}


def make_item_columns_exact(schema_editor: BaseDatabaseSchemaEditor) -> None:
    """Give the item table's names and keys exact comparison on MySQL/MariaDB.

    Their default collations ignore case, and every PAD SPACE collation (utf8mb4_bin
    included) ignores trailing spaces, so "a" and "A " would be one key (and one worker).
    A binary NO PAD collation compares them as Python does. PostgreSQL and SQLite compare
    exactly already. See docs/pitfalls.md#collation.
    """
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    collation = "utf8mb4_nopad_bin" if getattr(connection, "mysql_is_mariadb", False) else "utf8mb4_0900_bin"
    table = connection.ops.quote_name(DispenserItem._meta.db_table)
    modify = ", ".join(
        f"MODIFY {connection.ops.quote_name(column)} varchar({length})"
        f" CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL"
        for column, length in _EXACT_COLUMNS.items()
    )
    schema_editor.execute(f"ALTER TABLE {table} {modify}")
