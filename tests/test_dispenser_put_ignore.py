"""``Dispenser.put`` stores an item or refuses it by name, never drops it (issue 37, point 3).

On MySQL/MariaDB the put is an ``INSERT IGNORE`` (it skips the keys that exist, counting only
new rows). IGNORE also turned a row MariaDB's JSON check refused (a payload nested 32 deep)
into a warning and dropped it: ``put`` returned 2 for 3 new keys, and the third was gone. Now
the put reads the warnings and fails naming the keys not stored unless every skipped row was
a duplicate. The JSON rule refuses such a payload before anything is sent
(tests/test_json_rule.py), so these tests take it out to reach the statement.

Negative control: with the warnings check taken out (``_refuse_skipped_rows`` patched to do
nothing), the same put on MariaDB returns 2 and the item is silently missing.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from resource_lease import Dispenser, validation
from resource_lease.db import item_operations
from resource_lease.exceptions import LeaseDatabaseError

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
