"""The engine's connection keeps one cursor for its statements where the dialect says so
(``Dialect.keeps_cursor``: PostgreSQL, where psycopg's cursor is dear to make), and a new
one after a statement that failed or a new session; elsewhere each statement has its own.

Negative control: where the dialect keeps none, two statements see two cursors.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from resource_lease import acquire
from resource_lease.db.connections import close_connections, lease_connection, run
from resource_lease.exceptions import LeaseDatabaseError

pytestmark = pytest.mark.django_db(transaction=True)


def _cursor_of_a_statement() -> Any:
    return run("default", lambda dialect, cursor: cursor, what="a test's statement")


@pytest.fixture
def fresh() -> Any:
    close_connections()
    yield
    close_connections()


def test_statements_share_the_kept_cursor_and_a_failed_one_drops_it(fresh: None, make_pool: Any) -> None:
    keeps = lease_connection("default").dialect.keeps_cursor
    assert keeps == (connection.vendor == "postgresql")
    first, second = _cursor_of_a_statement(), _cursor_of_a_statement()
    # Kept: the same cursor, still open; not kept (negative control): one per statement.
    assert (first is second) == keeps
    if keeps:
        assert not first.closed

    def fails(dialect: Any, cursor: Any) -> None:
        cursor.execute("SELECT no_such_column FROM no_such_table")

    with pytest.raises(LeaseDatabaseError):
        run("default", fails, what="a statement that fails")
    after = _cursor_of_a_statement()
    assert after is not first  # a failed statement's cursor is never used again
    make_pool("kept-cursor", 2)
    acquire("kept-cursor", ttl=30).release()  # the engine's statements run on it


@pytest.mark.skipif(connection.vendor != "postgresql", reason="only PostgreSQL's dialect keeps a cursor")
def test_a_new_session_starts_with_a_new_cursor(fresh: None) -> None:
    before = _cursor_of_a_statement()
    lease_connection("default").discard()  # as a lost connection is
    after = _cursor_of_a_statement()
    assert after is not before and not after.closed
