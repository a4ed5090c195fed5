"""The one JSON rule (``validation.check_json_value``), the same at every entry point and on
every database, checked before anything is sent (issue 37, points 6 and 8): lists and dicts
nested at most ``MAX_JSON_DEPTH`` deep (MariaDB refused 32 levels with a database error, and
``seed_resources`` then blamed "another process"; a few hundred levels were a RecursionError
everywhere), dict keys strings only (None, 1 and True were turned into text silently), no
-0.0 (PostgreSQL read it back as 0.0). And a ``where=`` key starting with '-', which no
MariaDB JSON path can name (error 4042 on every acquire there), is refused on every database.

Negative controls: with the rule disabled (``check_json_value`` patched to do nothing) the
same calls convert keys silently, fail with RecursionError or a database error, and
PostgreSQL loses the sign of -0.0; with the '-' check taken out, MariaDB fails the acquire.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from resource_lease import Config, Dispenser, Election, Group, acquire, notify, validation
from resource_lease import lease as lease_module
from resource_lease.exceptions import LeaseDatabaseError
from resource_lease.models import Resource
from resource_lease.recipes.notifications import topic_state
from resource_lease.seeding import data_problem
from resource_lease.validation import MAX_JSON_DEPTH, check_json_value, check_where
from tests.properties import refused, same_json

pytestmark = pytest.mark.django_db(transaction=True)


def nested(depth: int, leaf: Any = 1) -> Any:
    """``depth`` lists and dicts nested, alternately, around ``leaf``."""
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


TOO_DEEP = nested(MAX_JSON_DEPTH + 1)
MARIADB_TOO_DEEP = nested(32)  # what MariaDB itself refuses
RECURSION = nested(2000)  # past Python's recursion limit in json.dumps
BAD_VALUES: dict[str, Any] = {
    "too deep": TOO_DEEP,
    "far too deep": RECURSION,
    "a None key": {"a": [{None: 1}]},
    "an int key": {"a": {1: "x"}},
    "a bool key": {True: "x"},
    "-0.0": {"a": [1.5, -0.0]},
}


def test_the_rule_accepts_the_limit_and_refuses_past_it_without_recursion() -> None:
    check_json_value(nested(MAX_JSON_DEPTH), "payload")
    check_json_value({"a": [0.0, 1.5, "x", None, True, {"b": []}]}, "payload")
    for label, value in BAD_VALUES.items():
        with pytest.raises(ValueError, match="payload") as caught:
            check_json_value(value, "payload")
        assert "payload[" in str(caught.value) or label in ("a bool key",), (label, caught.value)
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="deep"):
        check_json_value(loop, "payload")


ENTRY_POINTS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "Dispenser.put": ("items['k']", lambda value: Dispenser("rule").put({"k": value})),
    "Dispenser.recreate": ("mapping['k']", lambda value: Dispenser("rule").recreate({"k": value})),
    "Group data": ("data", lambda value: Group("rule", member="m", data={"d": value}, ttl=30).join()),
    "notify": ("payload", lambda value: notify("rule", payload=value)),
    "Config.set": ("config key 'l'", lambda value: Config("rule", defaults={"l": [1]}).set("l", [value])),
    "Config default": ("defaults['l']", lambda value: Config("rule", defaults={"l": [value]})["l"]),
}


@pytest.mark.parametrize("label", sorted(BAD_VALUES))
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_every_entry_point_refuses_by_name_and_writes_nothing(entry: str, label: str) -> None:
    argument, call = ENTRY_POINTS[entry]
    Config("rule", defaults={"l": [1]})  # declared before: the declaration writes its row
    with refused(argument):
        call(BAD_VALUES[label])


@pytest.mark.parametrize("label", sorted(BAD_VALUES))
def test_states_results_and_seeded_data_are_refused_by_name(label: str) -> None:
    value = BAD_VALUES[label]
    election = Election("rule", holder="leader")
    election.campaign(timeout=0)
    dispenser = Dispenser("rule", ttl=30)
    dispenser.put(["k"])
    (item,) = dispenser.assign("w")
    try:
        with refused("state"):
            election.save_state({"s": value})
        with refused("result"):
            dispenser.done("w", [item], result=value)
    finally:
        election.resign()
    problem = data_problem({"d": value})
    assert problem is not None and "the data" in problem, problem


def test_enqueue_refuses_deep_lines_by_line_number(tmp_path: Path) -> None:
    deep = "[" * 5000 + "]" * 5000  # json.loads itself recurses past the limit
    for payload in (deep, "[" * 31 + "]" * 31, '{"a": -0.0}'):
        lines = tmp_path / "items.txt"
        lines.write_text(f"a 1\nb {payload}\n")
        with pytest.raises(CommandError, match="line 2"):
            call_command("enqueue", "rule", str(lines))
    assert Dispenser("rule").counts()["pending"] == 0


def test_the_limit_round_trips_exactly_on_every_database() -> None:
    value = {"deep": nested(MAX_JSON_DEPTH - 1, leaf=0.0), "keys": {"1": "one", "None": None}}
    dispenser = Dispenser("rule", ttl=30)
    assert dispenser.put({"k": value}) == 1
    (item,) = dispenser.assign("w")
    assert same_json(item.payload, value)
    version = notify("rule", payload=value)
    assert topic_state("rule")[0] == version and same_json(topic_state("rule")[1], value)
    group = Group("rule", member="m", data=value, ttl=30).join()
    try:
        assert same_json(Group("rule").members(with_data=True)["m"], value)
    finally:
        group.leave()


def test_control_without_the_rule_keys_turn_to_text_and_deep_values_break(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(validation, "check_json_value", lambda value, name: None)
    notify("rule", payload={1: "a", None: "b", False: "c"})
    assert topic_state("rule")[1] == {"1": "a", "null": "b", "false": "c"}  # silently converted
    with pytest.raises(RecursionError):
        notify("rule", payload=RECURSION)
    notify("rule", payload={"z": -0.0})
    read = topic_state("rule")[1]["z"]
    if connection.vendor == "postgresql":
        assert math.copysign(1.0, read) == 1.0, "PostgreSQL kept -0.0: the control shows nothing"
    if connection.vendor == "mysql":
        with pytest.raises(LeaseDatabaseError):
            notify("rule", payload=MARIADB_TOO_DEEP)


# -- where= keys starting with '-' ----------------------------------------------------------


def test_a_where_key_starting_with_a_dash_is_refused_everywhere() -> None:
    Resource.objects.create(kind="dash", name="r0", data={"-a": 1, "a-b": 2})
    with refused("where"):
        acquire("dash", ttl=5, where={"-a": 1})
    with pytest.raises(ValueError, match="'-'"):
        check_where({"-": None})
    with acquire("dash", ttl=5, where={"a-b": 2}, timeout=0) as lease:  # a dash inside is fine
        assert lease.resource.name == "r0"


def test_control_a_dash_key_fails_every_acquire_on_mariadb(monkeypatch: pytest.MonkeyPatch) -> None:
    Resource.objects.create(kind="dash", name="r0", data={"-a": 1})

    def without_the_dash_check(value: Any, name: str = "where") -> Any:
        return check_where({f"x{k}": v for k, v in value.items()}, name) and dict(value)

    monkeypatch.setattr(lease_module, "check_where", without_the_dash_check)
    if connection.vendor == "mysql":
        with pytest.raises(LeaseDatabaseError, match="4042"):
            acquire("dash", ttl=5, where={"-a": 1}, timeout=0)
    else:
        with acquire("dash", ttl=5, where={"-a": 1}, timeout=0) as lease:
            assert lease.resource.name == "r0"


def test_seed_resources_names_the_entry_whose_data_is_too_deep(tmp_path: Path) -> None:
    # MariaDB refused the write, and the command blamed "another process"; thousands of
    # levels were a RecursionError in json.loads.
    seed = tmp_path / "seed.json"
    for document, said in [
        ('[{"name": "r1", "data": {"d": 1}}, {"name": "r2", "data": {"d": ' + "[" * 31 + "]" * 31 + "}}]", "item 2"),
        ('[{"name": "r1", "data": {"d": ' + "[" * 5000 + "]" * 5000 + "}}]", "too deep"),
    ]:
        seed.write_text(document)
        with pytest.raises(CommandError, match="nothing was written") as caught:
            call_command("seed_resources", str(seed), "--kind", "gpu")
        assert said in str(caught.value) and "another process" not in str(caught.value), caught.value
    assert not Resource.objects.filter(kind="gpu").exists()


def test_control_without_the_rule_mariadb_blames_another_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if connection.vendor != "mysql":
        pytest.skip("only MariaDB refuses 32 levels")
    monkeypatch.setattr(validation, "check_json_value", lambda value, name: None)
    seed = tmp_path / "seed.json"
    seed.write_text('[{"name": "r2", "data": {"d": ' + "[" * 31 + "]" * 31 + "}}]")
    with pytest.raises(CommandError, match="another process"):
        call_command("seed_resources", str(seed), "--kind", "gpu")
