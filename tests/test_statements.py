"""The lease statements are named templates (``resource_lease.db.statements``) that a dialect
renders once: on this database every one comes out whole, and a template that names a piece
nobody fills, or a statement that a vendor without RETURNING could not read back, is refused
when the dialect is made, not when the statement first runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from resource_lease.db import mysql, rw_statements, statements
from resource_lease.db.connections import lease_connection
from resource_lease.db.listing import BACKENDS, listing, rendered
from resource_lease.db.statements import PER_CALL

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
    delay_over = dialect.sql["DELAY_OVER"]
    assert (
        f"WHERE id = {dialect.placeholder} AND {free_by_id} AND {delay_over} AND {dialect.sql['LINE_CLEAR']}"
        in dialect.sql["GRANT_BY_ID"]
    )
    # Every grant waits its turn in the row's line and the end of the row's lock delay (the
    # same fragments everywhere); a newcomer's first try only asks whether a waiter marked the
    # row, with no subquery at all (docs/pitfalls.md#subquery-cost), and then, if it granted
    # nothing, checks the line.
    newcomer = dialect.forms[False, False, False]
    for name in ("GRANT_BY_ID", "GRANT_BY_NAME", "ACQUIRE_SCAN", "RW_WRITE", "RW_READ"):
        assert dialect.sql["LINE_CLEAR" if name != "RW_READ" else "RW_READ_CLEAR"] in dialect.sql[name], name
        assert delay_over in dialect.sql[name], name
    for name in ("GRANT_BY_ID", "GRANT_BY_NAME", "ACQUIRE_SCAN"):
        assert dialect.sql["UNMARKED"] in newcomer[name] and "SELECT 1" not in newcomer[name], name
        assert delay_over in newcomer[name], name
        assert dialect.forms[True, False, False][name] == dialect.sql[name]
    # The release's condition (PostgreSQL: inside the statement that also wakes the line).
    assert f"WHERE {dialect.ours}" in dialect.sql["RELEASE"]


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


# -- every statement, whole, per vendor (docs/statements.md) ---------------------------------


def test_docs_statements_md_is_every_rendered_statement_of_every_vendor() -> None:
    """A reviewer reads the SQL whole in docs/statements.md; regenerate it with
    ``resource_lease.db.listing.listing()`` when a template changes."""
    current = listing()
    print(current)
    documented = (Path(__file__).resolve().parent.parent / "docs" / "statements.md").read_text()
    assert documented == current, "docs/statements.md is out of date: write listing() into it"


@pytest.mark.parametrize("vendor", sorted(BACKENDS))
def test_every_statement_renders_whole_leaving_only_per_call_holes(vendor: str) -> None:
    for name, sql in rendered(vendor).items():
        holes = set(re.findall(r"\{(\w+)\}", sql))
        assert holes <= set(PER_CALL), (vendor, name, holes - set(PER_CALL))


def test_the_mysql_probe_is_the_grant_but_for_its_fence_and_nowait() -> None:
    sql = rendered("mysql")
    assert sql["PROBE_SET"].replace(sql["PROBE_FENCE"], "fence = fence + 1") == sql["GRANT_SET"]
    assert sql["GRANT_PROBE_NOWAIT"] == "SET STATEMENT innodb_lock_wait_timeout = 0 FOR " + sql["GRANT_PROBE"]


def test_postgresqls_free_by_id_is_free_but_for_the_kind_compared_as_an_expression() -> None:
    sql = rendered("postgresql")
    assert sql["FREE_BY_ID"].replace("kind || '' = ", "kind = ", 1) == sql["FREE"]


def test_mysqls_read_grant_of_an_rwlock_is_the_common_one_but_for_handing_its_fence_back() -> None:
    from resource_lease.db import mysql

    assert mysql.RW_READ.update == rw_statements.RW_READ.update  # the same UPDATE, whole
    assert mysql.RW_READ.read_back == rw_statements.RW_READ.read_back
    assert mysql.RW_NEXT_FENCE == f"LAST_INSERT_ID({rw_statements.RW_NEXT_FENCE})"


def _over_psycopgs_cache(sql: dict[str, str]) -> list[str]:
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

    return [
        f"{name}: {len(text.encode())} bytes"
        for name, text in sql.items()
        if len(text.encode()) > MAX_CACHED_STATEMENT_LENGTH
    ]


def test_every_postgresql_lease_statement_fits_psycopgs_cache_of_parsed_queries() -> None:
    """psycopg parses a statement's text for its placeholders on every call, unless it is at
    most MAX_CACHED_STATEMENT_LENGTH (4096) bytes, whose parse it caches. RELEASE, run by every
    release, grew to 4104 bytes (stop 39: the handed grant's data in its NOTIFY) and was parsed
    again each time; its HANDED condition is now short."""
    pytest.importorskip("psycopg")
    assert _over_psycopgs_cache(rendered("postgresql")) == []


def test_negative_control_a_statement_over_psycopgs_cache_is_named() -> None:
    pytest.importorskip("psycopg")
    release = rendered("postgresql")["RELEASE"]
    padded = release.replace("h.ttl > 0", "COALESCE(h.ttl, 0) > 0")
    assert _over_psycopgs_cache({"RELEASE": release, "PADDED": padded}) == [f"PADDED: {len(padded)} bytes"]
