"""Generated inputs for ``acquire``, ``lock`` and ``semaphore`` (Hypothesis; tests/properties.py
has the strategies and the budget): every input is either accepted and round-trips exactly
on this database (a kind or name in any script, at any length the contract allows, compares
exactly: case, trailing spaces, Unicode normalisation, 4-byte characters), or refused with a
ValueError naming the argument and nothing written in any table of the app."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from resource_lease import LockHeld, NoResourceAvailable, acquire, lock, rwlock, semaphore
from resource_lease.models import Resource
from resource_lease.validation import MAX_PRIORITY, MAX_WHERE_INT, MIN_PRIORITY, MIN_WHERE_INT
from tests.properties import (
    app_tables,
    bad_arguments,
    budget,
    delete_everything,
    good_timeout,
    good_ttl,
    huge_ints,
    json_ok,
    json_scalars,
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


def kind_ok(kind: Any) -> bool:
    return text_ok(kind, 100) and not kind.startswith("@")


def holder_ok(holder: Any) -> bool:
    return holder is None or text_ok(holder, 255)


def priority_ok(priority: Any) -> bool:
    return isinstance(priority, int) and not isinstance(priority, bool) and MIN_PRIORITY <= priority <= MAX_PRIORITY


def where_ok(where: Any) -> bool:
    if where is None:
        return True
    if not isinstance(where, dict) or len(where) > 32:
        return False
    for key, value in where.items():
        if not isinstance(key, str) or not key or len(key) > 200 or '"' in key or "\\" in key:
            return False
        if key.startswith("-"):  # no MariaDB JSON path can name it
            return False
        if not text_ok(key, 200, blank=True):
            return False
        if isinstance(value, str):
            if value and not text_ok(value, 10**9, blank=True):
                return False
        elif isinstance(value, int) and not isinstance(value, bool):
            if not MIN_WHERE_INT <= value <= MAX_WHERE_INT:
                return False
        elif value is not None and not isinstance(value, bool):
            return False
    return True


# -- acquire: kind, holder and the resource's name round-trip exactly -----------------------


@budget(40)
@given(kind=names(100), name=names(255), holder=st.one_of(st.none(), names(255)))
@example(kind="proxy", name="p1", holder="PROXY ")
@example(kind="Straße", name="e\u0301", holder="😀" * 255)
@example(kind="a" * 100, name="😀" * 255, holder=None)
@example(kind="proxy ", name=" ", holder="\u3000")
def test_acquire_kind_name_and_holder_round_trip_exactly(kind: str, name: str, holder: str | None) -> None:
    delete_everything()
    bad = bad_arguments({"kind": kind_ok(kind), "holder": holder_ok(holder)})
    tally("acquire(kind, holder)", not bad)
    if bad:
        with refused_any(bad):
            acquire(kind, ttl=5, holder=holder)
        return
    assume(text_ok(name, 255, blank=True))  # the resource's own name: written by the caller
    row = Resource.objects.create(kind=kind, name=name, data={"k": kind})
    lease = acquire(kind, ttl=5, holder=holder)
    stored = Resource.objects.get(pk=row.pk)
    assert (lease.resource.kind, lease.resource.name) == (kind, name)
    assert (stored.kind, stored.name, stored.data) == (kind, name, {"k": kind})
    if holder is not None:
        assert lease.holder == holder == stored.holder
    # A kind in another case, padded, or normalised otherwise is another (empty) pool.
    for other in variants(kind):
        if kind_ok(other):
            with pytest.raises(NoResourceAvailable) as error:
                acquire(other, ttl=5)
            assert error.value.exists is False, f"{other!r} leased a resource of kind {kind!r}"
    assert lease.release() is True


# -- acquire: ttl, timeout, priority, where and holder: accepted or refused by name ------------


where_values = st.one_of(json_scalars, json_values, st.sampled_from([1.0, [1], {"a": 1}, 2**63, -(2**63) - 1]))
where_like = mostly(
    st.one_of(
        st.none(),
        st.dictionaries(
            text(12), st.one_of(st.none(), st.booleans(), st.integers(MIN_WHERE_INT, MAX_WHERE_INT), text()), max_size=4
        ),
    ),
    st.one_of(
        st.dictionaries(st.one_of(text(12), st.sampled_from(['a"b', "a\\b", "", "x" * 201])), where_values, max_size=4),
        st.sampled_from([[("a", 1)], "region=eu", {1: "a"}, {"k": float("nan")}, {f"k{i}": i for i in range(33)}]),
    ),
)


@budget(50)
@given(
    ttl=mostly(good_ttl, seconds_like),
    timeout=mostly(good_timeout, seconds_like),
    priority=mostly(
        st.integers(MIN_PRIORITY, MAX_PRIORITY), st.one_of(huge_ints, st.sampled_from([True, 1.0, "1", None]))
    ),
    where=where_like,
    holder=mostly(st.none(), st.one_of(names(255), st.sampled_from([1, b"x", ""]))),
)
@example(ttl=1e9, timeout=0, priority=MAX_PRIORITY, where={"region": "eu", "n": MAX_WHERE_INT}, holder=None)
@example(ttl=True, timeout=0, priority=0, where=None, holder=None)
@example(ttl=5, timeout=-0.0, priority=MIN_PRIORITY - 1, where=None, holder=None)
@example(ttl=5, timeout=None, priority=0, where={"n": 1.0}, holder=None)
def test_acquire_arguments_are_accepted_or_refused_by_name(
    ttl: Any, timeout: Any, priority: Any, where: Any, holder: Any
) -> None:
    delete_everything()
    bad = bad_arguments(
        {
            "ttl": seconds_ok(ttl, allow_none=True),
            "timeout": seconds_ok(timeout, allow_zero=True, allow_none=True),
            "priority": priority_ok(priority),
            "where": where_ok(where),
            "holder": holder_ok(holder),
        }
    )
    tally("acquire(ttl, timeout, priority, where, holder)", not bad)
    # A free resource whose data holds exactly what the filter asks for: an accepted call is
    # granted at once, whatever its timeout.
    data = dict(where) if isinstance(where, dict) and where_ok(where) else {}
    Resource.objects.create(kind="pool", name="r0", data={**data, "extra": [1, 2]})
    if bad:
        with refused_any(bad):
            acquire("pool", ttl=ttl, timeout=timeout, priority=priority, where=where, holder=holder)
        return
    # One attempt first: a call that would wait (for ever, maybe) must find the row free.
    probe = acquire("pool", ttl=5, timeout=0, where=where)
    assert probe.release() is True
    lease = acquire("pool", ttl=ttl, timeout=timeout, priority=priority, where=where, holder=holder)
    assert lease.resource.name == "r0"
    assert lease.release() is True or ttl < 1


# -- where=: the database compares as the contract says (type and value, exactly) ------------


#: Keys JSON writers spell differently (escaped or not) among the generated ones.
SPELLED = ["région", "😀", "a\nb", "\x06", "ключ", "\u2028"]
#: Values a filter may ask for (what most of the generated data holds, so filters match often).
where_scalars = st.one_of(st.none(), st.booleans(), st.integers(MIN_WHERE_INT, MAX_WHERE_INT), text())
data_dicts = st.dictionaries(
    st.one_of(text(8), st.sampled_from(["region", "tier", "ok", *SPELLED])),
    mostly(where_scalars, json_values),
    max_size=5,
)


@st.composite
def data_and_filter(draw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A resource's data, and a filter made from it: most values kept as they are, some
    changed the way a blind comparison would not notice (case, padding, 1 for 1.0 or True, a
    near int, a number as text), some keys left out, one perhaps added."""
    data = draw(data_dicts)
    where: dict[str, Any] = {}
    for key, value in data.items():
        choice = draw(st.integers(0, 3))
        if choice == 0:
            continue
        if choice in (1, 2) or not isinstance(value, (str, int, float, bool)) and value is not None:
            where[key] = value  # a float, list or dict here: a filter to refuse
            continue
        if isinstance(value, str):
            where[key] = draw(st.sampled_from([value.upper(), value + " ", value.casefold(), value]))
        elif isinstance(value, bool):
            where[key] = draw(st.sampled_from([int(value), str(value).lower(), value]))
        elif isinstance(value, (int, float)) and value == value and abs(value) < 2**62:
            where[key] = draw(st.sampled_from([int(value), int(value) + 1, str(int(value))]))
        else:
            where[key] = None
    if draw(st.integers(0, 3)) == 0:
        where[draw(text(6))] = draw(where_scalars)
    return data, where


@budget(40)
@given(pair=data_and_filter())
@example(pair=({"tier": 1.0}, {"tier": 1}))
@example(pair=({"ok": True}, {"ok": 1}))
@example(pair=({"region": "eu"}, {"region": "EU"}))
@example(pair=({"region": "eu"}, {"region": "eu "}))
@example(pair=({"n": 2**53 + 1}, {"n": 2**53}))
@example(pair=({"n": 1e16}, {"n": 10**16}))
def test_where_compares_type_and_value_exactly(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    data, where = pair
    assume(json_ok(data))
    delete_everything()
    if not where_ok(where):
        tally("acquire(where)", False)
        Resource.objects.create(kind="pool", name="r0", data=data)
        with refused("where"):
            acquire("pool", ttl=5, where=where)
        return
    tally("acquire(where)", True)
    row = Resource.objects.create(kind="pool", name="r0", data=data)
    # The data as this database stores it (PostgreSQL's jsonb keeps no float/int distinction
    # for a float written without a fraction: docs/pitfalls.md#json-compared).
    stored = Resource.objects.get(pk=row.pk).data
    expected = all(key in stored and same_json(stored[key], value) for key, value in where.items())
    try:
        lease = acquire("pool", ttl=5, where=where)
    except NoResourceAvailable:
        assert not expected, f"{where!r} did not match {stored!r}"
    else:
        assert expected, f"{where!r} matched {stored!r}"
        lease.release()


# -- lock and semaphore: names round-trip exactly; every argument checked --------------------


@budget(30)
@given(name=names(200), holder=st.one_of(st.none(), names(255)))
@example(name="rebuild", holder=None)
@example(name="a" * 200, holder=None)
@example(name="😀" * 200, holder="😀" * 255)
@example(name="ǅ", holder=None)
def test_lock_names_round_trip_exactly(name: str, holder: str | None) -> None:
    delete_everything()
    bad = bad_arguments({"name": text_ok(name, 200), "holder": holder_ok(holder)})
    tally("lock(name, holder)", not bad)
    if bad:
        with refused_any(bad):
            lock(name, ttl=5, holder=holder, auto_renew=False)
        return
    lease = lock(name, ttl=5, holder=holder, auto_renew=False)
    assert lease.resource.name == name
    stored = Resource.objects.get(pk=lease.resource.pk)
    assert stored.name == name and (holder is None or stored.holder == holder)
    with pytest.raises(LockHeld):
        lock(name, ttl=5, auto_renew=False)
    # Another case, padding or normalisation is another lock: free while this one is held.
    others = [lock(other, ttl=5, auto_renew=False) for other in variants(name) if text_ok(other, 200)]
    assert sorted(Resource.objects.filter(kind=lease.kind).values_list("name", flat=True)) == sorted(
        [name, *(o.resource.name for o in others)]
    )
    for held in [lease, *others]:
        assert held.release() is True


@budget(30)
@given(
    name=names(200),
    slots=st.one_of(st.integers(-2, 4), st.sampled_from([1000, 1001, True, 2.0, "2", None, 2**64])),
)
@example(name="exports", slots=1)
@example(name="x" * 200, slots=2)
def test_semaphore_names_and_slots_round_trip_exactly(name: str, slots: Any) -> None:
    delete_everything()
    slots_ok = isinstance(slots, int) and not isinstance(slots, bool) and 1 <= slots <= 1000
    bad = bad_arguments({"name": text_ok(name, 200), "slots": slots_ok})
    tally("semaphore(name, slots)", not bad)
    if bad:
        with refused_any(bad):
            semaphore(name, slots, ttl=5, auto_renew=False)
        return
    held = [semaphore(name, slots, ttl=5, auto_renew=False) for _ in range(min(slots, 3))]
    assert {lease.kind for lease in held} == {f"@semaphore:{name}"}
    assert Resource.objects.filter(kind=f"@semaphore:{name}").count() == slots
    if slots <= 3:
        with pytest.raises(LockHeld):
            semaphore(name, slots, ttl=5, auto_renew=False)
    for other in variants(name):
        if text_ok(other, 200):
            semaphore(other, 1, ttl=5, auto_renew=False).release()
    for lease in held:
        assert lease.release() is True


@budget(40)
@given(
    ttl=mostly(good_ttl, seconds_like),
    timeout=mostly(good_timeout, seconds_like),
    priority=mostly(st.integers(MIN_PRIORITY, MAX_PRIORITY), st.one_of(huge_ints, st.sampled_from([True, 1.5]))),
    auto_renew=mostly(st.booleans(), st.sampled_from([1, None, "yes"])),
    on_lost=mostly(st.sampled_from([None, print]), st.sampled_from(["print", 5])),
    which=st.sampled_from(["lock", "semaphore"]),
)
def test_lock_and_semaphore_arguments_are_accepted_or_refused_by_name(
    ttl: Any, timeout: Any, priority: Any, auto_renew: Any, on_lost: Any, which: str
) -> None:
    delete_everything()
    bad = bad_arguments(
        {
            "ttl": seconds_ok(ttl, allow_none=True),
            "timeout": seconds_ok(timeout, allow_zero=True, allow_none=True),
            "priority": priority_ok(priority),
            "auto_renew": isinstance(auto_renew, bool),
            "on_lost": on_lost is None or callable(on_lost),
        }
    )
    tally(f"{which}(ttl, timeout, priority, auto_renew, on_lost)", not bad)

    def call() -> Any:
        options = dict(ttl=ttl, timeout=timeout, priority=priority, auto_renew=auto_renew, on_lost=on_lost)
        return lock("L", **options) if which == "lock" else semaphore("S", 2, **options)

    if bad:
        with refused_any(bad):
            call()
        return
    lease = call()  # free: granted at once whatever the timeout
    # A ttl of a few milliseconds may have run out already: False is then the right answer.
    assert lease.release() is True or ttl < 1
    assert app_tables()  # the rows stay, free


# -- rwlock: names round-trip exactly; read and write take lock()'s arguments -----------------


@budget(20)
@given(
    name=names(200),
    holder=mostly(st.one_of(st.none(), names(255)), st.sampled_from([1, b"x", ""])),
    ttl=mostly(good_ttl, seconds_like),
    priority=mostly(st.integers(MIN_PRIORITY, MAX_PRIORITY), st.one_of(huge_ints, st.sampled_from([True, 1.5]))),
)
@example(name="catalogue", holder=None, ttl=30, priority=0)
@example(name="😀" * 200, holder="Ǆ", ttl=None, priority=MAX_PRIORITY)
def test_rwlock_names_round_trip_exactly(name: Any, holder: Any, ttl: Any, priority: Any) -> None:
    delete_everything()
    bad = bad_arguments(
        {
            "name": text_ok(name, 200),
            "holder": holder_ok(holder),
            "ttl": seconds_ok(ttl, allow_none=True),
            "priority": priority_ok(priority),
        }
    )
    tally("rwlock(name).read/write(holder, ttl, priority)", not bad)
    if bad:
        with refused_any(bad):
            rwlock(name).read(holder=holder, ttl=ttl, priority=priority, auto_renew=False)
        with refused_any(bad):
            rwlock(name).write(holder=holder, ttl=ttl, priority=priority, auto_renew=False)
        return
    if ttl is not None and ttl < 5:
        ttl = 5  # accepted; a grant of a fraction of a second may be gone before it is read
    readers = [rwlock(name).read(holder=holder, ttl=ttl, priority=priority, auto_renew=False) for _ in range(2)]
    assert {r.resource.name for r in readers} == {name}
    with pytest.raises(LockHeld):
        rwlock(name).write(ttl=5, auto_renew=False)
    # Another case, padding or normalisation is another rwlock: free to write while this one is read.
    for other in variants(name):
        if text_ok(other, 200):
            assert rwlock(other).write(ttl=5, auto_renew=False).release() is True
    for reader in readers:
        reader.release()
    writer = rwlock(name).write(holder=holder, ttl=ttl, auto_renew=False)
    assert writer.resource.name == name and writer.fence > max(r.fence for r in readers)
    assert writer.release() is True
