"""The line of waiters, with real processes: served in the order they asked (priority first),
a releaser asking again goes behind, ``timeout=0`` never takes what a waiter waits for, a
killed or paused waiter is skipped after its ttl, and the negative control (grants that
ignore the line) is caught overtaking waiters (tests/line_checks.py)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from resource_lease import acquire, lock, pool
from resource_lease.exceptions import LockHeld, NoResourceAvailable
from resource_lease.models import Resource, Waiter
from resource_lease.recipes.locks import LOCK_KIND
from tests import line_checks
from tests.line_waiting import WAIT, Waiting, wait_for_places, waiting_fixture  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def line_args(what: str, *extra: str) -> tuple[str, ...]:
    return ("--what", what, "--once", *extra)


@pytest.mark.parametrize("family", ["lock", "pool"])
def test_waiters_are_served_in_the_order_they_asked_higher_priority_first(
    family: str, make_pool: Callable[..., Any], waiting: Callable[..., Waiting]
) -> None:
    if family == "lock":
        what, kind, name = "lock:in-order", LOCK_KIND, "in-order"
        held = lock("in-order", ttl=300, timeout=0)
    else:
        make_pool("in-order", 1)
        what, kind, name = "pool:in-order", "in-order", ""
        held = acquire("in-order", ttl=300)
    priorities = [0, 2, 1, 2, 0]
    waiters = []
    for i, priority in enumerate(priorities):
        waiters.append(waiting(*line_args(what, "--priority", str(priority), "--hold", "0.05")))
        wait_for_places(kind, name, i + 1)
    assert held.release()
    granted = [(w.next("granted"), i) for i, w in enumerate(waiters)]
    key = "fence" if family == "lock" else "acquired_at"
    served = [i for _, i in sorted(granted, key=lambda pair: pair[0][key])]
    # Priority 2 first (in the order they asked), then 1, then 0.
    assert served == [1, 3, 2, 0, 4]
    assert Waiter.objects.filter(kind=kind, name=name).count() == 0  # every place left the line


@pytest.mark.parametrize("serial", [False, True], ids=["room", "negative-control"])
def test_a_pools_line_serves_as_many_waiters_at_once_as_it_has_free_rows(
    serial: bool, make_pool: Callable[..., Any], waiting: Callable[..., Waiting]
) -> None:
    """Two rows held, three waiters in line, the first one paused (SIGSTOP: its place stays
    live for its ttl). Both rows are given back: the second waiter is served at once, a row
    of its own, without waiting for the first; the other free row stays the first waiter's
    (a newcomer with ``timeout=0`` is refused it, and so is the third waiter), and the first
    waiter takes it once resumed. The negative control (``--serial``: the line serves its
    head only, one row at a time, as the engine did at first) leaves the second waiter
    waiting behind the paused head."""
    make_pool("room", 2)
    held = [acquire("room", ttl=300), acquire("room", ttl=300)]
    extra = ("--serial",) if serial else ()
    first = waiting(*line_args("pool:room", "--ttl", "60", *extra))
    wait_for_places("room", "", 1)
    second = waiting(*line_args("pool:room", "--hold", "3", *extra))
    wait_for_places("room", "", 2)
    third = waiting(*line_args("pool:room", *extra))
    wait_for_places("room", "", 3)
    first.kill(signal.SIGSTOP)
    try:
        for lease in held:
            assert lease.release()
        if serial:
            with pytest.raises(AssertionError, match="within"):
                second.next("granted", timeout=3.0)
            return
        served = second.next("granted")
        with pytest.raises(NoResourceAvailable):
            acquire("room", ttl=30, timeout=0)  # the other free row is the paused waiter's
        with pytest.raises(AssertionError, match="within"):
            third.next("granted", timeout=1.0)  # ... and not the third's, behind it
    finally:
        first.kill(signal.SIGCONT)
    resumed = first.next("granted")
    assert resumed["row"] != served["row"]
    assert third.next("granted")["row"] in {resumed["row"], served["row"]}  # once one is given back


def test_a_releaser_asking_again_goes_behind_the_waiters(waiting: Callable[..., Waiting]) -> None:
    held = lock("behind", ttl=300, timeout=0)
    w = waiting(*line_args("lock:behind", "--hold", "0.5"))
    wait_for_places(LOCK_KIND, "behind", 1)
    assert held.release()
    with pytest.raises(LockHeld):  # free, but someone waits for it: a newcomer never takes it
        lock("behind", ttl=30, timeout=0)
    again = lock("behind", ttl=30, timeout=WAIT)  # in line, behind the waiter
    first = w.next("granted")
    assert first["fence"] < again.fence
    again.release()


def test_timeout_zero_never_takes_a_row_a_waiter_waits_for(
    make_pool: Callable[..., Any], waiting: Callable[..., Waiting]
) -> None:
    make_pool("waited-for", 1)
    held = acquire("waited-for", ttl=300)
    w = waiting(*line_args("pool:waited-for", "--hold", "0.5"))
    wait_for_places("waited-for", "", 1)
    # Freed by an operator: no release of ours, no wake-up; the waiter sees it at its next look.
    pool.force_release(Resource.objects.filter(pk=held.resource.pk))
    with pytest.raises(NoResourceAvailable):
        acquire("waited-for", ttl=30, timeout=0)
    assert w.next("granted")["row"] == held.resource.pk


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "paused"])
def test_a_waiter_that_dies_or_is_paused_is_skipped_after_its_ttl(sig: int, waiting: Callable[..., Waiting]) -> None:
    held = lock("skipped", ttl=300, timeout=0)
    gone = waiting(*line_args("lock:skipped", "--ttl", "1.5", "--hold", "0.1"))
    wait_for_places(LOCK_KIND, "skipped", 1)
    next_ = waiting(*line_args("lock:skipped", "--hold", "2"))
    wait_for_places(LOCK_KIND, "skipped", 2)
    gone.kill(sig)
    assert held.release()
    served = next_.next("granted")  # once the first waiter's place expired: it no longer blocks
    if sig == signal.SIGSTOP:
        # Resumed, it finds its place lost and takes a new one, at the back: served after.
        gone.kill(signal.SIGCONT)
        late = gone.next("granted")
        assert late["fence"] > served["fence"]
        assert len(late["places"]) >= 2  # it went to the back of the line
    assert Waiter.objects.filter(kind=LOCK_KIND, name="skipped").count() <= 1


def contend(family: str, broken: bool, waiting: Callable[..., Waiting]) -> list[line_checks.Acquisition]:
    """Four processes ask, hold 10 ms, release and ask again at once for three seconds."""
    what = "lock:contended" if family == "lock" else "pool:contended"
    args = ["--what", what, "--seconds", "3", "--hold", "0.01", *(["--broken"] if broken else [])]
    workers = [waiting(*args) for _ in range(4)]
    histories = {f"w{i}": w.next("history", timeout=WAIT)["acquisitions"] for i, w in enumerate(workers)}
    grants = line_checks.acquisitions(histories, by_fence=family == "lock")
    counts = line_checks.counts(grants)
    print(
        f"line-contention {family} broken={broken} grants={len(grants)}"
        f" overtakes={len(line_checks.overtakes(grants))} jain={line_checks.jain(list(counts.values())):.3f}"
        f" worst_wait={line_checks.worst_wait(grants):.3f}"
    )
    return grants


@pytest.mark.parametrize("family", ["lock", "pool"])
def test_under_contention_nobody_is_overtaken(
    family: str, make_pool: Callable[..., Any], waiting: Callable[..., Waiting]
) -> None:
    if family == "pool":
        make_pool("contended", 2)
    grants = contend(family, False, waiting)
    overtaken = line_checks.overtakes(grants)
    assert not overtaken, line_checks.describe(overtaken[:3])
    assert len(line_checks.counts(grants)) == 4  # everyone was served


@pytest.mark.parametrize("broken", [False, True], ids=["line", "negative-control"])
@pytest.mark.parametrize("family", ["lock", "pool"])
def test_a_newcomer_never_overtakes_a_waiter_and_grants_ignoring_the_line_are_caught(
    family: str, broken: bool, make_pool: Callable[..., Any], waiting: Callable[..., Waiting]
) -> None:
    """The negative control of the checks above, by a scenario whose outcome does not depend on
    the machine's timing: a waiter is in line and paused (SIGSTOP: its place stays live for its
    ttl), the row is released, and a newcomer in another process asks with ``timeout=0``. The
    line keeps the row for the waiter: the newcomer is refused. With grants that ignore the
    line (``--broken``, as the engine was before it, in both processes: the waiter takes no
    hand-off, or PostgreSQL's release would hand it the row) the newcomer takes the row, and the same
    checker as the contention test (``line_checks.overtakes``) catches the overtake. (Under
    contention whether a releaser asking again beats the woken waiter depends on the
    scheduler: on a loaded machine it loses every time, and a check blind by timing proves
    nothing.)"""
    if family == "lock":
        what, kind, name = "lock:paused-for", LOCK_KIND, "paused-for"
        held = lock("paused-for", ttl=300, timeout=0)
    else:
        make_pool("paused-for", 1)
        what, kind, name = "pool:paused-for", "paused-for", ""
        held = acquire("paused-for", ttl=300)
    waiter = waiting(*line_args(what, *(["--broken"] if broken else [])))
    waiter.next("entered")  # in line, and its place noted (the checker's "entered")
    wait_for_places(kind, name, 1)
    waiter.kill(signal.SIGSTOP)
    try:
        assert held.release()
        newcomer = waiting(*line_args(what, "--timeout", "0", *(["--broken"] if broken else [])))
        outcome = newcomer.next("granted", "refused")
    finally:
        waiter.kill(signal.SIGCONT)
    histories = {"waiter": [waiter.next("granted")]}
    if outcome["event"] == "granted":
        histories["newcomer"] = [outcome]
    overtaken = line_checks.overtakes(line_checks.acquisitions(histories, by_fence=family == "lock"))
    if broken:
        assert overtaken, f"a newcomer ignoring the line was not caught: {outcome}"
    else:
        assert outcome["event"] == "refused" and not overtaken, (outcome, overtaken)


@pytest.mark.parametrize("stale", [False, True], ids=["marks", "negative-control"])
def test_a_waiter_marks_its_line_again_once_its_processs_last_mark_has_run_out(
    stale: bool, make_pool: Callable[..., Any], waiting: Callable[..., Waiting]
) -> None:
    """A process that marked its line a moment ago takes its next place without marking it
    again, and a newcomer of that process that will wait goes straight to its place
    (``line.fresh_mark``, ``line.marked_now``): fewer statements per hand-off. Its memory must
    not outlive the marks. A waiter (ttl 1.5 s: marks last 3 s) waits once, is served, and
    waits again 4 s later, when its first marks have run out; paused in line, the row is
    released and a newcomer asks with ``timeout=0``. Marked again, the line keeps the row
    for the waiter; trusting the old marks (``--stale-marks``) leaves the row unmarked, and
    the newcomer's first try takes it over the waiter's head."""
    make_pool("remarked", 1)
    held = acquire("remarked", ttl=300)
    extra = ("--ttl", "1.5", "--again-after", "4", *(["--stale-marks"] if stale else []))
    waiter = waiting(*line_args("pool:remarked", *extra))
    waiter.next("entered")
    wait_for_places("remarked", "", 1)
    assert held.release()
    waiter.next("granted")  # and released at once; 4 s later it asks again
    # Taken back without waiting in line: a place of this process's would mark the row itself
    # (for two of its 300 s ttls), and the control's unmarked line would go unseen.
    deadline = time.monotonic() + WAIT
    while True:
        try:
            held = acquire("remarked", ttl=300, timeout=0)
            break
        except NoResourceAvailable:
            assert time.monotonic() < deadline, "the waiter never gave the row back"
            time.sleep(0.02)
    waiter.next("entered")
    wait_for_places("remarked", "", 1)
    waiter.kill(signal.SIGSTOP)
    try:
        assert held.release()
        try:
            newcomer = acquire("remarked", ttl=300, timeout=0)
        except NoResourceAvailable:
            newcomer = None
    finally:
        waiter.kill(signal.SIGCONT)
    if newcomer is not None:
        newcomer.release()
    second = waiter.next("granted")
    print(f"line-remark stale={stale} newcomer_granted={newcomer is not None} waiter_fence={second['fence']}")
    if stale:
        assert newcomer is not None, "the waiter's place without marks did not let the newcomer in: not caught"
    else:
        assert newcomer is None, f"the newcomer took the row over a waiter's head: fence {newcomer.fence}"
