"""The dispenser's named operations (``db/dispenser.py``'s statements), a part of
``db.operations.Operations``: ``ops(using).items.claim_items(...)``, ``.finish_items(...)``, ...

A claim and an outcome are settled by their token when the connection is lost
(docs/pitfalls.md#unknown-outcome); everything else is repeated.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from resource_lease.db import dispenser as item_sql
from resource_lease.db import json_text
from resource_lease.db.base import Dialect
from resource_lease.db.connections import Disconnected, lease_connection, run, run_repeatable
from resource_lease.db.statements import fill
from resource_lease.exceptions import DatabaseUnavailable, OutcomeUnknown

logger = logging.getLogger("resource_lease")

#: A claimed item as read back: (id, key, payload, attempts, fence, expiry).
Claimed = tuple[int, str, Any, int, int, dt.datetime]


def _json(value: Any) -> str | None:
    return None if value is None else json_text.dumps(value)


def vendor_pattern(d: Dialect, pattern: str) -> str:
    """A worker's checked pattern as the vendor's ``key_match`` matches the whole key."""
    return item_sql.sql_pattern(d.vendor, item_sql.pattern_parts(pattern))


def _numbered(named: str, prefix: str, values: Sequence[Any], params: dict[str, Any]) -> list[str]:
    """Placeholders ``<prefix>0, <prefix>1, ...`` for ``values``, added to ``params``."""
    holes = []
    for i, value in enumerate(values):
        params[f"{prefix}{i}"] = value
        holes.append(named.format(f"{prefix}{i}"))
    return holes


def _refuse_skipped_rows(d: Dialect, c: Any, dispenser: str, keys: Sequence[str], added: int) -> None:
    """After MySQL's INSERT IGNORE of ``keys`` (``added`` of them new): raise naming the keys
    that are not stored, unless every row it skipped was a duplicate key. Each skipped row
    leaves one warning; any other warning (a row dropped by a failed check, a value
    changed) or a missing key is an error (issue 37: a payload too deep for MariaDB's JSON
    was dropped, and put counted 2 of 3)."""
    c.execute(d.sql["ITEMS_PUT_WARNING_COUNT"])
    count = int(c.fetchall()[0][0])
    c.execute(d.sql["ITEMS_PUT_WARNINGS"])
    listed = [(int(code), str(message)) for _level, code, message in c.fetchall()]
    others = [f"{code} {message}" for code, message in listed if code != item_sql.MYSQL_DUPLICATE_KEY]
    skipped = len(keys) - added
    if not others and count == skipped and count == len(listed):
        return
    params: dict[str, Any] = {"dispenser": dispenser}
    holes = _numbered(d.named_placeholder, "k", keys, params)
    c.execute(fill(d.sql["ITEMS_BY_KEY"], keys=", ".join(holes)), params)
    stored = {str(row[0]) for row in c.fetchall()}
    missing = [key for key in keys if key not in stored]
    if missing or others or count != skipped:
        raise ValueError(
            f"the database did not store items {missing} of {dispenser!r} as given"
            f" ({count} warnings for {skipped} rows not inserted: {'; '.join(others) or 'duplicates'})"
        )


@dataclass(frozen=True)
class ItemOperations:
    """The dispenser's operations on ``alias`` (see the module's docstring)."""

    alias: str

    @property
    def dialect(self) -> Dialect:
        return lease_connection(self.alias).dialect

    # -- the dispenser: statements of db/dispenser.py ------------------------------------------------

    def _items(
        self, name: str, params: dict[str, Any], *, what: str, once: bool = False, holes: dict[str, str] | None = None
    ) -> int:
        """Run the item statement ``name`` (holes filled): its row count. Repeated after a
        lost connection unless ``once`` (the caller settles it by its token)."""

        def statement(d: Dialect, c: Any) -> int:
            c.execute(fill(d.sql[name], **(holes or {})), params)
            return int(c.rowcount)

        return (run if once else run_repeatable)(self.alias, statement, what=what)

    def _select(self, name: str, params: dict[str, Any], *, what: str, **holes: str) -> list[tuple[Any, ...]]:
        def statement(d: Dialect, c: Any) -> list[tuple[Any, ...]]:
            c.execute(fill(d.sql[name], **holes), params)
            return list(c.fetchall())

        return run_repeatable(self.alias, statement, what=what)

    def _ours(self, params: dict[str, Any], keys: Sequence[str], fences: Sequence[int] | None) -> dict[str, str]:
        """The ``key_filter`` and ``fence_filter`` holes: these keys (with these fences)."""
        if not keys:
            return {"key_filter": "", "fence_filter": ""}
        sql, named = self.dialect.sql, self.dialect.named_placeholder
        holes = _numbered(named, "k", keys, params)
        key_filter = fill(sql["ITEM_KEYS"], keys=", ".join(holes))
        if fences is None:
            return {"key_filter": key_filter, "fence_filter": ""}
        cases = [f"WHEN {k} THEN {f}" for k, f in zip(holes, _numbered(named, "f", fences, params), strict=True)]
        return {"key_filter": key_filter, "fence_filter": fill(sql["ITEM_FENCES"], fences=" ".join(cases))}

    def put_items(self, dispenser: str, items: Sequence[tuple[str, Any]]) -> int:
        """Insert the items whose keys are new; how many were (idempotent: repeatable)."""
        params: dict[str, Any] = {"dispenser": dispenser}
        d = self.dialect
        named = d.named_placeholder
        rows = []
        for i, (key, payload) in enumerate(items):
            params[f"key{i}"], params[f"payload{i}"] = key, _json(payload)
            holes = {"row_key": named.format(f"key{i}"), "row_payload": d.json_cast.format(named.format(f"payload{i}"))}
            rows.append(fill(d.sql["ITEM_ROW"], **holes))
        sql = fill(d.sql["ITEMS_PUT"], rows=", ".join(rows))

        def put(d: Dialect, c: Any) -> int:
            c.execute(sql, params)
            added = int(c.rowcount)
            if "ITEMS_PUT_WARNINGS" in d.sql:  # MySQL's INSERT IGNORE: only duplicates may be skipped
                _refuse_skipped_rows(d, c, dispenser, [key for key, _ in items], added)
            return added

        return run_repeatable(self.alias, put, what=f"putting items into {dispenser!r}")

    def requeue_item(self, dispenser: str, key: str, payload: Any) -> int:
        params = {"dispenser": dispenser, "key": key, "payload": _json(payload)}
        return self._items("ITEMS_REQUEUE", params, what=f"recreating {dispenser!r}")

    def retry_failed(self, dispenser: str, keys: Sequence[str]) -> int:
        params: dict[str, Any] = {"dispenser": dispenser}
        holes = self._ours(params, keys, None)
        return self._items(
            "ITEMS_RETRY_FAILED",
            params,
            what=f"retrying failed items of {dispenser!r}",
            holes={"key_filter": holes["key_filter"]},
        )

    def delete_unclaimed(self, dispenser: str, ids: Sequence[int]) -> int:
        params: dict[str, Any] = {"dispenser": dispenser}
        holes = _numbered(self.dialect.named_placeholder, "i", ids, params)
        return self._items(
            "ITEMS_DELETE_UNCLAIMED", params, what=f"recreating {dispenser!r}", holes={"ids": ", ".join(holes)}
        )

    def unclaimed_items(self, dispenser: str) -> list[tuple[int, str]]:
        """(id, key) of every pending item, and of every item whose claim expired."""
        rows = self._select("ITEMS_UNCLAIMED", {"dispenser": dispenser}, what=f"reading {dispenser!r}")
        return [(int(pk), str(key)) for pk, key in rows]

    def items_by_key(self, dispenser: str, keys: Sequence[str]) -> list[tuple[str, str, Any, bool]]:
        """(key, state, payload, claimed live now) of these keys."""
        params: dict[str, Any] = {"dispenser": dispenser}
        holes = _numbered(self.dialect.named_placeholder, "k", keys, params)
        rows = self._select("ITEMS_BY_KEY", params, what=f"reading {dispenser!r}", keys=", ".join(holes))
        return [(str(k), str(s), item_sql.decode_json(p), bool(live)) for k, s, p, live in rows]

    def finished_items(self, dispenser: str, keys: Sequence[str]) -> list[tuple[str, str]]:
        """(key, state) of these keys that are done or failed."""
        params: dict[str, Any] = {"dispenser": dispenser}
        holes = _numbered(self.dialect.named_placeholder, "k", keys, params)
        rows = self._select("ITEMS_FINISHED", params, what=f"reading {dispenser!r}", keys=", ".join(holes))
        return [(str(k), str(s)) for k, s in rows]

    def unfinished_items(self, dispenser: str, pattern: str | None) -> tuple[int, int]:
        """(pending or assigned items, how many of them ``pattern`` matches as a claim does)."""
        params: dict[str, Any] = {"dispenser": dispenser}
        matching = "1"
        if pattern is not None:
            params["pattern"] = vendor_pattern(self.dialect, pattern)
            matching = self.dialect.sql["ITEM_MATCHING"]
        what = f"counting the unfinished items of {dispenser!r}"
        ((total, matched),) = self._select("ITEMS_UNFINISHED", params, what=what, matching=matching)
        return int(total), int(matched)

    def claim_items(
        self, dispenser: str, worker: str, *, limit: int, ttl: float, max_attempts: int, pattern: str | None
    ) -> list[Claimed]:
        """Claim work for ``worker``: its own unfinished items first, then pending ones, then
        expired claims with attempts left, up to ``limit``; the items claimed, own ones first.

        Own items are claimed under one token, new ones under another; the read-back by
        these tokens is the answer, and it also settles a claim whose connection was lost
        during its commit (never run blindly again: it could claim twice)."""
        own_token, token = secrets.token_hex(16), secrets.token_hex(16)
        d = self.dialect
        params: dict[str, Any] = {
            "dispenser": dispenser,
            "worker": worker,
            "ttl": d.ttl_param(ttl),
            "max_attempts": max_attempts,
            "pattern": None if pattern is None else vendor_pattern(d, pattern),
        }
        holes = {"pattern": "", "pattern_r": "", "pattern_plus": ""}
        if pattern is not None:
            holes = {
                "pattern": d.sql["ITEM_PATTERN"],
                "pattern_r": d.sql["ITEM_PATTERN_R"],
                "pattern_plus": d.sql["ITEM_PATTERN_PLUS"],
            }
        else:
            del params["pattern"]
        what = f"assigning items of {dispenser!r} to {worker!r}"
        try:
            got = self._items("ITEMS_RECLAIM_OWN", {**params, "token": own_token}, what=what, once=True)
            if got < limit:
                claim = {**params, "token": token, "n": limit - got}
                pending = d.claim_statement("ITEMS_CLAIM_PENDING")
                got += self._items(pending, claim, what=what, once=True, holes=holes)
            if got < limit:
                failed = {"dispenser": dispenser, "max_attempts": max_attempts}
                failed["error"] = f"the claim expired, attempts used up ({max_attempts})"
                self._items("ITEMS_FAIL_EXPIRED", failed, what=what, once=True)
                claim = {**params, "token": token, "n": limit - got}
                got += self._items(d.claim_statement("ITEMS_CLAIM_EXPIRED"), claim, what=what, once=True, holes=holes)
        except Disconnected as exc:
            # Whatever this assign claimed carries its tokens: the read below settles it.
            logger.warning("connection lost while %s; settling by reading back: %s", what, exc)
        read: dict[str, Any] = {"dispenser": dispenser, "worker": worker}
        tokens = _numbered(d.named_placeholder, "t", (own_token, token), read)
        order = " ".join(f"WHEN {t} THEN {i}" for i, t in enumerate(tokens))
        rows = self._select("ITEMS_CLAIMED", read, what=what, tokens=", ".join(tokens), token_order=order)
        return [
            (int(pk), str(key), item_sql.decode_json(payload), int(attempts), int(fence), d.to_datetime(expiry))
            for pk, key, payload, attempts, fence, expiry in rows
        ]

    def finish_items(
        self,
        outcome: str,
        dispenser: str,
        worker: str,
        keys: Sequence[str],
        fences: Sequence[int] | None,
        *,
        what: str,
        **values: Any,
    ) -> int:
        """Record an outcome (``"done"``, ``"fail"``, ``"release"``) of the worker's live
        claims (these keys, with these fences; no keys: all of them); how many rows changed.

        The statement writes a fresh token on the rows it changes, so a count lost with the
        connection is settled by running it again (it matches nothing the first run changed)
        and counting the token's rows."""
        name = {"done": "ITEMS_DONE", "fail": "ITEMS_FAIL", "release": "ITEMS_RELEASE"}[outcome]
        token = secrets.token_hex(16)
        params: dict[str, Any] = {"dispenser": dispenser, "worker": worker, "token": token, **values}
        if "result" in params:
            params["result"] = _json(params["result"])
        holes = self._ours(params, keys, fences)
        try:
            return self._items(name, params, what=what, once=True, holes=holes)
        except Disconnected as exc:
            logger.warning("connection lost while %s; settling by reading back: %s", what, exc)

        def settle(d: Dialect, c: Any) -> int:
            c.execute(fill(d.sql[name], **holes), params)
            c.execute(d.sql["ITEMS_COUNT_TOKEN"], {"dispenser": dispenser, "worker": worker, "token": token})
            return int(c.fetchall()[0][0])

        try:
            return int(run_repeatable(self.alias, settle, what=what))
        except DatabaseUnavailable as exc:
            # The first run was sent and may have changed rows: "nothing was sent" would be
            # untrue (a failover: the primary gone with the answer, no new one yet to settle on).
            raise OutcomeUnknown(
                f"{what}: the connection was lost with the answer and the outcome could not be read back: {exc}"
            ) from exc

    def renew_claims(
        self, dispenser: str, worker: str, keys: Sequence[str], fences: Sequence[int] | None, ttl: float
    ) -> int:
        """Extend the worker's live claims (these keys, with these fences; none: all) by
        ``ttl`` from now (repeatable); how many."""
        params: dict[str, Any] = {"dispenser": dispenser, "worker": worker, "ttl": self.dialect.ttl_param(ttl)}
        holes = self._ours(params, keys, fences)
        return self._items(
            "ITEMS_RENEW", params, what=f"renewing items of {dispenser!r} held by {worker!r}", holes=holes
        )

    def live_claims(self, dispenser: str, worker: str) -> list[tuple[str, int]]:
        rows = self._select(
            "ITEMS_LIVE_CLAIMS",
            {"dispenser": dispenser, "worker": worker},
            what=f"checking items of {dispenser!r} held by {worker!r}",
        )
        return [(str(key), int(fence)) for key, fence in rows]

    def explain_claim(self, dispenser: str) -> str:
        """The query plan of the claim of pending items (tests check that it reads the index)."""

        def explain(d: Dialect, c: Any) -> str:
            params = {"dispenser": dispenser, "worker": "w", "token": "t", "ttl": d.ttl_param(1.0), "n": 10}
            sql = fill(d.sql[d.claim_statement("ITEMS_CLAIM_PENDING")], pattern="", pattern_r="", pattern_plus="")
            c.execute(f"{item_sql.EXPLAIN[d.vendor]} {sql}", params)
            names = [col[0] for col in c.description]
            return "\n".join(str(dict(zip(names, row, strict=True))) for row in c.fetchall())

        return run(self.alias, explain, what="explain")
