"""The dispenser's statements: claim, renew, finish, give back work items, per vendor.

Every race over an item is decided by one conditional UPDATE judged by the database's clock,
with every ownership condition (worker, state, live claim, fence) in its WHERE: Django's MySQL
backend counts the rows an UPDATE matched, not the rows it changed
(docs/pitfalls.md#found-rows). Claims pick rows with ``FOR UPDATE SKIP LOCKED`` where the
vendor has it, so concurrent assigns spread over the pending items instead of queueing on one
(docs/pitfalls.md#index-locks).

A claim writes a fresh random token on every row it takes; the assign then reads its rows
back by that token. The same read settles an assign whose connection was lost during its
commit (its outcome unknown: docs/pitfalls.md#unknown-outcome), and MySQL, which has no
``UPDATE ... RETURNING`` (docs/pitfalls.md#no-returning), needs no other path. Outcome
statements (done, fail, release) write a token of their own too, so a count lost with the
connection is settled by counting rows with that token.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from django.db.backends.base.schema import BaseDatabaseSchemaEditor

from resource_lease.db.base import Dialect
from resource_lease.models import DispenserItem

NEXT_INDEX = "resource_lease_item_next_idx"  # models.DispenserItem.Meta.indexes
WORKER_INDEX = "resource_lease_item_worker_idx"

#: A WHERE condition, given the prefix that qualifies its columns ("" or "r.").
Where = Callable[[str], str]

#: Columns a claim reads back: id, key, payload, attempts, fence, expiry.
CLAIM_COLUMNS = "id, item_key, payload, attempts, fence, expires_at"


class ItemStatements:
    """The dispenser statements for one connection (SQLite's form; vendors override pieces)."""

    #: How a pattern (a Python-style regular expression, anchored) is matched by the database.
    regex_op = "REGEXP"

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self.p = dialect.placeholder
        self.now = now = dialect.now_sql
        self.table = dialect.connection.ops.quote_name(DispenserItem._meta.db_table)
        self.live = f"state = 'assigned' AND expires_at > {now}"
        self.expired = f"state = 'assigned' AND expires_at <= {now}"

    def claim_set(self, q: str = "") -> str:
        """The SET list of a claim of a pending or expired item (a new attempt, a new fence);
        ``q`` qualifies the columns (``"r."``) in a multi-table UPDATE."""
        p, now = self.p, self.now
        return (
            f"{q}attempts = {q}attempts + 1, {q}fence = {q}fence + 1, {q}state = 'assigned', {q}worker = {p},"
            f" {q}claim_token = {p}, {q}expires_at = {self.dialect.expiry_sql()}, {q}claimed_at = {now}"
        )

    # -- vendor pieces ---------------------------------------------------------------

    def json_param(self) -> str:
        return self.p

    def insert_ignore(self, columns: str, values: str) -> str:
        return f"INSERT INTO {self.table} ({columns}) VALUES {values} ON CONFLICT DO NOTHING"

    def pick_and_claim(self, where: Where, order: str) -> str:
        """UPDATE claiming at most n rows matching ``where`` (first n by ``order``); its
        parameters come from ``pick_params``."""
        # The outer re-check is written with unary "+" (a no-op on the value) so that the
        # planner drives the UPDATE by the picked ids, not by a scan of the whole range.
        return (
            f"UPDATE {self.table} SET {self.claim_set()}"
            f" WHERE id IN (SELECT id FROM {self.table} WHERE {where('')} ORDER BY {order} LIMIT {self.p})"
            f" AND {where('+')}"
        )

    def pick_params(self, claim: Sequence[Any], where: Sequence[Any], n: int) -> list[Any]:
        # SQLite: the where is repeated outside the subquery (same single writer, but cheap).
        return [*claim, *where, n, *where]

    # -- claims ----------------------------------------------------------------------

    def _pattern(self, pattern: str | None) -> tuple[Where, list[Any]]:
        if pattern is None:
            return (lambda q: ""), []
        return (lambda q: f" AND {q}item_key {self.regex_op} {self.p}"), [f"^(?:{pattern})$"]

    def reclaim_own(
        self, cursor: Any, *, dispenser: str, worker: str, token: str, ttl: float, max_attempts: int
    ) -> int:
        """Claim afresh the worker's own unfinished items: live claims, and expired ones no one
        retook (an expired claim was an attempt: counted, unless attempts are used up)."""
        p, now = self.p, self.now
        # attempts is assigned first: MySQL evaluates SET left to right with new values
        # (see docs/pitfalls.md#set-order).
        cursor.execute(
            f"UPDATE {self.table} SET attempts = attempts + CASE WHEN expires_at <= {now} THEN 1 ELSE 0 END,"
            f" fence = fence + 1, claim_token = {p}, expires_at = {self.dialect.expiry_sql()}, claimed_at = {now}"
            f" WHERE dispenser = {p} AND worker = {p} AND state = 'assigned'"
            f" AND (expires_at > {now} OR attempts < {p})",
            (token, self.dialect.ttl_param(ttl), dispenser, worker, max_attempts),
        )
        return int(cursor.rowcount)

    def claim_pending(
        self, cursor: Any, *, dispenser: str, worker: str, token: str, ttl: float, n: int, pattern: str | None
    ) -> int:
        """Claim up to n pending items, oldest first.

        The order is the index's after its equality columns (never "dispenser, state, ..."):
        MariaDB then reads the index in order and stops at n, instead of a filesort that
        locks every pending item (see docs/pitfalls.md#index-locks).
        """
        pat, pat_params = self._pattern(pattern)
        sql = self.pick_and_claim(
            lambda q: f"{q}dispenser = {self.p} AND {q}state = 'pending'{pat(q)}", "expires_at, id"
        )
        claim = (worker, token, self.dialect.ttl_param(ttl))
        cursor.execute(sql, self.pick_params(claim, [dispenser, *pat_params], n))
        return int(cursor.rowcount)

    def claim_expired(
        self,
        cursor: Any,
        *,
        dispenser: str,
        worker: str,
        token: str,
        ttl: float,
        n: int,
        pattern: str | None,
        max_attempts: int,
    ) -> int:
        """Claim up to n items whose claim expired with attempts left, longest expired first."""
        pat, pat_params = self._pattern(pattern)
        p, now = self.p, self.now
        sql = self.pick_and_claim(
            lambda q: (
                f"{q}dispenser = {p} AND {q}state = 'assigned' AND {q}expires_at <= {now} AND {q}attempts < {p}{pat(q)}"
            ),
            "expires_at, id",
        )
        claim = (worker, token, self.dialect.ttl_param(ttl))
        cursor.execute(sql, self.pick_params(claim, [dispenser, max_attempts, *pat_params], n))
        return int(cursor.rowcount)

    def fail_expired(self, cursor: Any, *, dispenser: str, max_attempts: int) -> int:
        """Mark failed the items whose last claim expired with no attempts left."""
        p, now = self.p, self.now
        cursor.execute(
            f"UPDATE {self.table} SET state = 'failed', finished_at = {now}, expires_at = NULL,"
            f" error = {p} WHERE dispenser = {p} AND {self.expired} AND attempts >= {p}",
            (f"the claim expired, attempts used up ({max_attempts})", dispenser, max_attempts),
        )
        return int(cursor.rowcount)

    def claimed(self, cursor: Any, *, dispenser: str, worker: str, tokens: Sequence[str]) -> list[tuple[Any, ...]]:
        """The live items claimed under these tokens, in their order, each oldest first:
        (id, key, payload, attempts, fence, expiry)."""
        p = self.p
        order = " ".join(f"WHEN {p} THEN {i}" for i in range(len(tokens)))
        cursor.execute(
            f"SELECT {CLAIM_COLUMNS} FROM {self.table} WHERE dispenser = {p} AND worker = {p}"
            f" AND {self.live} AND claim_token IN ({', '.join([p] * len(tokens))})"
            f" ORDER BY CASE claim_token {order} END, id",
            (dispenser, worker, *tokens, *tokens),
        )
        return [
            (pk, key, _json(payload), attempts, fence, self.dialect.to_datetime(expiry))
            for pk, key, payload, attempts, fence, expiry in cursor.fetchall()
        ]

    # -- a worker's live claims --------------------------------------------------------

    def _ours(
        self, dispenser: str, worker: str, keys: Sequence[str], fences: Sequence[int] | None
    ) -> tuple[str, list[Any]]:
        """WHERE clause: these keys are live claims of this worker (with these fences)."""
        p = self.p
        where = f"dispenser = {p} AND worker = {p} AND {self.live}"
        params: list[Any] = [dispenser, worker]
        if keys:
            where += f" AND item_key IN ({', '.join([p] * len(keys))})"
            params += keys
            if fences is not None:
                cases = " ".join(f"WHEN {p} THEN {p}" for _ in keys)
                where += f" AND fence = CASE item_key {cases} END"
                for key, fence in zip(keys, fences, strict=True):
                    params += [key, fence]
        return where, params

    def done(
        self,
        cursor: Any,
        *,
        dispenser: str,
        worker: str,
        keys: Sequence[str],
        fences: Sequence[int] | None,
        result: Any,
        token: str,
    ) -> int:
        p, now = self.p, self.now
        where, params = self._ours(dispenser, worker, keys, fences)
        cursor.execute(
            f"UPDATE {self.table} SET state = 'done', result = {self.json_param()}, error = '', finished_at = {now},"
            f" expires_at = NULL, claim_token = {p} WHERE {where}",
            [None if result is None else json.dumps(result), token, *params],
        )
        return int(cursor.rowcount)

    def fail(
        self,
        cursor: Any,
        *,
        dispenser: str,
        worker: str,
        keys: Sequence[str],
        fences: Sequence[int] | None,
        error: str,
        max_attempts: int,
        token: str,
    ) -> int:
        """Back to the pool, or failed once the attempts are used up."""
        p, now = self.p, self.now
        where, params = self._ours(dispenser, worker, keys, fences)
        cursor.execute(
            f"UPDATE {self.table} SET finished_at = CASE WHEN attempts >= {p} THEN {now} ELSE NULL END,"
            f" state = CASE WHEN attempts >= {p} THEN 'failed' ELSE 'pending' END,"
            f" error = {p}, expires_at = NULL, claim_token = {p} WHERE {where}",
            [max_attempts, max_attempts, error, token, *params],
        )
        return int(cursor.rowcount)

    def release(
        self, cursor: Any, *, dispenser: str, worker: str, keys: Sequence[str], fences: Sequence[int] | None, token: str
    ) -> int:
        """Back to the pool; a claim given back unworked is not counted as an attempt."""
        where, params = self._ours(dispenser, worker, keys, fences)
        cursor.execute(
            f"UPDATE {self.table} SET state = 'pending', expires_at = NULL,"
            f" attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END, claim_token = {self.p} WHERE {where}",
            [token, *params],
        )
        return int(cursor.rowcount)

    def count_token(self, cursor: Any, *, dispenser: str, worker: str, token: str) -> int:
        """Rows an outcome statement wrote under ``token`` (settles a count lost in transit)."""
        p = self.p
        cursor.execute(
            f"SELECT COUNT(*) FROM {self.table} WHERE dispenser = {p} AND worker = {p} AND claim_token = {p}",
            (dispenser, worker, token),
        )
        return int(cursor.fetchall()[0][0])

    def renew(
        self,
        cursor: Any,
        *,
        dispenser: str,
        worker: str,
        keys: Sequence[str],
        fences: Sequence[int] | None,
        ttl: float,
    ) -> int:
        where, params = self._ours(dispenser, worker, keys, fences)
        cursor.execute(
            f"UPDATE {self.table} SET expires_at = {self.dialect.expiry_sql()} WHERE {where}",
            [self.dialect.ttl_param(ttl), *params],
        )
        return int(cursor.rowcount)

    def live_claims(self, cursor: Any, *, dispenser: str, worker: str) -> list[tuple[str, int]]:
        where, params = self._ours(dispenser, worker, (), None)
        cursor.execute(f"SELECT item_key, fence FROM {self.table} WHERE {where}", params)
        return [(key, int(fence)) for key, fence in cursor.fetchall()]

    # -- the pool ----------------------------------------------------------------------

    def put(self, cursor: Any, *, dispenser: str, items: Sequence[tuple[str, Any]]) -> int:
        """Insert the items whose keys are new; how many were."""
        p, now = self.p, self.now
        row = f"({p}, {p}, {self.json_param()}, 'pending', '', 0, '', 0, '', {now})"
        columns = "dispenser, item_key, payload, state, worker, fence, claim_token, attempts, error, created_at"
        params: list[Any] = []
        for key, payload in items:
            params += [dispenser, key, None if payload is None else json.dumps(payload)]
        cursor.execute(self.insert_ignore(columns, ", ".join([row] * len(items))), params)
        return int(cursor.rowcount)

    def requeue(self, cursor: Any, *, dispenser: str, key: str, payload: Any) -> int:
        """Queue one key afresh (attempts reset) with this payload, unless it is claimed now."""
        p, now = self.p, self.now
        cursor.execute(
            f"UPDATE {self.table} SET state = 'pending', payload = {self.json_param()}, attempts = 0, error = '',"
            f" result = NULL, finished_at = NULL, expires_at = NULL"
            f" WHERE dispenser = {p} AND item_key = {p}"
            f" AND (state <> 'assigned' OR expires_at <= {now})",
            (None if payload is None else json.dumps(payload), dispenser, key),
        )
        return int(cursor.rowcount)

    def retry_failed(self, cursor: Any, *, dispenser: str, keys: Sequence[str]) -> int:
        """Queue failed items (all, or these keys) again with attempts reset."""
        p = self.p
        where = f"dispenser = {p} AND state = 'failed'"
        if keys:
            where += f" AND item_key IN ({', '.join([p] * len(keys))})"
        cursor.execute(
            f"UPDATE {self.table} SET state = 'pending', attempts = 0, finished_at = NULL, expires_at = NULL"
            f" WHERE {where}",
            (dispenser, *keys),
        )
        return int(cursor.rowcount)

    def delete_unclaimed(self, cursor: Any, *, dispenser: str, ids: Sequence[int]) -> int:
        """Delete these items if they are pending (or their claim expired)."""
        p = self.p
        cursor.execute(
            f"DELETE FROM {self.table} WHERE dispenser = {p} AND id IN ({', '.join([p] * len(ids))})"
            f" AND (state = 'pending' OR {self.expired})",
            (dispenser, *ids),
        )
        return int(cursor.rowcount)

    explain = "EXPLAIN QUERY PLAN"

    def explain_claim(self, cursor: Any, *, dispenser: str) -> str:
        """The query plan of the claim of pending items (tests check that it reads the index)."""
        where = lambda q: f"{q}dispenser = {self.p} AND {q}state = 'pending'"  # noqa: E731
        sql = self.pick_and_claim(where, "expires_at, id")
        cursor.execute(
            f"{self.explain} {sql}", self.pick_params(("w", "t", self.dialect.ttl_param(1.0)), [dispenser], 10)
        )
        names = [d[0] for d in cursor.description]
        return "\n".join(str(dict(zip(names, row, strict=True))) for row in cursor.fetchall())


class PostgreSQLItemStatements(ItemStatements):
    regex_op = "~"
    explain = "EXPLAIN"

    def json_param(self) -> str:
        return f"CAST({self.p} AS jsonb)"

    def pick_and_claim(self, where: Where, order: str) -> str:
        # SKIP LOCKED: concurrent assigns take different rows; the outer WHERE re-checks the
        # locked row's latest version (READ COMMITTED re-evaluates it after the lock, see
        # docs/pitfalls.md#snapshot-reads). The pick is a MATERIALIZED CTE: as
        # "id IN (subquery)" the planner may run the subquery again for each row, each run
        # skipping the rows the last one locked, and claim more than n rows.
        return (
            f"WITH pick AS MATERIALIZED (SELECT id FROM {self.table} WHERE {where('')} ORDER BY {order}"
            f" LIMIT {self.p} FOR UPDATE SKIP LOCKED)"
            f" UPDATE {self.table} AS r SET {self.claim_set()} FROM pick WHERE r.id = pick.id AND {where('r.')}"
        )

    def pick_params(self, claim: Sequence[Any], where: Sequence[Any], n: int) -> list[Any]:
        return [*where, n, *claim, *where]


class MySQLItemStatements(ItemStatements):
    explain = "EXPLAIN"

    def insert_ignore(self, columns: str, values: str) -> str:
        # The values are validated before (lengths, text), so IGNORE only skips duplicates.
        return f"INSERT IGNORE INTO {self.table} ({columns}) VALUES {values}"

    def pick_and_claim(self, where: Where, order: str) -> str:
        index = f"FORCE INDEX ({NEXT_INDEX})"
        if self.dialect.connection.features.has_select_for_update_skip_locked:
            # As the lease acquire (db/mysql.py): the rows are picked by a locking read that
            # skips rows other assigns are claiming, and drive the join (STRAIGHT_JOIN) so
            # MariaDB does not scan (and lock) the table; the outer WHERE re-checks each
            # picked row (see docs/pitfalls.md#index-locks).
            return (
                f"UPDATE (SELECT id FROM {self.table} {index} WHERE {where('')} ORDER BY {order} LIMIT %s"
                f" FOR UPDATE SKIP LOCKED) AS pick STRAIGHT_JOIN {self.table} AS r ON r.id = pick.id"
                f" SET {self.claim_set('r.')} WHERE {where('r.')}"
            )
        return f"UPDATE {self.table} {index} SET {self.claim_set()} WHERE {where('')} ORDER BY {order} LIMIT %s"

    def pick_params(self, claim: Sequence[Any], where: Sequence[Any], n: int) -> list[Any]:
        if self.dialect.connection.features.has_select_for_update_skip_locked:
            return [*where, n, *claim, *where]
        return [*claim, *where, n]


def item_statements(dialect: Dialect) -> ItemStatements:
    """The dispenser statements for a dialect (cached on it)."""
    cached: ItemStatements | None = getattr(dialect, "_item_statements", None)
    if cached is None:
        cls = {"postgresql": PostgreSQLItemStatements, "mysql": MySQLItemStatements}.get(dialect.vendor, ItemStatements)
        cached = cls(dialect)
        dialect._item_statements = cached  # type: ignore[attr-defined]
    return cached


def _json(value: Any) -> Any:
    # Raw JSON columns come back as text (Django loads jsonb as text on PostgreSQL too).
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
