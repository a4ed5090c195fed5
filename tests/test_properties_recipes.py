"""Generated inputs for the coordination recipes: ``Election``, ``Group``, ``DoubleBarrier``
and ``Dispenser.put/assign/done`` (Hypothesis; tests/properties.py has the strategies and the
budget). Every input is either accepted and round-trips exactly on this database (names,
members, keys in any script and at every length the contract allows, JSON payloads and
states as they were given), or refused with a ValueError naming the argument and nothing
written in any table of the app."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from resource_lease import Dispenser, DoubleBarrier, Election, Group, WorkItem
from resource_lease.models import DispenserItem, Resource
from tests.properties import (
    bad_arguments,
    budget,
    delete_everything,
    good_ttl,
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
    text,
    text_ok,
    variants,
)

pytestmark = pytest.mark.django_db(transaction=True)

json_dicts = st.dictionaries(text(8), json_values, max_size=4)
states = st.one_of(json_dicts, json_values, st.sampled_from([{"n": 1e16}, {"x": float("nan")}, {1: "a"}, []]))


def count_ok(value: Any, minimum: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def json_dict_ok(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) for k in value) and json_ok(value)


# -- Election --------------------------------------------------------------------------------


@budget(40)
@given(
    name=names(200),
    holder=mostly(st.one_of(st.none(), names(255)), st.sampled_from([5, b"h", ""])),
    ttl=mostly(good_ttl, seconds_like),
)
@example(name="nightly-index", holder="Ünïcode 😀", ttl=30)
@example(name="x" * 200, holder="h" * 255, ttl=None)
def test_election_names_and_candidates_round_trip_exactly(name: Any, holder: Any, ttl: Any) -> None:
    delete_everything()
    bad = bad_arguments(
        {
            "name": text_ok(name, 200),
            "holder": holder is None or text_ok(holder, 255),
            "ttl": seconds_ok(ttl, allow_none=True),
        }
    )
    tally("Election(name, holder, ttl)", not bad)
    if bad:
        with refused_any(bad):
            Election(name, holder=holder, ttl=ttl).campaign(timeout=0)
        return
    election = Election(name, holder=holder, ttl=ttl)
    if ttl is not None and ttl < 5:
        return  # accepted; a leadership of a fraction of a second may be gone before it is read
    lease = election.campaign(timeout=0)
    assert lease.resource.name == name
    assert election.leader() == election.holder and (holder is None or election.holder == holder)
    # Another case, padding or normalisation is another election, with a leader of its own.
    for other in variants(name):
        if text_ok(other, 200):
            rival = Election(other, holder="rival")
            assert rival.leader() is None
            rival.campaign(timeout=0)
            assert rival.resign() is True
    assert election.resign() is True


@budget(40)
@given(state=states)
@example(state={"last_id": 42, "day": "2026-11-23", "ratio": 0.55, "big": 2**70, "ß": ["é", None, True]})
@example(state={"n": 1e16})
@example(state={"n": -0.0, "m": 5e-324, "k": 1.5e300})
def test_election_state_round_trips_exactly(state: Any) -> None:
    delete_everything()
    ok = json_dict_ok(state)
    tally("Election.save_state(state)", ok)
    election = Election("stateful", holder="leader")
    election.campaign(timeout=0)
    try:
        if not ok:
            with refused("state"):
                election.save_state(state)
            return
        election.save_state(state)
        read = Election("stateful", holder="reader").state
        assert same_json(read, state), f"saved {state!r}, read back {read!r}"
    finally:
        election.resign()


# -- Group -----------------------------------------------------------------------------------


@budget(40)
@given(
    name=names(200),
    member=mostly(st.one_of(st.none(), names(200)), st.sampled_from([5, b"m"])),
    data=mostly(st.one_of(st.none(), json_dicts), states),
)
@example(name="recommender", member="10.0.0.7:4242", data={"ip": "10.0.0.7", "n": 1e16})
@example(name="g" * 200, member="😀" * 200, data=None)
def test_group_names_members_and_data_round_trip_exactly(name: Any, member: Any, data: Any) -> None:
    delete_everything()
    bad = bad_arguments(
        {
            "name": text_ok(name, 200),
            "member": member is None or text_ok(member, 200),
            "data": data is None or json_dict_ok(data),
        }
    )
    tally("Group(name, member, data)", not bad)
    if bad:
        with refused_any(bad):
            Group(name, member=member, data=data, ttl=30).join()
        return
    group = Group(name, member=member, data=data, ttl=30)
    group.join()
    try:
        seen = Group(name, ttl=30).members(with_data=True)
        assert list(seen) == [group.member] and (member is None or group.member == member)
        assert same_json(seen[group.member], data or {}), f"joined with {data!r}, read back {seen[group.member]!r}"
        # Members whose names differ only in case, padding or normalisation are other members.
        others = [
            Group(name, member=o, ttl=30).join() for o in [v for v in variants(group.member) if text_ok(v, 200)][:3]
        ]
        assert sorted(Group(name, ttl=30).members()) == sorted([group.member, *(o.member for o in others)])
        for other in others:
            assert other.leave() is True
    finally:
        assert group.leave() is True


# -- DoubleBarrier ---------------------------------------------------------------------------


@budget(30)
@given(
    name=names(200),
    member=mostly(st.one_of(st.none(), names(200)), st.sampled_from([5, b"m"])),
    size=mostly(st.just(1), st.sampled_from([0, -1, True, 1.0, "1", None])),
    timeout=mostly(st.sampled_from([None, 30, 0.5]), seconds_like),
)
@example(name="recs:2026-11-23", member="Straße", size=1, timeout=30)
def test_barrier_names_members_and_sizes_round_trip_exactly(name: Any, member: Any, size: Any, timeout: Any) -> None:
    delete_everything()
    bad = bad_arguments(
        {
            "name": text_ok(name, 200),
            "member": member is None or text_ok(member, 200),
            "size": count_ok(size),
            "timeout": seconds_ok(timeout, allow_zero=True, allow_none=True),
        }
    )
    tally("DoubleBarrier(name, member, size).enter(timeout)", not bad)
    if bad:
        with refused_any(bad):
            DoubleBarrier(name, size, member=member, ttl=30).enter(timeout=timeout)
        return
    barrier = DoubleBarrier(name, size, member=member, ttl=30)
    cohort = barrier.enter(timeout=timeout)  # size 1: open at once
    assert cohort == [barrier.member] and (member is None or barrier.member == member)
    assert (barrier.index, barrier.size) == (0, 1)
    assert Resource.objects.filter(kind=f"@barrier:{name}", name=barrier.member).exists()
    barrier.leave(timeout=30)


# -- Dispenser -------------------------------------------------------------------------------

keys = st.one_of(names(255), st.sampled_from(["user:1", "USER:1", "user:1 ", "e\u0301", "é"]))
items_like = mostly(
    st.one_of(st.dictionaries(keys, json_values, max_size=4), st.lists(keys, max_size=4)),
    st.one_of(
        st.sampled_from(["user:1", b"k", 5, None, {1: "a"}, ["a", "a"]]), st.dictionaries(keys, states, max_size=2)
    ),
)


def key_ok(key: Any) -> bool:
    return text_ok(key, 255, blank=True)


def items_ok(items: Any) -> bool:
    if isinstance(items, dict):
        return all(key_ok(k) and json_ok(v) for k, v in items.items())
    if isinstance(items, list):
        return all(key_ok(k) for k in items) and len(set(items)) == len(items)
    return False


@budget(50)
@given(
    name=names(200),
    items=items_like,
    worker=mostly(names(200), st.sampled_from(["", 5])),
    limit=mostly(st.integers(1, 10), st.sampled_from([0, -1, True, 2.5, None])),
    result=mostly(json_values, states),
)
@example(
    name="recommend",
    items={"user:1": {"id": 1}, "USER:1": {"id": 2}, "user:1 ": 1e16},
    worker="w",
    limit=5,
    result=None,
)
@example(name="d", items={"k" * 255: [1, "é"], "😀" * 255: None}, worker="😀" * 200, limit=2, result={"n": 1e16})
def test_dispenser_keys_payloads_and_results_round_trip_exactly(
    name: Any, items: Any, worker: Any, limit: Any, result: Any
) -> None:
    delete_everything()
    bad = bad_arguments({"name": text_ok(name, 200), "items": items_ok(items)})
    tally("Dispenser(name).put(items)", not bad)
    if bad:
        with refused_any(bad):
            Dispenser(name, ttl=30).put(items)
        return
    dispenser = Dispenser(name, ttl=30)
    given_items: dict[str, Any] = dict(items) if isinstance(items, dict) else dict.fromkeys(items)
    assert dispenser.put(items) == len(given_items)
    assert dispenser.put(items) == 0  # every key is there already, exactly as given
    stored = {item.key: item.payload for item in DispenserItem.objects.filter(dispenser=name)}
    assert stored.keys() == given_items.keys()
    for key, payload in given_items.items():
        assert same_json(stored[key], payload), f"put {payload!r} under {key!r}, stored {stored[key]!r}"
    # assign
    bad = bad_arguments({"worker": text_ok(worker, 200), "limit": count_ok(limit)})
    tally("Dispenser.assign(worker, limit)", not bad)
    if bad:
        with refused_any(bad):
            dispenser.assign(worker, limit)
        return
    claimed = dispenser.assign(worker, limit)
    assert len(claimed) == min(limit, len(given_items))
    for item in claimed:
        assert item.key in given_items and same_json(item.payload, given_items[item.key])
    # done
    ok = json_ok(result)
    tally("Dispenser.done(worker, keys, result)", ok)
    if not ok:
        with refused("result"):
            dispenser.done(worker, claimed, result=result)
        return
    assert dispenser.done(worker, claimed, result=result) == len(claimed)
    for row in DispenserItem.objects.filter(dispenser=name, key__in=[i.key for i in claimed]):
        assert row.state == DispenserItem.DONE and same_json(row.result, result), (row.result, result)


@budget(30)
@given(key=names(255), worker=names(200))
def test_dispenser_done_refuses_bad_keys_and_workers_by_name(key: Any, worker: Any) -> None:
    delete_everything()
    dispenser = Dispenser("refusals", ttl=30)
    dispenser.put(["a"])
    (item,) = dispenser.assign("w", 1)
    bad = bad_arguments({"worker": text_ok(worker, 200), "keys": key_ok(key)})
    tally("Dispenser.done(worker, keys)", not bad)
    if bad:
        with refused_any(bad):
            dispenser.done(worker, [key])
        return
    # A valid key or worker that is not the claim's: nothing done (only the worker's live claims count).
    expected = 1 if (worker, key) == ("w", "a") else 0
    assert dispenser.done(worker, [key]) == expected
    assert DispenserItem.objects.get(dispenser="refusals", key="a").state == (
        DispenserItem.DONE if expected else DispenserItem.ASSIGNED
    )
    assert isinstance(item, WorkItem)
