"""DoubleBarrier: one frozen cohort for everyone inside, crashes that do not block leave(),
timeouts that leave nothing behind, and rounds reused by name."""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from typing import Any

import pytest

from resource_lease import BarrierTimeout, DoubleBarrier, LeaseError, named
from resource_lease.models import Resource
from resource_lease.recipes.barrier import CONTROL_KIND, barriers, read_state
from tests.reports import Reports

pytestmark = pytest.mark.django_db(transaction=True)

TTL = 2.0
USERS = 200


def start(spawn_worker: Any, barrier: str, member: str, *extra: str, size: int = 3) -> Reports:
    proc = spawn_worker(
        "tests.procs.barrier_member",
        "--barrier",
        barrier,
        "--size",
        str(size),
        "--member",
        member,
        "--ttl",
        str(TTL),
        "--users",
        str(USERS),
        *extra,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    return Reports(proc)


def exactly_once(entered: list[dict[str, Any]]) -> None:
    counts = Counter(u for e in entered for u in e["share"])
    twice = sorted(u for u, c in counts.items() if c > 1)
    missing = sorted(set(range(USERS)) - set(counts))
    assert not twice and not missing, f"computed twice: {twice[:10]}, never: {missing[:10]}"


def live_rows(barrier: str) -> list[str]:
    return named.read("default", f"@barrier:{barrier}").live_names()


# -- one process -----------------------------------------------------------------------


def test_size_one_opens_at_once_and_is_reusable() -> None:
    barrier = DoubleBarrier("solo", 1, ttl=30, member="me")
    assert barrier.enter(timeout=10) == ["me"]
    assert (barrier.index, barrier.size, barrier.round) == (0, 1, 1)
    with pytest.raises(LeaseError, match="already inside"):
        barrier.enter(timeout=0)
    barrier.leave(timeout=10)
    assert barrier.enter(timeout=10) == ["me"] and barrier.round == 2
    barrier.leave(timeout=10)
    with pytest.raises(LeaseError, match="not inside"):
        barrier.leave()
    assert live_rows("solo") == []


def test_a_timeout_withdraws_the_member_and_leaves_nothing_behind() -> None:
    barrier = DoubleBarrier("lonely", 3, ttl=30, member="me")
    started = time.monotonic()
    with pytest.raises(BarrierTimeout, match="withdrew"):
        barrier.enter(timeout=0.5)
    assert time.monotonic() - started < 20
    assert live_rows("lonely") == []
    assert not Resource.objects.filter(kind=CONTROL_KIND, grant_token__gt="").exists()
    assert read_state("default", "lonely").get("cohort") in (None, [])
    # and the name is usable again
    with pytest.raises(BarrierTimeout):
        barrier.enter(timeout=0)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("", 3), {}, "name must be a non-empty string"),
        (("b", 0), {}, "size must be an integer >= 1"),
        (("b", True), {}, "size must be an integer >= 1"),
        (("b", 2.0), {}, "size must be an integer >= 1"),
        (("b", 2), {"ttl": -1}, "ttl must be > 0"),
        (("b", 2), {"member": "x" * 201}, "member must be at most 200"),
        (("b", 2), {"using": "nope"}, "using must name a database"),
    ],
)
def test_bad_input_is_a_value_error_naming_the_argument_and_writes_nothing(
    args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        DoubleBarrier(*args, **kwargs).enter(timeout=0)
    with pytest.raises(ValueError, match="timeout must be"):
        DoubleBarrier("b", 2).enter(timeout=-1)
    assert not Resource.objects.exists()


# -- real processes --------------------------------------------------------------------


def test_three_processes_share_one_cohort_and_compute_every_user_once_over_two_rounds(spawn_worker: Any) -> None:
    members = [start(spawn_worker, "recs", f"w-{i}", "--rounds", "2", "--timeout", "120") for i in range(3)]
    for round_ in (1, 2):
        inside = [m.next("inside") for m in members]
        assert {e["round"] for e in inside} == {round_}
        assert all(e["cohort"] == ["w-0", "w-1", "w-2"] and e["size"] == 3 for e in inside)
        assert sorted(e["index"] for e in inside) == [0, 1, 2]
        exactly_once([m.next("entered") for m in members])
        for m in members:
            m.next("left")
    assert live_rows("recs") == []
    assert barriers()[0]["round"] == 2


def test_a_member_killed_inside_does_not_block_the_others_leave(spawn_worker: Any) -> None:
    members = [start(spawn_worker, "crash", f"w-{i}", "--timeout", "120", "--hold", "1") for i in range(3)]
    for m in members:
        m.next("inside")
    members[2].proc.send_signal(signal.SIGKILL)
    started = time.monotonic()
    for m in members[:2]:
        m.next("left", timeout=TTL + 30)
    print(f"the others' leave() completed {time.monotonic() - started:.2f}s after the kill (ttl {TTL}s)")


def test_an_early_arrival_waits_for_the_next_round(spawn_worker: Any) -> None:
    first = [start(spawn_worker, "rounds", f"a-{i}", "--timeout", "120", "--wait-go") for i in range(3)]
    for m in first:
        m.next("inside")
    early = start(spawn_worker, "rounds", "b-0", "--timeout", "120")
    deadline = time.monotonic() + 60
    while "b-0" not in live_rows("rounds"):  # it is waiting at the barrier now
        assert time.monotonic() < deadline and early.proc.poll() is None
        time.sleep(0.1)
    time.sleep(1.0)
    assert not early.all("inside"), "an early arrival joined the cohort that was inside"
    assert barriers()[0]["waiting"] == ["b-0"] and barriers()[0]["inside"] == ["a-0", "a-1", "a-2"]
    for m in first:
        m.send("go")
    for m in first:
        m.next("left")
    later = [start(spawn_worker, "rounds", f"b-{i}", "--timeout", "120") for i in (1, 2)]
    inside = [m.next("inside") for m in [early, *later]]
    assert all(e["round"] == 2 and e["cohort"] == ["b-0", "b-1", "b-2"] for e in inside)
    exactly_once([m.next("entered") for m in [early, *later]])


def _staggered_round(spawn_worker: Any, barrier: str, *extra: str) -> list[dict[str, Any]]:
    """Three members inside; one computes its share at once, then a fourth arrives and waits,
    then the two others compute theirs."""
    members = [start(spawn_worker, barrier, f"w-{i}", "--timeout", "120", "--wait-go", *extra) for i in range(3)]
    inside = [m.next("inside") for m in members]
    first = next(m for m, e in zip(members, inside, strict=True) if e["index"] == 1)
    first.send("go")
    entered = [first.next("entered")]
    start(spawn_worker, barrier, "w-3", "--timeout", "120", *extra)
    deadline = time.monotonic() + 60
    while "w-3" not in live_rows(barrier):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    for m in members:
        if m is not first:
            m.send("go")
            entered.append(m.next("entered"))
    return entered


def test_the_frozen_cohort_keeps_index_and_size_while_others_arrive(spawn_worker: Any) -> None:
    exactly_once(_staggered_round(spawn_worker, "frozen"))


def test_negative_control_an_unfrozen_view_is_caught(spawn_worker: Any) -> None:
    """Each member computing index/size from its own live read of who is in the barrier (the
    ZooKeeper version's view) computes some users twice or never, and the same check catches it."""
    entered = _staggered_round(spawn_worker, "unfrozen", "--unfrozen")
    with pytest.raises(AssertionError, match="computed twice|never"):
        exactly_once(entered)


def test_a_member_paused_inside_past_its_ttl_still_computes_only_its_frozen_share(spawn_worker: Any) -> None:
    """The fault scenario: a member SIGSTOPped inside the barrier past its ttl. The others'
    leave() completes (it stops counting), and on SIGCONT it computes its share of the frozen
    cohort, not of whatever is live then: no user twice, none missed, within the cohort."""
    members = [start(spawn_worker, "paused", f"w-{i}", "--timeout", "120", "--wait-go") for i in range(3)]
    for m in members:
        m.next("inside")
    paused = members[1]
    paused.proc.send_signal(signal.SIGSTOP)
    try:
        for m in (members[0], members[2]):
            m.send("go")
        entered = [members[0].next("entered"), members[2].next("entered")]
        for m in (members[0], members[2]):
            m.next("left", timeout=TTL + 30)  # not blocked by the paused member
        assert "w-1" not in live_rows("paused")
        newcomers = [start(spawn_worker, "paused", f"n-{i}", "--timeout", "120", "--hold", "3") for i in range(3)]
        assert all(n.next("inside")["round"] == 2 for n in newcomers)  # a new round is inside now
    finally:
        paused.proc.send_signal(signal.SIGCONT)
    paused.send("go")
    late = paused.next("entered")
    assert late["round"] == 1 and late["size"] == 3
    exactly_once([*entered, late])
    paused.next("left", timeout=60)
