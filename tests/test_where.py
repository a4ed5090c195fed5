"""``where=``: narrowing a pool by its resources' data, compared the same way by every
database (``Dialect.matches_sql``) as by Python (``validation.where_matches``), and served
in line: the oldest waiter whose filter a freed row matches gets it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from resource_lease import acquire
from resource_lease.db.connections import run_repeatable
from resource_lease.exceptions import NoResourceAvailable
from resource_lease.models import Resource, Waiter
from resource_lease.validation import check_where, where_matches
from tests.line_waiting import WAIT, Waiting, wait_for_places, waiting_fixture  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)

DATA = [
    {"region": "eu", "tier": 1, "ok": True, "note": None},
    {"region": "EU", "tier": 1, "ok": True},
    {"region": "eu ", "tier": "1", "ok": 1},
    {"region": "us", "tier": 1.0, "ok": False, "nested": {"a": 1}},
    {"region": "éu", "tier": -(2**63), "ok": None, "quote": "a'b"},
    {"region": "eu", "tier": 2**63 - 1, "list": [1, 2], "spaced key.x": "v"},
    {},
    {"region": "\u2028eu\t"},
]

FILTERS = [
    {"region": "eu"},
    {"region": "EU"},
    {"region": "eu "},
    {"region": "éu"},
    {"tier": 1},
    {"tier": "1"},
    {"ok": True},
    {"ok": False},
    {"ok": 1},
    {"ok": None},
    {"note": None},
    {"region": "eu", "tier": 1},
    {"tier": -(2**63)},
    {"tier": 2**63 - 1},
    {"spaced key.x": "v"},
    {"quote": "a'b"},
    {"missing": None},
    {"region": "\u2028eu\t"},
]


def matching_ids(kind: str, where: dict[str, Any]) -> set[int]:
    """The rows of ``kind`` the database's own condition says match ``where``."""

    def statement(d: Any, c: Any) -> Any:
        sql = f"SELECT id FROM {d.table} WHERE kind = {d.placeholder} AND " + d.matches_sql(
            d.json_cast.format(d.placeholder), f"{d.table}.data"
        )
        c.execute(sql, (kind, d.encode_where(where)))
        return {row[0] for row in c.fetchall()}

    return run_repeatable("default", statement, what="matching rows")


def test_each_database_matches_exactly_as_python_does() -> None:
    rows = [Resource.objects.create(kind="filtered", name=f"r{i}", data=data) for i, data in enumerate(DATA)]
    for where in FILTERS:
        checked = check_where(where)
        assert checked is not None
        expected = {r.pk for r in rows if where_matches(checked, r.data)}
        assert matching_ids("filtered", checked) == expected, where


#: Keys a filter may have that JSON writers spell differently: non-ASCII (escaped by Python's
#: json.dumps, as Django's JSONField writes it), astral, control and line-separator characters.
#: Found by tests/test_properties_lease.py: on MariaDB and SQLite a key's path compared the
#: stored spelling, so none of them ever matched (and a control character was a JSON path
#: syntax error on MariaDB).
SPELLED_KEYS = ["é", "😀", "\x06", "a\nb", "\x7f", "\u2028", "\x82\x06", "ключ", " ", "a.b", "$"]


@pytest.mark.parametrize("key", SPELLED_KEYS, ids=repr)
def test_a_key_matches_however_the_document_spells_it(key: str) -> None:
    escaped = Resource.objects.create(kind="spelled", name="escaped", data={key: 1, "other": 2})
    raw = Resource.objects.create(kind="spelled", name="raw", data={})
    # The same data as a writer that keeps UTF-8 stores it (PostgreSQL's jsonb keeps no spelling).
    text = json.dumps({key: 1, "other": 2}, ensure_ascii=False)
    with connection.cursor() as cursor:
        cast = "::jsonb" if connection.vendor == "postgresql" else ""
        cursor.execute(f"UPDATE {Resource._meta.db_table} SET data = %s{cast} WHERE id = %s", [text, raw.pk])
    assert matching_ids("spelled", {key: 1}) == {escaped.pk, raw.pk}
    assert matching_ids("spelled", {key: 2}) == set()
    first = acquire("spelled", ttl=30, where={key: 1})
    second = acquire("spelled", ttl=30, where={key: 1})
    assert {first.resource.name, second.resource.name} == {"escaped", "raw"}


def test_acquire_takes_only_matching_rows(make_pool: Callable[..., Any]) -> None:
    Resource.objects.create(kind="regions", name="us-1", data={"region": "us"})
    Resource.objects.create(kind="regions", name="eu-1", data={"region": "eu"})
    lease = acquire("regions", ttl=30, where={"region": "eu"})
    assert lease.resource.name == "eu-1"
    with pytest.raises(NoResourceAvailable, match="matching"):
        acquire("regions", ttl=30, where={"region": "eu"}, timeout=0.2)
    other = acquire("regions", ttl=30)  # the rest of the pool is still there for anyone
    assert other.resource.name == "us-1"


@pytest.mark.parametrize(
    "where",
    [
        [("region", "eu")],
        {"tier": 1.5},
        {"nested": {"a": 1}},
        {"list": [1]},
        {"": 1},
        {'a"b': 1},
        {"a\\b": 1},
        {"k": "nul\x00"},
        {"k": 2**63},
        {1: "x"},
    ],
    ids=repr,
)
def test_a_bad_filter_is_refused_naming_where(where: Any, make_pool: Callable[..., Any]) -> None:
    make_pool("bad-where", 1)
    with pytest.raises(ValueError, match="where"):
        acquire("bad-where", ttl=30, where=where)
    assert not Resource.objects.filter(kind="bad-where").exclude(grant_token="").exists()
    assert not Waiter.objects.exists()


def test_the_oldest_waiter_whose_filter_a_freed_row_matches_gets_it(waiting: Callable[..., Waiting]) -> None:
    Resource.objects.create(kind="zones", name="eu-1", data={"region": "eu"})
    Resource.objects.create(kind="zones", name="us-1", data={"region": "us"})
    eu = acquire("zones", ttl=300, where={"region": "eu"})
    us = acquire("zones", ttl=300, where={"region": "us"})
    # In line, oldest first: one for the US only, then one for anything, then one for the EU.
    for_us = waiting("--what", "pool:zones", "--once", "--where", '{"region": "us"}', "--hold", "30")
    wait_for_places("zones", "", 1)
    anyone = waiting("--what", "pool:zones", "--once", "--hold", "30")
    wait_for_places("zones", "", 2)
    for_eu = waiting("--what", "pool:zones", "--once", "--where", '{"region": "eu"}', "--hold", "30")
    wait_for_places("zones", "", 3)
    # The EU row comes free: the US waiter does not match it, so the oldest match is "anyone".
    assert eu.release()
    assert anyone.next("granted", timeout=WAIT)["row"] == eu.resource.pk
    # The US row comes free: the US waiter, older than the EU one (which does not match).
    assert us.release()
    assert for_us.next("granted", timeout=WAIT)["row"] == us.resource.pk
    assert Waiter.objects.filter(kind="zones").count() == 1  # the EU waiter, still in line
    assert for_eu.proc.poll() is None


def test_a_lease_task_with_lease_where_leases_only_matching_resources() -> None:
    from tests.test_lease_quarantine import declare

    Resource.objects.create(kind="task-zones", name="us-1", data={"region": "us"})
    Resource.objects.create(kind="task-zones", name="eu-1", data={"region": "eu"})

    def region(self: Any) -> str:
        return str(self.lease.resource.name)

    task = declare(region, lease_kind="task-zones", lease_where={"region": "eu"})
    assert {task() for _ in range(4)} == {"eu-1"}  # released after each run, never us-1
    with pytest.raises(ValueError, match="lease_where"):
        declare(region, lease_kind="task-zones", lease_where={"region": 1.5})
