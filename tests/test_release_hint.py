"""PostgreSQL's release of a row a line keeps marked runs one statement, not two.

A release tries RELEASE_UNMARKED first (the plain release, for a row no waiter marked), which
a marked row refuses, and then RELEASE (the hand-off's statement). In a busy line every row
is marked, so each release paid both. The connection now remembers the rows whose last
release found them marked (``PostgreSQLLine.release_to_line``) and releases them with RELEASE
at once; a release that finds the row unmarked again forgets it. The hint only chooses which
statement runs first: each one alone is a whole release.

Negative control: a connection that remembers nothing (a new one) runs both statements for
the same marked row.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from resource_lease import acquire
from resource_lease.db.connections import close_connections, lease_connection, run
from resource_lease.models import Resource

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="only PostgreSQL's release hands off"),
]

KIND = "release-hint"


@pytest.fixture
def released() -> Iterator[list[str]]:
    """The names of the statements each release of this thread runs (the real statements on
    the real database, only their names recorded)."""
    close_connections()
    dialect = lease_connection("default").dialect
    names: list[str] = []
    execute = dialect.execute

    def recording(cursor: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("RELEASE"):
            names.append(name)
        return execute(cursor, name, *args, **kwargs)

    dialect.execute = recording  # type: ignore[method-assign]
    yield names
    close_connections()


def _mark(ttl: float = 30.0) -> None:
    """Mark the kind's rows as a waiter taking a place does (MARK_LINE)."""
    run("default", lambda d, c: d.line.mark_line(c, kind=KIND, name="", where=None, ttl=ttl), what="marking")


def _cycle(names: list[str]) -> list[str]:
    names.clear()
    assert acquire(KIND, ttl=30).release()
    return list(names)


def test_a_marked_row_is_released_with_one_statement_once_known(released: list[str], make_pool: Any) -> None:
    make_pool(KIND, 1)
    assert _cycle(released) == ["RELEASE_UNMARKED"]  # no line: the plain release
    _mark()
    # The first release of the marked row learns it is marked: refused, then RELEASE.
    assert _cycle(released) == ["RELEASE_UNMARKED", "RELEASE"]
    # Known marked: RELEASE at once, and the row is free again.
    assert _cycle(released) == ["RELEASE"]
    assert _cycle(released) == ["RELEASE"]
    # The line is gone (the mark ended): the next release finds it so and forgets the row,
    # and the one after it is the plain release again.
    Resource.objects.filter(kind=KIND).update(line_until=None)
    assert _cycle(released) == ["RELEASE"]
    assert _cycle(released) == ["RELEASE_UNMARKED"]


def test_a_new_connection_knows_nothing_and_runs_both(released: list[str], make_pool: Any) -> None:
    make_pool(KIND, 1)
    _mark()
    assert _cycle(released) == ["RELEASE_UNMARKED", "RELEASE"]
    assert _cycle(released) == ["RELEASE"]
    # Negative control: the same marked row, released on a new connection.
    lease_connection("default").dialect.line._marked.clear()
    assert _cycle(released) == ["RELEASE_UNMARKED", "RELEASE"]
