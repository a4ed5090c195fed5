"""The lease statements are named templates (``resource_lease.db.statements``) that a dialect
renders once: on this database every one comes out whole, and a template that names a piece
nobody fills, or a statement that a vendor without RETURNING could not read back, is refused
when the dialect is made, not when the statement first runs."""

from __future__ import annotations

import re

import pytest

from resource_lease.db import mysql, statements
from resource_lease.db.connections import lease_connection

PIECE = re.compile(r"\{(\w+)\}")


def test_every_statement_is_rendered_with_every_piece_filled() -> None:
    dialect = lease_connection().dialect
    assert set(statements.TEMPLATES) | {"ACQUIRE_SCAN"} <= set(dialect.sql)
    for name, sql in dialect.sql.items():
        assert set(PIECE.findall(sql)) <= set(statements.PER_CALL), (name, sql)
    # The per-call pieces are filled by the methods that choose the statement's size.
    filled = statements.fill(dialect.sql["FREE_ROWS"], limit="5")
    assert PIECE.findall(filled) == [] and filled.endswith(" LIMIT 5")


def test_the_conditions_are_the_rendered_fragments() -> None:
    dialect = lease_connection().dialect
    assert (dialect.free, dialect.ours, dialect.grant_set) == (
        dialect.sql["FREE"],
        dialect.sql["OURS"],
        dialect.sql["GRANT_SET"],
    )
    # PostgreSQL compares the kind of a row chosen by primary key as an expression
    # (docs/pitfalls.md#stale-statistics); the rest of the condition is the same fragment.
    free_by_id = dialect.free.replace("kind = ", "kind || '' = ", 1) if dialect.vendor == "postgresql" else dialect.free
    assert f"WHERE id = {dialect.placeholder} AND {free_by_id}" in dialect.sql["GRANT_BY_ID"]
    assert dialect.sql["RELEASE"].endswith(f"WHERE {dialect.ours}")


def test_a_template_naming_an_unknown_piece_is_refused() -> None:
    with pytest.raises(KeyError, match="nope"):
        statements.render({"X": "SELECT {nope}"}, {}, statements.RETURNING)


def test_a_returning_statement_without_a_read_back_is_refused_where_rows_are_read_back() -> None:
    update = statements.Returning("UPDATE t SET a = 1")
    assert statements.render({"X": update}, {"columns": "a", "table": "t"}, statements.RETURNING) == {
        "X": "UPDATE t SET a = 1 RETURNING a"
    }
    with pytest.raises(ValueError, match="no row to read back"):
        statements.render({"X": update}, {"columns": "a", "table": "t"}, mysql.RETURNING)
