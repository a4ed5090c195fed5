"""Group membership: the same view for every member, partitions by rendezvous hashing, and
members that die or pause dropping out (and a paused one coming back by itself)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections import Counter
from typing import Any

import pytest

from resource_lease import Group, MemberTaken
from resource_lease.models import Resource
from resource_lease.pool import force_release
from resource_lease.recipes.groups import rendezvous_owner
from tests.reports import Reports

pytestmark = pytest.mark.django_db(transaction=True)

TTL = 2.0
POLL = 0.3
KEYS = 300


def start_members(spawn_worker: Any, group: str, names: list[str], *extra: str, **env: str) -> dict[str, Reports]:
    from tests.conftest import worker_env

    procs = {}
    for i, name in enumerate(names):
        environment = worker_env(PYTHONHASHSEED=str(i + 1), **env)
        proc = spawn_worker(
            "tests.procs.group_member",
            "--group",
            group,
            "--member",
            name,
            "--ttl",
            str(TTL),
            "--poll",
            str(POLL),
            *extra,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=environment,
        )
        procs[name] = Reports(proc)
    for reports in procs.values():
        reports.next("joined")
    return procs


def views(procs: dict[str, Reports], n: int) -> dict[str, dict[str, Any]]:
    for reports in procs.values():
        reports.send(f"view {n} {KEYS}")
    return {name: reports.next("view") for name, reports in procs.items()}


def assert_exact_partition(seen: dict[str, dict[str, Any]]) -> None:
    counts = Counter(key for view in seen.values() for key in view["owned"])
    twice = sorted(k for k, c in counts.items() if c > 1)
    missing = sorted(set(range(KEYS)) - set(counts))
    assert not twice and not missing, f"owned twice: {twice[:10]}..., by nobody: {missing[:10]}..."


def wait_for_watch(reports: Reports, members: list[str], timeout: float) -> float:
    """Seconds until this member's watch reported exactly ``members``."""
    started = time.monotonic()
    while True:
        event = reports.next("watch", timeout=max(0.1, timeout - (time.monotonic() - started)))
        if event["members"] == members:
            return time.monotonic() - started


# -- one process ---------------------------------------------------------------------


def test_join_members_index_data_and_leave() -> None:
    a = Group("g", ttl=30, member="a", data={"ip": "10.0.0.1"})
    b = Group("g", ttl=30, member="b")
    assert a.members() == [] and a.index() == -1 and a.size() == 0 and not a.owns("k")
    a.join()
    b.join()
    assert a.members() == b.members() == ["a", "b"]
    assert (a.index(), b.index()) == (0, 1) and a.size() == 2
    assert a.members(with_data=True) == {"a": {"ip": "10.0.0.1"}, "b": {}}
    assert sorted(a.owned(range(50)) + b.owned(range(50))) == list(range(50))
    assert a.leave() and not a.leave()
    assert b.members() == ["b"] and a.index() == -1 and b.index() == 0
    assert b.owned(range(50)) == list(range(50))
    with Group("g", ttl=30, member="c") as c:
        assert c.members() == ["b", "c"]
    assert b.members() == ["b"]
    b.leave()


def test_a_second_live_claimant_of_a_member_name_is_refused_naming_the_holder() -> None:
    first = Group("g", ttl=30, member="same").join()
    with pytest.raises(MemberTaken, match="'same'") as caught:
        Group("g", ttl=30, member="same").join()
    assert caught.value.member == "same" and caught.value.holder == first.holder
    assert first.holder in str(caught.value)
    first.leave()
    Group("g", ttl=30, member="same").join().leave()  # free again


def test_rendezvous_moves_only_the_keys_of_members_who_came_or_went() -> None:
    before = ["a", "b", "c", "d"]
    owners = {k: rendezvous_owner(k, before) for k in range(2000)}
    assert set(owners.values()) == set(before)
    after = [m for m in before if m != "c"] + ["e"]
    for key, owner in owners.items():
        new = rendezvous_owner(key, after)
        if owner != "c":
            assert new in (owner, "e"), key  # a survivor's key only ever goes to the newcomer
        else:
            assert new != "c"
    assert rendezvous_owner("x", []) is None
    assert rendezvous_owner(b"x", ["a", "b"]) == rendezvous_owner("x", ["b", "a"])


def test_watch_reports_changes_in_this_process() -> None:
    seen: list[list[str]] = []
    observer = Group("w", ttl=30, member="observer")
    observer.watch(seen.append, poll=0.1)
    member = Group("w", ttl=30, member="m").join()
    deadline = time.monotonic() + 10
    while ["m"] not in seen and time.monotonic() < deadline:
        time.sleep(0.05)
    member.leave()
    while [] not in seen and time.monotonic() < deadline:
        time.sleep(0.05)
    observer.leave()
    assert seen[:2] == [["m"], []], seen


def test_a_member_whose_name_was_taken_while_it_was_out_says_so_and_joins_when_it_is_free() -> None:
    warnings: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("resource_lease").addHandler(handler)
    a = Group("taken", ttl=3, member="x").join()
    try:
        for _ in range(5):  # a's keeper may win the freed row back first: try again
            force_release(Resource.objects.filter(kind="@group:taken", name="x"))
            try:
                b = Group("taken", ttl=30, member="x").join()
                break
            except MemberTaken:
                time.sleep(0.5)
        else:
            pytest.fail("could not take the kicked member's name")
        deadline = time.monotonic() + 20
        while not any("is held by" in w for w in warnings):  # a's renewal refused, keeper finds b
            assert time.monotonic() < deadline, warnings
            time.sleep(0.1)
        assert a.index() == -1 and b.index() == 0 and a.members() == ["x"]
        b.leave()
        while a.index() != 0:  # free again: a joins by itself
            assert time.monotonic() < deadline + 20
            time.sleep(0.1)
    finally:
        logging.getLogger("resource_lease").removeHandler(handler)
        a.leave()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": ""}, "name must be a non-empty string"),
        ({"name": "x" * 201}, "name must be at most 200"),
        ({"name": "a\x00b"}, "name must not contain NUL"),
        ({"name": "g", "ttl": 0}, "ttl must be > 0"),
        ({"name": "g", "ttl": float("nan")}, "ttl must be finite"),
        ({"name": "g", "member": ""}, "member must be a non-empty string"),
        ({"name": "g", "data": [1]}, "data must be a dict"),
        ({"name": "g", "data": {"x": object()}}, "data must be JSON-serializable"),
        ({"name": "g", "using": "nope"}, "using must name a database"),
    ],
)
def test_bad_input_is_a_value_error_naming_the_argument_and_writes_nothing(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Group(**kwargs).join()
    assert not Resource.objects.exists()


def test_bad_calls_are_value_errors() -> None:
    group = Group("g", ttl=30, member="a")
    with pytest.raises(ValueError, match="key must be a str, bytes or int"):
        group.owns(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="callback must be callable"):
        group.watch(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="poll must be > 0"):
        group.watch(print, poll=0)
    with pytest.raises(ValueError, match="timeout must be"):
        group.join(timeout=-1)
    assert not Resource.objects.exists()


# -- real processes --------------------------------------------------------------------


def test_members_agree_and_partition_exactly_and_survivors_keep_their_keys(spawn_worker: Any) -> None:
    names = ["m-a", "m-b", "m-c", "m-d"]
    procs = start_members(spawn_worker, "part", names)
    seen = views(procs, 4)
    for view in seen.values():
        assert view["members"] == names
    assert sorted(v["index"] for v in seen.values()) == [0, 1, 2, 3]
    assert seen["m-a"]["data"]["m-c"] == {"pid": "m-c"}
    assert_exact_partition(seen)

    procs.pop("m-c").send("leave")
    after = views(procs, 3)
    assert_exact_partition(after)
    for name, view in after.items():
        assert set(seen[name]["owned"]) <= set(view["owned"]), f"{name} lost keys it owned"
        gained = set(view["owned"]) - set(seen[name]["owned"])
        assert gained <= set(seen["m-c"]["owned"]), f"{name} took keys from a survivor"
    for reports in procs.values():
        reports.send("leave")
        reports.next("left")


def test_negative_control_python_hash_is_salted_per_process(spawn_worker: Any) -> None:
    """The same partition check catches ownership by Python's hash(), salted per process."""
    procs = start_members(spawn_worker, "salted", ["m-a", "m-b", "m-c"], "--salted-hash")
    seen = views(procs, 3)
    with pytest.raises(AssertionError, match="owned twice|by nobody"):
        assert_exact_partition(seen)


def test_a_killed_member_drops_out_and_a_paused_one_comes_back_by_itself(spawn_worker: Any) -> None:
    names = ["m-a", "m-b", "m-c"]
    procs = start_members(spawn_worker, "faults", names)
    assert all(v["members"] == names for v in views(procs, 3).values())
    limit = TTL + POLL + 10  # generous for a loaded machine

    # SIGKILL: gone from every other member's view within ttl + poll (+ slack).
    killed = procs.pop("m-c")
    killed.proc.send_signal(signal.SIGKILL)
    dropped = [wait_for_watch(r, ["m-a", "m-b"], limit) for r in procs.values()]
    print(f"killed member dropped out of the others' views after {max(dropped):.2f}s (ttl {TTL}s, poll {POLL}s)")

    # SIGSTOP past the ttl: it drops out; SIGCONT: it joins again by itself.
    paused = procs["m-b"]
    os.kill(paused.proc.pid, signal.SIGSTOP)
    try:
        wait_for_watch(procs["m-a"], ["m-a"], limit)
    finally:
        os.kill(paused.proc.pid, signal.SIGCONT)
    wait_for_watch(procs["m-a"], ["m-a", "m-b"], limit)
    seen = views(procs, 2)
    assert seen["m-b"]["index"] == 1 and seen["m-a"]["index"] == 0
    assert_exact_partition(seen)
    for reports in procs.values():
        reports.send("leave")
        reports.next("left")


# -- a join that fails holds nothing (issue 37, point 5) -------------------------------------


def deep_data(depth: int = 32) -> dict[str, Any]:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return {"d": value}


def join_that_fails(monkeypatch: pytest.MonkeyPatch) -> tuple[type[BaseException], dict[str, Any]]:
    """A join whose data write fails after the grant: on MariaDB for real (data nested
    deeper than its JSON holds, the JSON rule taken out); elsewhere a write that raises."""
    from django.db import connection

    from resource_lease import validation
    from resource_lease.exceptions import LeaseDatabaseError

    if connection.vendor == "mysql":
        monkeypatch.setattr(validation, "check_json_value", lambda value, name: None)
        return LeaseDatabaseError, deep_data()

    def failing_write(self: Group, lease: Any) -> bool:
        raise LeaseDatabaseError("the data write failed (injected)")

    monkeypatch.setattr(Group, "_write_data", failing_write)
    return LeaseDatabaseError, {"d": 1}


def test_a_join_that_raises_leaves_no_member_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    error, data = join_that_fails(monkeypatch)
    group = Group("ghosts", member="m1", ttl=30, data=data)
    with pytest.raises(error):
        group.join()
    assert Group("ghosts").members() == []  # not for the ttl (30 s): at once
    monkeypatch.undo()
    with Group("ghosts", member="m1", ttl=30) as again:  # the name is free for anyone
        assert again.members() == ["m1"]


def test_control_without_the_give_back_the_failed_join_is_a_ghost(monkeypatch: pytest.MonkeyPatch) -> None:
    from resource_lease import named

    error, data = join_that_fails(monkeypatch)
    monkeypatch.setattr(named.KeptRow, "_gained", lambda self, lease: self._on_gained(lease))
    group = Group("ghosts", member="m1", ttl=30, data=data)
    with pytest.raises(error):
        group.join()
    assert Group("ghosts").members() == ["m1"]  # held by nobody, counted for 30 s
    force_release(Resource.objects.filter(kind__endswith="ghosts"))
