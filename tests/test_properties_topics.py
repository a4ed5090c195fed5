"""Generated inputs for ``notify``/``watch``, ``Config.set``/``compare_and_set``, ``counter``
and the seeding commands (``seed_resources``, ``seed_proxies``, ``enqueue``) (Hypothesis;
tests/properties.py has the strategies and the budget). Every input is either accepted and
round-trips exactly on this database, or refused by name (a ValueError; a CommandError for a
command, naming the argument or the line) with nothing written in any table of the app."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from hypothesis import example, given
from hypothesis import strategies as st

from resource_lease import Config, counter, notify, watch
from resource_lease.models import DispenserItem, Resource
from resource_lease.recipes.notifications import topic_state
from tests.properties import (
    app_tables,
    bad_arguments,
    budget,
    clean_text,
    delete_everything,
    huge_ints,
    json_ok,
    json_values,
    mostly,
    names,
    refused,
    refused_any,
    same_json,
    seconds_like,
    seconds_ok,
    tally,
    text_ok,
    variants,
)

pytestmark = pytest.mark.django_db(transaction=True)

BIGINT = 2**63


# -- notify / watch --------------------------------------------------------------------------


@budget(50)
@given(topic=names(200), payload=json_values)
@example(topic="index-built", payload={"day": "2026-11-23", "n": 1e16, "nan": "NaN"})
@example(topic="t" * 200, payload=[float("nan")])
@example(topic="t", payload={"k": "a\x00b"})
def test_notify_topics_and_payloads_round_trip_exactly(topic: Any, payload: Any) -> None:
    delete_everything()
    bad = bad_arguments({"topic": text_ok(topic, 200), "payload": json_ok(payload)})
    tally("notify(topic, payload)", not bad)
    if bad:
        with refused_any(bad):
            notify(topic, payload)
        return
    version = notify(topic, payload)
    got_version, got = topic_state(topic)
    assert got_version == version and same_json(got, payload), f"notified {payload!r}, read back {got!r}"
    # Another case, padding or normalisation is another topic: never notified.
    for other in variants(topic):
        if text_ok(other, 200):
            assert topic_state(other) == (0, None), f"{other!r} shares the topic {topic!r}"


@budget(15)
@given(topic=names(200), poll=mostly(st.just(0.05), seconds_like), payload=json_values)
@example(topic="watched 😀", poll=0.05, payload={"n": 1e16})
def test_watch_delivers_the_payload_exactly(topic: Any, poll: Any, payload: Any) -> None:
    delete_everything()
    bad = bad_arguments({"topic": text_ok(topic, 200), "poll": seconds_ok(poll)})
    tally("watch(topic, poll)", not bad)
    if bad:
        with refused_any(bad):
            watch(topic, lambda payload, version: None, poll=poll).stop()
        return
    seen: list[Any] = []
    arrived = threading.Event()

    def delivered(got: Any, version: int) -> None:
        seen.append(got)
        arrived.set()

    handle = watch(topic, delivered, poll=min(poll, 0.2))
    try:
        if json_ok(payload):
            notify(topic, payload)
            assert arrived.wait(30), "the watch never called back"
            assert same_json(seen[-1], payload), f"notified {payload!r}, delivered {seen[-1]!r}"
    finally:
        handle.stop()


# -- Config ----------------------------------------------------------------------------------

defaults = st.sampled_from([0, 0.5, "", True, [], {}])
config_values = st.one_of(
    json_values,
    huge_ints,
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([True, 1, 1.0, "1", None, 1e16, [1e16], {"k": float("inf")}]),
)


def value_ok(default: Any, value: Any) -> bool:
    """The contract of ``Config.set``: the type of the key's default (an int for a float
    key; a bool never for a number), finite floats, JSON lists and dicts, clean text."""
    kind = type(default)
    if kind in (int, float) and isinstance(value, bool):
        return False
    if kind is float and isinstance(value, int):
        return True
    if not isinstance(value, kind):
        return False
    if kind is float:
        return math.isfinite(value)
    if kind is str:
        return text_ok(value, 10**9, blank=True) or value == ""
    if kind in (list, dict):
        return json_ok(value) and (kind is list or all(isinstance(k, str) for k in value))
    return True


@budget(40)
@given(namespace=names(200), key=names(200), default=defaults, value=config_values)
@example(namespace="talent_rec", key="max_rec", default=0, value=800)
@example(namespace="talent_rec", key="min_title_sim", default=0.5, value=1e16)
@example(namespace="n", key="k", default=0.5, value=True)
@example(namespace="n", key="k", default=[], value=[1e16, "é", {"n": None}])
@example(namespace="n", key="k", default=0, value=2**70)
def test_config_values_round_trip_exactly(namespace: Any, key: Any, default: Any, value: Any) -> None:
    delete_everything()
    bad = bad_arguments({"namespace": text_ok(namespace, 200), "defaults key": text_ok(key, 200)})
    if bad:
        tally("Config(namespace, defaults)", False)
        with refused_any(bad):
            Config(namespace, defaults={key: default})
        return
    tally("Config(namespace, defaults)", True)
    params = Config(namespace, defaults={key: default})
    ok = value_ok(default, value)
    tally("Config.set(key, value)", ok)
    if not ok:
        with refused(repr(key)):  # the error names the key whose value it refuses
            params.set(key, value)
        return
    params.set(key, value)
    expected = float(value) if isinstance(default, float) else value
    read = Config(namespace, defaults={key: default})[key]
    assert same_json(read, expected), f"set {value!r}, read back {read!r}"
    for other in variants(namespace):
        if text_ok(other, 200):
            assert same_json(Config(other, defaults={key: default})[key], default), f"{other!r} shares {namespace!r}"


@budget(30)
@given(default=defaults, expected=config_values, new=config_values)
@example(default=0.5, expected=0.5, new=1e16)
@example(default=0, expected=0, new=True)
def test_config_compare_and_set_is_validated_like_set(default: Any, expected: Any, new: Any) -> None:
    delete_everything()
    params = Config("cas", defaults={"k": default})
    bad = bad_arguments({"expected": value_ok(default, expected), "new": value_ok(default, new)})
    tally("Config.compare_and_set(key, expected, new)", not bad)
    if bad:
        with refused_any(bad):
            params.compare_and_set("k", expected, new)
        return
    swapped = params.compare_and_set("k", expected, new)
    coerce = float if isinstance(default, float) else (lambda v: v)
    assert swapped == same_json(coerce(expected), default)
    read = Config("cas", defaults={"k": default})["k"]
    assert same_json(read, coerce(new) if swapped else default), (read, new, swapped)


# -- counter ---------------------------------------------------------------------------------


@budget(40)
@given(
    name=names(200),
    amounts=st.lists(
        mostly(st.integers(-(2**62), 2**62), st.one_of(huge_ints, st.sampled_from([True, 1.0, "1", None]))), max_size=3
    ),
)
@example(name="crawl:hits", amounts=[2**63 - 1, 1])
@example(name="c", amounts=[-(2**63), -1])
def test_counter_names_and_sums_round_trip_exactly(name: Any, amounts: list[Any]) -> None:
    delete_everything()
    if not text_ok(name, 200):
        tally("counter(name)", False)
        with refused("name"):
            counter(name).add(1)
        return
    tally("counter(name)", True)
    total = 0
    hits = counter(name)
    for n in amounts:
        ok = isinstance(n, int) and not isinstance(n, bool) and -BIGINT <= n < BIGINT and -BIGINT <= total + n < BIGINT
        tally("counter.add(n)", ok)
        if not ok:
            with refused("n"):
                hits.add(n)
            continue
        total += n
        assert hits.add(n) == total
    assert counter(name).value() == total
    for other in variants(name):
        if text_ok(other, 200):
            assert counter(other).value() == 0, f"{other!r} shares the counter {name!r}"


# -- the seeding commands --------------------------------------------------------------------


def command_refused(*args: Any) -> str:
    """Run the command; it must refuse with a CommandError and write nothing. Its message."""
    before = app_tables()
    with pytest.raises(CommandError) as error:
        call_command(*args, stdout=open("/dev/null", "w"))  # noqa: SIM115
    assert app_tables() == before, "a refused command wrote"
    return str(error.value)


entry_names = mostly(clean_text(30), names(255))


@budget(15)
@given(
    kind=names(100),
    entries=st.dictionaries(entry_names, st.dictionaries(clean_text(8), json_values, max_size=3), max_size=4),
)
@example(kind="gpu", entries={"gpu-0": {"device": 0, "mem": 1e16}, "GPU-0": {"device": 1}, "Gpu-0\u0301": {}})
def test_seed_resources_names_and_data_round_trip_exactly(tmp_path: Path, kind: Any, entries: dict[str, Any]) -> None:
    delete_everything()
    path = tmp_path / "resources.json"
    # The file as a user's program writes it: JSON, non-ASCII kept (NaN written as NaN).
    path.write_text(
        json.dumps([{"name": n, "data": d} for n, d in entries.items()], ensure_ascii=False), "utf-8", "surrogatepass"
    )
    kind_ok = text_ok(kind, 100) and not kind.startswith("@")
    names_ok = all(text_ok(n, 255) and n == n.strip() for n in entries)
    data_ok = all(json_ok(d) for d in entries.values())
    accepted = kind_ok and names_ok and data_ok
    tally("seed_resources(kind, names, data)", accepted)
    if not isinstance(kind, str):
        return  # the command line only carries text
    if not accepted:
        message = command_refused("seed_resources", str(path), "--kind", kind)
        assert (
            ("kind" in message)
            if not kind_ok
            else ("item" in message or "entry" in message or "line" in message or "UTF-8" in message)
        ), message
        return
    call_command("seed_resources", str(path), "--kind", kind, stdout=open("/dev/null", "w"))  # noqa: SIM115
    stored = {r.name: r.data for r in Resource.objects.filter(kind=kind)}
    assert stored.keys() == entries.keys()
    for name, data in entries.items():
        assert same_json(stored[name], data), f"seeded {data!r} for {name!r}, stored {stored[name]!r}"


def as_line_key(value: Any) -> str:
    """A key that stays one key on a line of ``enqueue``'s file: no blanks (they separate the
    key from its payload), not empty (a blank line), not a comment."""
    key = "".join(c for c in value if not c.isspace()).lstrip("#") if isinstance(value, str) else ""
    return key or "k"


@budget(15)
@given(name=names(200), items=st.dictionaries(names(255).map(as_line_key), json_values, max_size=4))
@example(name="recommend", items={"user:1": {"n": 1e16}, "USER:1": None, "é": [1, "😀"]})
@example(name="0", items={"k": {"\x85": "a\u2028b"}})  # not line ends inside a payload
def test_enqueue_keys_and_payloads_round_trip_exactly(tmp_path: Path, name: Any, items: dict[str, Any]) -> None:
    delete_everything()
    if not isinstance(name, str):
        return
    path = tmp_path / "items.txt"
    lines = [k if p is None else f"{k} {json.dumps(p, ensure_ascii=False)}" for k, p in items.items()]
    path.write_text("\n".join(lines) + "\n", "utf-8", "surrogatepass")
    keys_ok = all(text_ok(k, 255) for k in items)
    # The payloads as the file holds them: JSON text, whose keys are strings whatever they were.
    written = {k: json.loads(json.dumps(p)) for k, p in items.items()}
    accepted = text_ok(name, 200) and keys_ok and all(json_ok(p) for p in written.values())
    tally("enqueue(name, keys, payloads)", accepted)
    if not accepted:
        command_refused("enqueue", name, str(path))
        return
    call_command("enqueue", name, str(path), stdout=open("/dev/null", "w"))  # noqa: SIM115
    stored = {i.key: i.payload for i in DispenserItem.objects.filter(dispenser=name)}
    assert stored.keys() == items.keys()
    for key, payload in written.items():
        assert same_json(stored[key], payload), f"enqueued {payload!r} under {key!r}, stored {stored[key]!r}"
