"""Named locks, semaphores and @synchronized, on the real database (kills and pauses of a lock
holder are in tests/faults/test_locks.py)."""

from __future__ import annotations

import datetime as dt
import math
import pickle
import subprocess
import threading
import time
from pathlib import Path

import pytest

import resource_lease
from resource_lease import (
    Lease,
    LeaseError,
    LeaseLost,
    LockHeld,
    NoResourceAvailable,
    lock,
    named,
    semaphore,
    synchronized,
)
from resource_lease.models import Resource
from resource_lease.pool import database_now, force_release
from resource_lease.recipes import locks as locks_module
from resource_lease.recipes.locks import LOCK_KIND, semaphore_kind, slot_name
from tests import ledger
from tests.ledger import check
from tests.procs.exclusion import at_least

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _forget_created_rows():
    # Each test starts on an empty table: the process's hint of rows it created is stale.
    named._known.clear()


RACERS = 8


def row(name: str) -> Resource:
    return Resource.objects.get(kind=LOCK_KIND, name=name)


# -- the lock ----------------------------------------------------------------------------


def test_lock_returns_the_lease_class_of_acquire_with_a_fence_that_goes_up_per_name() -> None:
    first = lock("rebuild-index", ttl=30, auto_renew=False)
    assert type(first) is Lease
    assert first.fence == 1 and first.resource.kind == LOCK_KIND and first.resource.name == "rebuild-index"
    other = lock("another", ttl=30, auto_renew=False)
    assert other.fence == 1  # per name
    assert first.release() and other.release()
    with lock("rebuild-index", ttl=30) as second:
        assert second.fence == 2
        assert second.is_held()
        second.check()
        assert second.expires_at > database_now()
        second.renew()
        with second.fenced():
            pass
    assert not second.is_held()
    assert row("rebuild-index").grant_token == ""  # released on exit
    assert lock("rebuild-index", ttl=30, auto_renew=False).fence == 3


def test_held_lock_raises_lock_held_naming_holder_and_database_expiry() -> None:
    held = lock("busy", ttl=30, holder="host-a:1:main", auto_renew=False)
    before = time.monotonic()
    with pytest.raises(LockHeld) as info:
        lock("busy", ttl=30, timeout=0, holder="host-b:2:main")
    assert time.monotonic() - before < 5  # one attempt, no waiting
    error = info.value
    assert isinstance(error, NoResourceAvailable) and isinstance(error, LeaseError)
    assert error.holder == "host-a:1:main"
    assert error.expires_at == row("busy").busy_before == held.expires_at
    assert "host-a:1:main" in str(error)
    assert f"{held.expires_at:%Y-%m-%d %H:%M:%S}" in str(error) and "database clock" in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.holder, copy.expires_at, str(copy)) == (error.holder, error.expires_at, str(error))
    held.release()


def test_not_reentrant_the_same_process_waits_like_anyone_else() -> None:
    held = lock("once", ttl=30, auto_renew=False)
    with pytest.raises(LockHeld):
        lock("once", timeout=0)
    with pytest.raises(LockHeld):
        lock("once", timeout=0, holder=held.holder)  # even under the same holder id
    held.release()


def test_timeout_zero_makes_one_attempt(monkeypatch) -> None:
    held = lock("one-try", ttl=30, auto_renew=False)
    attempts = []
    real = named.try_grant

    def counting(*args, **kwargs):
        attempts.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(named, "try_grant", counting)
    with pytest.raises(LockHeld):
        lock("one-try", timeout=0)
    assert len(attempts) == 1
    held.release()


def test_timeout_waits_for_an_expiry_and_gives_up_after_it() -> None:
    short = lock("waits", ttl=1.0, auto_renew=False)
    started = time.monotonic()
    taken = lock("waits", ttl=30, timeout=15, auto_renew=False)
    assert time.monotonic() - started > 0.3
    assert taken.fence == short.fence + 1
    assert taken.resource.took_over and taken.resource.previous_holder == short.holder
    assert not short.release()  # expired and taken: the late release changes nothing
    assert taken.is_held()
    started = time.monotonic()
    with pytest.raises(LockHeld, match="waited 1.5s"):
        lock("waits", timeout=1.5)
    assert 1.0 < time.monotonic() - started < 10
    taken.release()


def test_timeout_none_waits_until_the_holder_releases() -> None:
    held = lock("forever", ttl=30, auto_renew=False)
    threading.Timer(1.0, held.release).start()
    started = time.monotonic()
    taken = lock("forever", timeout=None, auto_renew=False)
    assert time.monotonic() - started >= 0.9
    assert taken.fence == 2
    taken.release()


def test_auto_renew_keeps_the_lock_past_its_ttl_and_on_lost_is_loud() -> None:
    lost = threading.Event()
    lease = lock("renewed", ttl=1.0, on_lost=lambda _lease: lost.set())
    time.sleep(2.0)
    assert lease.is_held() and lease.expires_at > database_now()
    force_release(Resource.objects.filter(kind=LOCK_KIND, name="renewed"))
    assert lost.wait(5), "the renewal did not notice the force release"
    with pytest.raises(LeaseLost):
        lease.check()
    assert not lease.release()


def test_a_lock_row_deleted_by_an_operator_is_made_again() -> None:
    lock("deleted", ttl=30, auto_renew=False).release()
    Resource.objects.filter(kind=LOCK_KIND, name="deleted").delete()
    again = lock("deleted", ttl=30, auto_renew=False)
    assert again.fence == 1
    again.release()


def test_a_lock_row_deleted_by_an_operator_is_granted_at_once_to_a_waiter() -> None:
    # Deleted while held: the holder's release finds nothing of its own, and a waiter with a
    # long timeout is granted the row made again at once (not after its timeout).
    held = lock("deleted-while-held", ttl=30, auto_renew=False)
    Resource.objects.filter(kind=LOCK_KIND, name="deleted-while-held").delete()
    started = time.monotonic()
    again = lock("deleted-while-held", ttl=30, timeout=60, auto_renew=False)
    assert time.monotonic() - started < 10
    assert again.fence == 1 and again.is_held()
    assert not held.release()
    assert again.release()


def test_brand_new_lock_name_used_by_8_processes_at_once_has_one_winner(spawn_worker, tmp_path: Path) -> None:
    go = tmp_path / "go"
    procs = [
        spawn_worker("tests.procs.lock_race", "--name", "brand-new", "--go", str(go), stdout=subprocess.PIPE)
        for _ in range(RACERS)
    ]
    for proc in procs:  # every racer has set Django up and connected: start them together
        assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
    go.touch()
    outcomes = [proc.communicate(timeout=60)[0].strip() for proc in procs]
    assert not [o for o in outcomes if o.startswith("ERROR")], outcomes
    granted = [o for o in outcomes if o.startswith("GRANTED")]
    assert granted == ["GRANTED 1"], outcomes
    winner = row("brand-new").holder
    assert sorted(o for o in outcomes if o.startswith("HELD")) == [f"HELD {winner}"] * (RACERS - 1), outcomes
    assert Resource.objects.filter(kind=LOCK_KIND, name="brand-new").count() == 1


# -- exclusion across processes, with its negative control ---------------------------------


def handed_back(directory: Path) -> int:
    """Grants the workers of a ledger race were handed and gave back unused (``exclusion``)."""
    return sum(int(path.read_text()) for path in directory.glob("handed-back-*.count"))


def ledger_race(spawn_worker, tmp_path: Path, *extra: str, workers: int, seconds: float) -> list[subprocess.Popen]:
    # Each worker records its share of the 10 grants the checks need, however slowly it started.
    args = ["--dir", str(tmp_path), "--seconds", str(seconds), *at_least(10, workers), *extra]
    procs = [spawn_worker("tests.procs.exclusion", *args) for _ in range(workers)]
    for proc in procs:
        assert proc.wait(timeout=seconds + 150) == 0
    return procs


def test_lock_excludes_across_processes_with_fences_strictly_increasing(spawn_worker, tmp_path: Path) -> None:
    ledger_race(spawn_worker, tmp_path, "--lock", "ledger", workers=5, seconds=3.0)
    verdict = check(tmp_path)
    print(f"lock exclusion: {verdict.summary()}")
    assert verdict.grants >= 10, "too few grants for the check to mean anything"
    assert verdict.violations == 0, verdict.summary()
    # Every grant recorded, none lost or doubled (or handed to a waiter and given back unused).
    assert row("ledger").fence == verdict.grants + handed_back(tmp_path)


def test_negative_control_a_check_then_update_lock_is_caught(spawn_worker, tmp_path: Path) -> None:
    """The same ledger must fail a lock that looks and then writes unconditionally. Whether
    two workers interleave between the look and the write in three seconds depends on the
    machine's scheduling (on a loaded machine each runs alone for long stretches): up to three
    runs, each judged on its own."""
    for run in range(3):
        directory = tmp_path / f"run{run}"
        directory.mkdir()
        ledger_race(spawn_worker, directory, "--lock", f"broken-{run}", "--naive", workers=5, seconds=3.0)
        verdict = check(directory)
        print(f"negative control, run {run + 1}: {verdict.summary()}")
        assert verdict.grants >= 10
        if verdict.violations > 0:
            return
    raise AssertionError("the ledger did not notice a broken lock in three runs")


def max_concurrent(directory: Path) -> int:
    """The most grants (of any slot) whose recorded intervals overlap at one instant."""
    edges = []
    for grant in ledger.read(directory):
        edges += [(grant.start, 1), (grant.end, -1)]
    edges.sort(key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
    current = peak = 0
    for _, step in edges:
        current += step
        peak = max(peak, current)
    return peak


def test_semaphore_never_has_more_holders_than_slots(spawn_worker, tmp_path: Path) -> None:
    ledger_race(spawn_worker, tmp_path, "--lock", "exports", "--slots", "3", "--hold", "0.05", workers=5, seconds=3.0)
    verdict = check(tmp_path)
    peak = max_concurrent(tmp_path)
    print(f"semaphore: {verdict.summary()} peak_holders={peak}")
    assert verdict.grants >= 10
    assert verdict.violations == 0, verdict.summary()  # per slot: exclusion, fences, counters
    assert 2 <= peak <= 3, peak
    slots = Resource.objects.filter(kind=semaphore_kind("exports"))
    assert sorted(slots.values_list("name", flat=True)) == ["0000", "0001", "0002"]
    assert sum(slots.values_list("fence", flat=True)) == verdict.grants + handed_back(tmp_path)


# -- semaphores ----------------------------------------------------------------------------


def test_semaphore_grants_its_slots_then_names_the_holder_that_frees_first() -> None:
    a = semaphore("sem", 3, ttl=60, holder="a", auto_renew=False)
    b = semaphore("sem", 3, ttl=20, holder="b", auto_renew=False)
    c = semaphore("sem", 3, ttl=40, holder="c", auto_renew=False)
    assert type(a) is Lease
    assert sorted(lease.resource.name for lease in (a, b, c)) == ["0000", "0001", "0002"]
    assert {lease.fence for lease in (a, b, c)} == {1}  # fences are per slot
    with pytest.raises(LockHeld) as info:
        semaphore("sem", 3, timeout=0, holder="d")
    assert info.value.holder == "b" and info.value.expires_at == b.expires_at
    assert "'b'" in str(info.value) and "all 3 slots" in str(info.value)
    freed = b.resource.name
    assert b.release()
    again = semaphore("sem", 3, ttl=30, holder="d", auto_renew=False)
    assert again.resource.name == freed and again.fence == 2
    for lease in (a, c, again):
        lease.release()


def test_shrinking_a_semaphore_retires_the_slots_above_once_released() -> None:
    held = [semaphore("shrink", 3, ttl=30, holder=f"h{i}", auto_renew=False) for i in range(3)]
    by_slot = {lease.resource.name: lease for lease in held}
    with pytest.raises(LockHeld):
        semaphore("shrink", 2, timeout=0)  # now 2 slots, both held
    top = by_slot[slot_name(2)]
    top.renew()  # the holder of a retired slot keeps it until it lets go
    assert top.is_held()
    assert top.release()
    with pytest.raises(LockHeld):
        semaphore("shrink", 2, timeout=0)  # the freed slot 2 is not granted again
    assert not Resource.objects.get(kind=semaphore_kind("shrink"), name=slot_name(2)).enabled
    by_slot[slot_name(0)].release()
    replacement = semaphore("shrink", 2, ttl=30, auto_renew=False)
    assert replacement.resource.name == slot_name(0)
    replacement.release()
    by_slot[slot_name(1)].release()


def test_growing_a_semaphore_adds_slots_and_brings_retired_ones_back() -> None:
    for lease in [semaphore("grow", 2, ttl=30, auto_renew=False) for _ in range(2)]:
        lease.release()
    semaphore("grow", 1, ttl=30, auto_renew=False).release()  # retire slot 1
    assert list(Resource.objects.filter(kind=semaphore_kind("grow"), enabled=True).values_list("name", flat=True)) == [
        "0000"
    ]
    leases = [semaphore("grow", 4, ttl=30, auto_renew=False) for _ in range(4)]
    assert sorted(lease.resource.name for lease in leases) == [slot_name(i) for i in range(4)]
    with pytest.raises(LockHeld):
        semaphore("grow", 4, timeout=0)
    for lease in leases:
        lease.release()


# -- @synchronized ---------------------------------------------------------------------------


def test_synchronized_formats_the_key_from_positional_named_and_default_arguments() -> None:
    seen = []

    @synchronized("dispenser:{worker}:{0}:{limit}", ttl=30)
    def assign(worker, limit=10):
        seen.append(Resource.objects.filter(kind=LOCK_KIND).exclude(grant_token="").get().name)
        return worker

    assert assign("w1") == "w1"
    assert assign(limit=3, worker="w2") == "w2"
    assert seen == ["dispenser:w1:w1:10", "dispenser:w2:w2:3"]
    assert not Resource.objects.filter(kind=LOCK_KIND).exclude(grant_token="").exists()  # released


def test_synchronized_methods_can_name_attributes_of_self() -> None:
    class Dispenser:
        name = "recommend"

        @synchronized("{self.name}:{worker}")
        def assign(self, worker):
            return Resource.objects.filter(kind=LOCK_KIND).exclude(grant_token="").get().name

    assert Dispenser().assign("w1") == "recommend:w1"


def test_synchronized_raises_lock_held_when_the_key_is_held() -> None:
    calls = []

    @synchronized("job:{0}", timeout=0)
    def job(n):
        calls.append(n)

    held = lock("job:7", ttl=30, holder="someone-else", auto_renew=False)
    with pytest.raises(LockHeld, match="someone-else"):
        job(7)
    job(8)  # another key is free
    assert calls == [8]
    held.release()
    job(7)
    assert calls == [8, 7]


def test_synchronized_renews_while_the_function_runs() -> None:
    @synchronized("slow", ttl=1.0)
    def slow():
        time.sleep(2.5)
        snapshot = named.read("default", LOCK_KIND, ["slow"])
        return snapshot.live("slow")

    live = slow()
    assert live is not None and live.fence == 1  # still ours, the one grant, past 2 ttls


def test_synchronized_releases_only_its_own_grant_and_reports_the_loss() -> None:
    taken: list[Lease] = []

    @synchronized("stolen", ttl=30)
    def work():
        force_release(Resource.objects.filter(kind=LOCK_KIND, name="stolen"))
        taken.append(lock("stolen", ttl=30, holder="the-next-one", auto_renew=False))
        time.sleep(0.2)

    with pytest.raises(LeaseLost):
        work()
    assert row("stolen").holder == "the-next-one" and taken[0].is_held()  # untouched
    taken[0].release()


# -- bad input -----------------------------------------------------------------------------

BAD_LOCK_CALLS = [
    ("name", lambda: lock("")),
    ("name", lambda: lock(None)),
    ("name", lambda: lock("x" * 201)),
    ("name", lambda: lock("a\x00b")),
    ("ttl", lambda: lock("n", ttl=0)),
    ("ttl", lambda: lock("n", ttl=-1)),
    ("ttl", lambda: lock("n", ttl=math.nan)),
    ("ttl", lambda: lock("n", ttl=math.inf)),
    ("ttl", lambda: lock("n", ttl=True)),
    ("ttl", lambda: lock("n", ttl="30")),
    ("timeout", lambda: lock("n", timeout=-1)),
    ("timeout", lambda: lock("n", timeout=math.nan)),
    ("holder", lambda: lock("n", holder="")),
    ("holder", lambda: lock("n", holder="h" * 256)),
    ("using", lambda: lock("n", using="nope")),
    ("auto_renew", lambda: lock("n", auto_renew="yes")),
    ("on_lost", lambda: lock("n", on_lost=3)),
    ("name", lambda: semaphore("", 3)),
    ("slots", lambda: semaphore("s", 0)),
    ("slots", lambda: semaphore("s", 1001)),
    ("slots", lambda: semaphore("s", True)),
    ("slots", lambda: semaphore("s", 2.0)),
    ("slots", lambda: semaphore("s", "3")),
    ("ttl", lambda: semaphore("s", 3, ttl=0)),
    ("timeout", lambda: semaphore("s", 3, timeout=-0.5)),
    ("key", lambda: synchronized("")),
    ("key", lambda: synchronized("{missing}")(lambda worker: None)),
    ("key", lambda: synchronized("{2}")(lambda a, b: None)),
    ("key", lambda: synchronized("{unclosed")),
    ("ttl", lambda: synchronized("k", ttl=0)),
    ("timeout", lambda: synchronized("k", timeout=-1)),
    ("using", lambda: synchronized("k", using="nope")),
    ("key", lambda: synchronized("{0}")(lambda name: None)("x" * 201)),
    ("key", lambda: synchronized("{0}")(lambda name: None)("")),
]


@pytest.mark.parametrize(("argument", "call"), BAD_LOCK_CALLS)
def test_bad_input_is_a_value_error_naming_the_argument_and_writes_nothing(argument, call) -> None:
    with pytest.raises(ValueError, match=argument):
        call()
    assert not Resource.objects.exists()


def test_exported_from_the_package() -> None:
    for name in ("lock", "semaphore", "synchronized", "LockHeld"):
        assert name in resource_lease.__all__
        assert getattr(resource_lease, name) is getattr(locks_module, name)


def test_lock_held_expiry_is_aware_database_time() -> None:
    held = lock("aware", ttl=30, auto_renew=False)
    with pytest.raises(LockHeld) as info:
        lock("aware")
    assert info.value.expires_at.tzinfo is not None
    assert info.value.expires_at - database_now() > dt.timedelta(seconds=20)
    held.release()
