"""Every statement the engine sends on PostgreSQL is short enough for psycopg to keep its parsed
form.

psycopg turns a query's ``%s`` placeholders into ``$n`` by scanning its text, and caches the
result only for a query of at most ``MAX_CACHED_STATEMENT_LENGTH`` bytes (4,096 in psycopg
3.3): a longer one is scanned again on every execution, about 16 µs for 4 KB here. The line's
RELEASE, the statement of every release that may hand its row over, is 4,081 bytes: a few more
words in it would add that to every release without any test noticing. This one notices.

Negative control: run through the engine's cursor, a query exactly at the limit goes through
psycopg's cache (``_query2pg``), and one byte over goes around it (scanned on every execution).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from django.db import connection

from resource_lease.db.connections import lease_connection

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="psycopg's cache of parsed queries"),
]

VERBS = ("SELECT", "UPDATE", "INSERT", "DELETE", "WITH")


def _statements(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """Every rendered statement in ``value`` (a dialect's tables of them, nested), by where."""
    if isinstance(value, str):
        if value.lstrip().upper().startswith(VERBS):
            yield where, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _statements(item, f"{where}[{key!r}]")


def _engine_statements() -> dict[str, str]:
    dialect = lease_connection("default").dialect
    found = dict(_statements(dialect.sql, "sql"))
    found.update(_statements(dialect.forms, "forms"))
    for part in ("line", "leases", "rw"):
        for name, value in vars(getattr(dialect, part)).items():
            found.update(_statements(value, f"{part}.{name}"))
    return found


def test_every_engine_statement_fits_psycopgs_cache_of_parsed_queries() -> None:
    from psycopg import _queries

    limit = _queries.MAX_CACHED_STATEMENT_LENGTH
    found = _engine_statements()
    assert len(found) > 100  # the dialect's tables were found
    assert "sql['RELEASE']" in found  # the longest, 4,081 bytes
    too_long = {where: len(sql.encode()) for where, sql in found.items() if len(sql.encode()) > limit}
    assert not too_long, f"parsed again on every execution (over {limit} bytes): {too_long}"


def test_control_a_query_over_the_limit_is_parsed_on_every_execution(monkeypatch: pytest.MonkeyPatch) -> None:
    from psycopg import _queries

    limit = _queries.MAX_CACHED_STATEMENT_LENGTH
    through_the_cache: list[bytes] = []
    cached = _queries._query2pg

    def counting(query: bytes, encoding: str) -> Any:
        through_the_cache.append(query)
        return cached(query, encoding)

    monkeypatch.setattr(_queries, "_query2pg", counting)
    head = b"SELECT %s::int, '"
    at_limit = head + b"x" * (limit - len(head) - 1) + b"'"
    over = head + b"x" * (limit - len(head)) + b"'"
    assert (len(at_limit), len(over)) == (limit, limit + 1)
    cursor = lease_connection("default").cursor()
    try:
        for query in (at_limit, over):
            cursor.execute(query, (1,))
            assert cursor.fetchall()[0][0] == 1
    finally:
        cursor.close()
    assert at_limit in through_the_cache  # kept, scanned once
    assert over not in through_the_cache  # scanned anew on every execution
