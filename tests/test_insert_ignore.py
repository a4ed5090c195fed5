"""``Dispenser.put`` stores an item or refuses it by name, never drops it, and no INSERT
IGNORE hides anything but a duplicate key (issue 37, point 3).

On MySQL/MariaDB the put is an ``INSERT IGNORE`` (it skips the keys that exist, counting only
new rows). IGNORE also turned a row MariaDB's JSON check refused (a payload nested 32 deep)
into a warning and dropped it: ``put`` returned 2 for 3 new keys, and the third was gone. Now
the put reads the warnings and fails naming the keys not stored unless every skipped row was
a duplicate. The JSON rule refuses such a payload before anything is sent
(tests/test_json_rule.py), so these tests take it out to reach the statement.

Negative control: with the warnings check taken out (``_refuse_skipped_rows`` patched to do
nothing), the same put on MariaDB returns 2 and the item is silently missing.

The leadership log wrote its terms with INSERT IGNORE too: a leader its column could not hold
was written truncated. It is now a no-op ON DUPLICATE KEY UPDATE, so anything but a duplicate
fails the statement and writes nothing (control: the INSERT IGNORE put back writes "a-muc").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from resource_lease import Dispenser, Election, validation
from resource_lease.db import item_operations
from resource_lease.db.connections import lease_connection
from resource_lease.exceptions import LeaseDatabaseError, NoResourceAvailable
from resource_lease.models import LeadershipTerm

pytestmark = pytest.mark.django_db(transaction=True)


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.fixture
def no_json_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validation, "check_json_value", lambda value, name: None)


def put_with_one_too_deep() -> int:
    return Dispenser("ignore").put({"a": 1, "b": nested(32), "c": 3})


def test_an_item_the_database_refuses_is_named_never_dropped(no_json_rule: None) -> None:
    if connection.vendor != "mysql":
        assert put_with_one_too_deep() == 3  # no such limit on PostgreSQL and SQLite
        return
    with pytest.raises(LeaseDatabaseError, match=r"did not store items \['b'\]"):
        put_with_one_too_deep()
    assert sorted(item.key for item in Dispenser("ignore").items()) == ["a", "c"]


def test_control_without_the_check_mariadb_drops_the_item(no_json_rule: None, monkeypatch: pytest.MonkeyPatch) -> None:
    if connection.vendor != "mysql":
        pytest.skip("only MySQL/MariaDB's INSERT IGNORE dropped the row")
    monkeypatch.setattr(item_operations, "_refuse_skipped_rows", lambda *args: None)
    assert put_with_one_too_deep() == 2
    assert sorted(item.key for item in Dispenser("ignore").items()) == ["a", "c"]


def test_duplicates_alone_are_skipped_quietly_past_the_listed_warnings() -> None:
    # More duplicates than MySQL lists warnings (max_error_count, 64 by default): the count
    # of warnings still equals the skipped rows, and every key is there.
    dispenser = Dispenser("ignore")
    assert dispenser.put({f"k{i}": i for i in range(100)}) == 100
    assert dispenser.put({f"k{i}": i for i in range(101)}) == 1
    assert dispenser.put([f"k{i}" for i in range(101)]) == 0
    assert dispenser.counts()["pending"] == 101


# -- the leadership log: a duplicate term is kept, anything else fails, nothing changed ------


@pytest.fixture
def narrow_leader_column() -> Iterator[None]:
    """The term log's leader column narrowed to 5 characters for the test (a value the column
    cannot hold, on a real server), restored after."""
    if connection.vendor != "mysql":
        pytest.skip("the term's INSERT IGNORE was MySQL/MariaDB's")
    table = connection.ops.quote_name(LeadershipTerm._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} MODIFY leader varchar(5) NOT NULL")
    try:
        yield
    finally:
        LeadershipTerm.objects.all().delete()
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table} MODIFY leader varchar(255) NOT NULL")


def write_a_term_too_long_for_its_column() -> list[str]:
    first = Election("terms", holder="abc")
    first.campaign(timeout=0)
    first.resign()
    second = Election("terms", holder="a-much-longer-holder")
    with pytest.raises(NoResourceAvailable):  # term 2 cannot be written down: not won
        second.campaign(timeout=0)
    return list(LeadershipTerm.objects.order_by("fence").values_list("leader", flat=True))


def test_a_term_the_column_cannot_hold_is_never_written_changed(narrow_leader_column: None) -> None:
    leaders = write_a_term_too_long_for_its_column()
    assert "a-muc" not in leaders, f"a truncated leader was written down: {leaders}"


def test_control_insert_ignore_writes_the_term_truncated(
    narrow_leader_column: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    dialect = lease_connection(connection.alias).dialect
    sql = dialect.sql["TERM_RECORD"]
    ignore = sql.replace("INSERT INTO", "INSERT IGNORE INTO").split(" ON DUPLICATE KEY")[0]
    monkeypatch.setitem(dialect.sql, "TERM_RECORD", ignore)
    assert "a-muc" in write_a_term_too_long_for_its_column()
