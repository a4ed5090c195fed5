"""Dispenser: put, assign (own first), done/fail/release of live claims only, fences, recreate."""

from __future__ import annotations

import time
from typing import Any

import pytest

from resource_lease import Dispenser, LeaseError, WorkItem
from resource_lease.db.dispenser import NEXT_INDEX
from resource_lease.db.operations import ops
from resource_lease.models import DispenserItem

pytestmark = pytest.mark.django_db(transaction=True)


def states(d: Dispenser) -> dict[str, str]:
    return {item.key: item.state for item in d.items()}


def test_put_counts_new_keys_and_leaves_existing_ones() -> None:
    d = Dispenser("put")
    assert d.put({"a": {"n": 1}, "b": None}) == 2
    assert d.put({"a": {"n": 2}, "c": [1, 2]}) == 1
    assert d.put(["d", "e"]) == 2
    payloads = {i.key: i.payload for i in d.items()}
    assert payloads == {"a": {"n": 1}, "b": None, "c": [1, 2], "d": None, "e": None}
    assert d.counts() == {"pending": 5, "assigned": 0, "done": 0, "failed": 0}


def test_assign_hands_out_each_item_once_oldest_first() -> None:
    d = Dispenser("assign")
    d.put({f"k{i}": i for i in range(5)})
    first = d.assign("w1", limit=2)
    second = d.assign("w2", limit=2)
    assert [i.key for i in first] == ["k0", "k1"]
    assert [i.key for i in second] == ["k2", "k3"]
    assert [i.payload for i in first] == [0, 1]
    assert all(i.attempts == 1 and i.fence == 1 for i in first + second)
    assert d.counts() == {"pending": 1, "assigned": 4, "done": 0, "failed": 0}


def test_assign_returns_own_unfinished_items_first_and_tops_up() -> None:
    d = Dispenser("own")
    d.put([f"k{i}" for i in range(6)])
    mine = d.assign("w1", limit=2)
    again = d.assign("w1", limit=3)
    assert [i.key for i in again] == ["k0", "k1", "k2"]
    assert [i.fence for i in again[:2]] == [f + 1 for f in (i.fence for i in mine)], "a new claim, a new fence"
    assert [i.attempts for i in again] == [1, 1, 1], "a renewed live claim is the same attempt"


def test_surplus_own_items_go_back_to_the_pool() -> None:
    d = Dispenser("surplus")
    d.put([f"k{i}" for i in range(4)])
    d.assign("w1", limit=4)
    kept = d.assign("w1", limit=1)
    assert [i.key for i in kept] == ["k0"]
    assert d.counts()["pending"] == 3
    assert [i.key for i in d.assign("w2", limit=5)] == ["k1", "k2", "k3"]
    assert all(i.attempts == 1 for i in d.assign("w2", limit=5)), "a surplus given back is not an attempt"


def test_done_counts_only_live_claims_of_that_worker() -> None:
    d = Dispenser("done", ttl=1)
    d.put(["a", "b", "c"])
    items = d.assign("w1", limit=2)
    assert d.done("w2", ["a"]) == 0, "another worker's claim"
    assert d.done("w1", ["c"]) == 0, "never claimed"
    assert d.done("w1", [items[0]], result={"ok": True}) == 1
    assert d.done("w1", [items[0]]) == 0, "already done"
    time.sleep(1.3)
    assert d.done("w1", [items[1]]) == 0, "the claim expired"
    row = DispenserItem.objects.get(dispenser="done", key="a")
    assert (row.state, row.result, row.worker) == ("done", {"ok": True}, "w1")


def test_a_former_self_with_an_old_fence_is_refused() -> None:
    d = Dispenser("fence")
    d.put(["a"])
    old = d.assign("w1")
    new = d.assign("w1")  # the same name, restarted: the same item, claimed afresh
    assert new[0].key == "a" and new[0].fence > old[0].fence
    assert d.done("w1", old) == 0
    assert d.fail("w1", old, "stale") == 0
    assert d.release("w1", old) == 0
    assert d.done("w1", new) == 1


def test_paused_worker_cannot_overwrite_the_new_owner() -> None:
    d = Dispenser("paused", ttl=1)
    d.put(["a"])
    stale = d.assign("slow")
    time.sleep(1.3)
    fresh = d.assign("fast")
    assert [i.key for i in fresh] == ["a"] and fresh[0].fence == stale[0].fence + 1
    assert d.done("slow", ["a"]) == 0 and d.done("slow", stale) == 0
    assert d.fail("fast", fresh, "502") == 1
    row = DispenserItem.objects.get(dispenser="paused", key="a")
    assert (row.state, row.error, row.attempts) == ("pending", "502", 2), "the expired claim counted as an attempt"


def test_fail_requeues_until_max_attempts_then_fails() -> None:
    d = Dispenser("fail", max_attempts=2)
    d.put(["a"])
    assert d.fail("w", d.assign("w"), "first") == 1
    assert d.counts()["pending"] == 1
    assert d.fail("w", d.assign("w"), "second") == 1
    assert d.counts() == {"pending": 0, "assigned": 0, "done": 0, "failed": 1}
    assert d.assign("w") == []
    row = DispenserItem.objects.get(dispenser="fail", key="a")
    assert (row.state, row.error, row.attempts) == ("failed", "second", 2)


def test_expired_claims_use_up_attempts() -> None:
    d = Dispenser("expire", ttl=1, max_attempts=2)
    d.put(["a"])
    d.assign("w1")
    time.sleep(1.2)
    assert d.counts()["pending"] == 1
    assert [i.attempts for i in d.assign("w2")] == [2]
    time.sleep(1.2)
    assert d.counts()["failed"] == 1, "the second expired claim used up the attempts"
    assert d.assign("w3") == []
    assert d.assign("w2") == [], "not even to its own worker"
    row = DispenserItem.objects.get(dispenser="expire", key="a")
    assert row.state == "failed" and "expired" in row.error


def test_restarted_worker_resumes_its_expired_items_first() -> None:
    d = Dispenser("resume", ttl=1)
    d.put(["a", "b", "c"])
    d.assign("w1", limit=2)
    time.sleep(1.2)
    back = d.assign("w1", limit=2)
    assert [i.key for i in back] == ["a", "b"]
    assert [i.attempts for i in back] == [2, 2], "the expired claim counted"


def test_release_gives_live_claims_back_without_an_attempt() -> None:
    d = Dispenser("release")
    d.put(["a", "b"])
    items = d.assign("w1", limit=2)
    assert d.release("w1", items[1:]) == 1
    assert d.release("w2") == 0
    assert d.release("w1") == 1
    assert d.counts()["pending"] == 2
    assert [i.attempts for i in d.assign("w3", limit=2)] == [1, 1]


def test_check_is_true_for_exactly_the_workers_live_claims() -> None:
    d = Dispenser("check")
    d.put(["a", "b", "c"])
    items = d.assign("w1", limit=2)
    assert d.check("w1", ["a", "b"]) and d.check("w1", ["b", "a"])
    assert not d.check("w1", ["a"]) and not d.check("w1", ["a", "b", "c"])
    assert d.check("w1", items)
    assert not d.check("w1", [WorkItem("a", None, 1, items[0].fence + 1), items[1]])
    d.done("w1", items[:1])
    assert d.check("w1", ["b"])


def test_recreate_replaces_the_pending_pool_and_keeps_assigned_items() -> None:
    d = Dispenser("recreate", max_attempts=1)
    d.put({"pending-old": 1, "assigned": 2, "done": 3, "failed": 4})
    got = {i.key: i for i in d.assign("w", limit=10)}
    d.done("w", [got["done"]])
    d.fail("w", [got["failed"]], "x")
    d.release("w", [got["pending-old"]])
    counts = d.recreate({"assigned": 20, "done": 30, "failed": 40, "new": 50})
    assert counts == {"added": 1, "requeued": 2, "removed": 1}
    rows = {i.key: (i.state, i.payload, i.attempts) for i in d.items()}
    assert rows == {
        "assigned": ("assigned", 2, 1),
        "done": ("pending", 30, 0),
        "failed": ("pending", 40, 0),
        "new": ("pending", 50, 0),
    }
    assert d.done("w", [got["assigned"]]) == 1, "an assigned key stays with its worker"


def test_pattern_matches_whole_keys() -> None:
    d = Dispenser("pattern")
    d.put(["a-cut", "b-cut-x", "c", "d-cut"])
    assert [i.key for i in d.assign("w", limit=5, pattern=r".*-cut")] == ["a-cut", "d-cut"]


def test_keys_and_names_compare_exactly() -> None:
    """MariaDB's default collation would make these equal; the dispenser's columns must not."""
    d = Dispenser("exact")
    assert d.put(["a", "A ", "A", "a "]) == 4
    assert Dispenser("Exact").put(["a"]) == 1
    assert Dispenser("exact ").put(["a"]) == 1
    items = d.assign("w", limit=1)
    assert items[0].key == "a"
    assert d.done("W", items) == 0 and d.done("w ", items) == 0
    assert d.done("w", ["A "]) == 0
    assert d.done("w", items) == 1
    assert states(d) == {"a": "done", "A ": "pending", "A": "pending", "a ": "pending"}


def test_other_dispensers_are_untouched() -> None:
    one, two = Dispenser("one"), Dispenser("two")
    one.put(["a"])
    two.put(["a"])
    assert [i.dispenser for i in one.assign("w")] == ["one"]
    assert two.counts()["pending"] == 1
    assert two.done("w", ["a"]) == 0


BAD: list[tuple[str, Any, str]] = [
    ("name", lambda: Dispenser(""), "name"),
    ("name", lambda: Dispenser("x" * 201), "name"),
    ("name", lambda: Dispenser("a\x00b"), "name"),
    ("ttl", lambda: Dispenser("d", ttl=0), "ttl"),
    ("ttl", lambda: Dispenser("d", ttl=float("nan")), "ttl"),
    ("max_attempts", lambda: Dispenser("d", max_attempts=0), "max_attempts"),
    ("max_attempts", lambda: Dispenser("d", max_attempts=True), "max_attempts"),
    ("using", lambda: Dispenser("d", using="nope"), "using"),
    ("items", lambda: Dispenser("d").put("abc"), "items"),
    ("items", lambda: Dispenser("d").put(["ok", ""]), "items key"),
    ("items", lambda: Dispenser("d").put(["ok", "k" * 256]), "items key"),
    ("items", lambda: Dispenser("d").put({"ok": 1, "bad": object()}), "items['bad']"),
    ("items", lambda: Dispenser("d").put({"ok": 1, "nan": float("nan")}), "items['nan']"),
    ("items", lambda: Dispenser("d").put(["ok", 3]), "items key"),
    ("worker", lambda: Dispenser("d").assign(""), "worker"),
    ("limit", lambda: Dispenser("d").assign("w", limit=0), "limit"),
    ("pattern", lambda: Dispenser("d").assign("w", pattern="("), "pattern"),
    ("keys", lambda: Dispenser("d").done("w", ["a", "a"]), "keys"),
    ("keys", lambda: Dispenser("d").done("w", ["a", WorkItem("b", None, 1)]), "keys"),
    ("result", lambda: Dispenser("d").done("w", ["a"], result={1, 2}), "result"),
    ("error", lambda: Dispenser("d").fail("w", ["a"], error=502), "error"),
    ("mapping", lambda: Dispenser("d").recreate({"": 1}), "mapping key"),
]


@pytest.mark.parametrize(("what", "call", "named"), BAD, ids=[f"{w}-{i}" for i, (w, _, _) in enumerate(BAD)])
def test_bad_input_is_a_value_error_naming_it_and_writes_nothing(what: str, call: Any, named: str) -> None:
    with pytest.raises(ValueError, match=named.replace("[", r"\[").replace("]", r"\]")):
        call()
    assert not DispenserItem.objects.exists()
    assert issubclass(ValueError, Exception) and not issubclass(ValueError, LeaseError)


def test_the_claim_statement_reads_the_index_not_the_table(vendor: str) -> None:
    """The whole claim UPDATE (pick and write) is planned on the (dispenser, state,
    expires_at, id) index and the primary key: no scan of the table, no sort."""
    d = Dispenser("plan")
    d.put([f"k{i}" for i in range(3000)])
    Dispenser("other").put([f"k{i}" for i in range(3000)])
    plan = ops(d.using).items.explain_claim("plan")
    print(plan)
    assert NEXT_INDEX in plan
    if vendor == "postgresql":
        assert "Seq Scan" not in plan and "Sort" not in plan
    elif vendor == "mysql":
        on_table = [line for line in plan.splitlines() if "<derived" not in line]  # the 10 picked ids
        assert on_table and all("'type': 'ALL'" not in line for line in on_table) and "filesort" not in plan
    else:
        assert "TEMP B-TREE" not in plan and "SCAN resource_lease_dispenseritem" not in plan


def test_own_items_come_first_even_when_newer() -> None:
    # A ttl long enough for one assign of four statements on a loaded machine (with 1 s, in CI,
    # "mine" ran out between its reclaim and the read-back that answers the assign).
    d = Dispenser("order", ttl=2)
    d.put(["old-1", "old-2"])
    d.assign("other", limit=2)  # the oldest items go to another worker...
    d.put(["mine"])
    assert [i.key for i in d.assign("me", limit=1)] == ["mine"]
    time.sleep(2.1)  # ...which dies: its items are free again, and older than mine
    assert [i.key for i in d.assign("me", limit=3)] == ["mine", "old-1", "old-2"]
