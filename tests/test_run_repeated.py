"""``Dialect.run_repeated``: a statement sent again and again with the same parameters (a
waiter's look). MySQLdb binds parameters on the client, so the MySQL dialect binds such a
statement once, as the driver would, and sends the bound text after: the same answers as
binding each time, values escaped (a quote in a value stays a value), one kept text per
(statement, parameters), at most ``BOUND_KEPT`` of them. Elsewhere it runs as any statement.

Negative control: the same statement with other parameters is bound again (its own answer).
"""

from __future__ import annotations

from typing import Any

import pytest

from resource_lease.db.connections import run
from resource_lease.db.mysql import MySQLDialect

pytestmark = pytest.mark.django_db(transaction=True)

SQL = {"sqlite": "SELECT ?, ?, ? || '%'", "default": "SELECT %s, %s, CONCAT(%s, '%%')"}


def _answers(values: tuple[Any, ...], *, repeated: bool) -> tuple[Any, ...]:
    def statement(dialect: Any, cursor: Any) -> tuple[Any, ...]:
        sql = SQL.get(dialect.vendor, SQL["default"])
        if dialect.vendor == "postgresql":
            sql = "SELECT %s::text, %s::int, %s::text || '%%'"
        if repeated:
            dialect.run_repeated(cursor, sql, values)
        else:
            cursor.execute(sql, values)
        return tuple(cursor.fetchall()[0])

    return run("default", statement, what="a test's statement")


def test_a_repeated_statement_answers_as_one_bound_each_time() -> None:
    tricky = ("it's a 'quote' \\ and % and %s", 7, "x' OR '1'='1")
    for _ in range(3):
        assert _answers(tricky, repeated=True) == _answers(tricky, repeated=False)
    assert _answers(tricky, repeated=True)[0] == tricky[0]  # escaped, never SQL
    other = ("other", 8, "y")
    assert _answers(other, repeated=True) == ("other", 8, "y%")  # bound again, its own answer


def test_the_mysql_dialect_keeps_one_bound_text_per_statement_and_parameters() -> None:
    def kept(dialect: Any, cursor: Any) -> int | None:
        if dialect.vendor != "mysql":
            return None
        dialect._bound.clear()
        for i in range(dialect.BOUND_KEPT + 10):
            for _ in range(2):
                dialect.run_repeated(cursor, "SELECT %s", (i,))
                assert cursor.fetchall()[0][0] == i
        return len(dialect._bound)

    count = run("default", kept, what="a test's statements")
    if count is None:
        pytest.skip("only MySQLdb binds on the client: the other dialects run the statement as it is")
    assert count == MySQLDialect.BOUND_KEPT
