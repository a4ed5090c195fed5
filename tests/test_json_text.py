"""Floats that PostgreSQL's jsonb would read back as ints (written by Python with an exponent:
1e16 and up) round-trip as floats on every database, in every payload the app stores. Found by
tests/test_properties_recipes.py (an election's state {"n": 1e16} came back {"n": 10000000000000000}
on PostgreSQL)."""

from __future__ import annotations

import json

import pytest

from resource_lease import Config, Dispenser, Election, Group, notify
from resource_lease.db.json_text import dumps
from resource_lease.models import DispenserItem
from resource_lease.recipes.notifications import topic_state
from tests.properties import same_json

pytestmark = pytest.mark.django_db(transaction=True)

FLOATS = [1e16, -1e16, 1.5e300, 1e22, float(2**63), 0.1, 5e-324, 1e-7]  # -0.0: refused (test_json_rule.py)


def same(a: object, b: object) -> bool:
    return same_json(a, b)


def test_dumps_writes_every_float_so_it_reads_back_a_float() -> None:
    text = dumps({"f": FLOATS, "i": 10**16, "s": "@marker@"})
    assert "e+" not in text and json.loads(text) == {"f": FLOATS, "i": 10**16, "s": "@marker@"}
    assert all(type(v) is float for v in json.loads(text)["f"]) and type(json.loads(text)["i"]) is int


def test_floats_round_trip_in_states_data_payloads_and_results() -> None:
    value = {"floats": FLOATS, "int": 10**16}
    election = Election("floats", holder="leader")
    election.campaign(timeout=0)
    election.save_state(value)
    assert same(Election("floats").state, value)
    election.resign()

    group = Group("floats", member="m", data=value, ttl=30).join()
    assert same(Group("floats").members(with_data=True)["m"], value)
    group.leave()

    dispenser = Dispenser("floats", ttl=30)
    dispenser.put({"k": value})
    (item,) = dispenser.assign("w", 1)
    assert same(item.payload, value)
    dispenser.done("w", [item], result=value)
    assert same(DispenserItem.objects.get(dispenser="floats").result, value)

    version = notify("floats", payload=value)
    assert topic_state("floats") == (version, value) and same(topic_state("floats")[1], value)

    params = Config("floats", defaults={"f": 0.5, "l": [0.5]})
    params.set("f", 1e16)
    params.set("l", FLOATS)
    fresh = Config("floats", defaults={"f": 0.5, "l": [0.5]})
    assert type(fresh["f"]) is float and fresh["f"] == 1e16
    assert same(fresh["l"], FLOATS)
