"""Election.observe / Election.watch: non-candidates follow every change of leadership.

- one process: the state now first, each term in order, ``None`` when nobody leads, the
  leadership log written before a leader is told, bad input, ``watch()`` with ``for`` and
  ``async for``, ``on_deposed``;
- real processes (``tests/procs/observe_proc.py``): 3 candidates campaign and resign in fast
  turnover, one is SIGSTOPped while leading (past its ttl), one SIGKILLed while leading, one
  SIGKILLs itself between a grant and writing its term down; 2 observer processes record
  what they are told. The check: fences strictly increase, every term a candidate acted on
  (its own ledger) is reported with its leader, the term of the winner that died unrecorded
  is reported too (the next winner wrote it down), and ``None`` is the last report once
  nobody leads. **Negative control:** an observer that polls the current leader with
  one-off reads is caught missing terms by the same check;
- PostgreSQL: an observer is woken by NOTIFY, well within its poll.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from resource_lease import Election
from resource_lease.models import LeadershipTerm
from tests.faults.harness import Child

pytestmark = pytest.mark.django_db(transaction=True)


class Seen:
    """What an observer's callback was called with, waited on."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, int]] = []
        self._cond = threading.Condition()

    def __call__(self, leader: str | None, fence: int) -> None:
        with self._cond:
            self.calls.append((leader, fence))
            self._cond.notify_all()

    def wait_for(self, call: tuple[str | None, int], timeout: float = 10.0) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: call in self.calls, timeout), f"no {call} in {self.calls}"


def test_observe_reports_the_state_now_then_every_term_in_order_and_none_when_nobody_leads() -> None:
    a = Election("obs", ttl=30, holder="a")
    b = Election("obs", ttl=30, holder="b")
    seen = Seen()
    handle = Election("obs").observe(seen, poll=0.05)
    try:
        seen.wait_for((None, 0))
        a.campaign(timeout=0)
        seen.wait_for(("a", 1))
        a.resign()
        seen.wait_for((None, 1))
        b.campaign(timeout=0)
        b.resign()
        a.campaign(timeout=0)  # b's whole term passes between two looks, or not: it is reported
        seen.wait_for(("a", 3))
    finally:
        handle.stop()
        a.resign()
    assert seen.calls[:3] == [(None, 0), ("a", 1), (None, 1)]
    assert [call for call in seen.calls[3:] if call[0] is not None] == [("b", 2), ("a", 3)]
    assert list(LeadershipTerm.objects.filter(election="obs").order_by("fence").values_list("fence", "leader")) == [
        (1, "a"),
        (2, "b"),
        (3, "a"),
    ]


def test_a_new_observer_starts_from_the_current_leader() -> None:
    a = Election("obs", ttl=30, holder="a")
    a.campaign(timeout=0)
    seen = Seen()
    handle = Election("obs").observe(seen, poll=0.05)
    try:
        seen.wait_for(("a", 1))
    finally:
        handle.stop()
        a.resign()
    assert seen.calls == [("a", 1)]


def test_terms_written_down_while_nobody_looked_are_reported_from_the_log_in_order() -> None:
    """Five terms between two looks of an observer that polls every 2 s (SQLite, MariaDB: no
    NOTIFY; PostgreSQL would be woken, so the terms are made faster than it reads)."""
    seen = Seen()
    handle = Election("busy").observe(seen, poll=2.0)
    try:
        seen.wait_for((None, 0))
        for i in range(5):
            e = Election("busy", ttl=30, holder=f"c{i}")
            e.campaign(timeout=0)
            e.resign()
        seen.wait_for((None, 5), timeout=15)
    finally:
        handle.stop()
    terms = [call for call in seen.calls if call[0] is not None]
    assert terms == [(f"c{i}", i + 1) for i in range(5)]


def test_more_terms_than_one_read_of_the_log_are_all_reported_in_order() -> None:
    """1200 terms between two looks (written straight into the log and the row here): the
    first look reads 1000 (db.terms.TERMS_READ), the next the rest, none skipped."""
    from django.utils import timezone

    from resource_lease.db.terms import TERMS_READ
    from resource_lease.models import Resource

    total = TERMS_READ + 200
    seen = Seen()
    handle = Election("many").observe(seen, poll=0.2)
    try:
        seen.wait_for((None, 0))
        LeadershipTerm.objects.bulk_create(
            LeadershipTerm(election="many", fence=f, leader=f"h{f}", recorded_at=timezone.now())
            for f in range(1, total + 1)
        )
        Resource.objects.update_or_create(
            kind="@election",
            name="many",
            defaults={"fence": total, "holder": f"h{total}", "previous_holder": f"h{total - 1}", "grant_token": ""},
        )
        seen.wait_for((None, total), timeout=30)
    finally:
        handle.stop()
    assert seen.calls == [(None, 0), *((f"h{f}", f) for f in range(1, total + 1)), (None, total)]


def test_a_grant_lost_before_its_term_is_written_down_is_given_back_and_never_announced(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from resource_lease.db.term_operations import TermOperations

    caplog.set_level(logging.INFO, logger="resource_lease")
    monkeypatch.setattr(TermOperations, "record_term", lambda self, *a, **k: False)
    elected: list[Any] = []
    a = Election("lost", ttl=30, holder="a")
    assert a._row.take() is None  # the grant was given back
    a.start(on_elected=elected.append)
    time.sleep(0.5)
    a.stop()
    deadline = time.monotonic() + 10  # a keeper step running at stop() gives its grant back after it
    while a.leader() is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    # Seen once in a long run on PostgreSQL (not reproduced in 13 runs under a CPU burner):
    # "a" still led 10 s after stop(). Should it fail again, say what the row and log held.
    assert elected == [] and a.leader() is None, (elected, a.record(), caplog.text[-3000:])


def test_on_deposed_is_on_revoked_by_another_name() -> None:
    elected: list[int] = []
    deposed: list[str] = []
    a = Election("hooks", ttl=30, holder="a")
    a.start(on_elected=lambda lease: elected.append(lease.fence), on_deposed=deposed.append)
    deadline = time.monotonic() + 10
    while not elected and time.monotonic() < deadline:
        time.sleep(0.02)
    a.stop()
    assert elected == [1] and deposed == ["resigned"]
    with pytest.raises(ValueError, match="on_deposed"):
        Election("hooks2").start(on_revoked=print, on_deposed=print)
    with pytest.raises(ValueError, match="on_deposed"):
        Election("hooks2").start(on_deposed="print")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: Election("e").observe(None), "callback"),  # type: ignore[arg-type]
        (lambda: Election("e").observe("print"), "callback"),  # type: ignore[arg-type]
        (lambda: Election("e").observe(print, poll=0), "poll"),
        (lambda: Election("e").observe(print, poll=float("nan")), "poll"),
        (lambda: Election("e").watch(poll=-1), "poll"),
    ],
)
def test_bad_input_is_refused_naming_the_argument(call: Callable[[], Any], argument: str) -> None:
    with pytest.raises(ValueError, match=rf"^{argument}\b"):
        call()


def test_watch_is_an_iterator_of_the_changes_that_ends_when_stopped() -> None:
    a = Election("feed", ttl=30, holder="a")
    with Election("feed").watch(poll=0.05) as feed:
        assert next(feed) == (None, 0)
        a.campaign(timeout=0)
        assert next(feed) == ("a", 1)
        a.resign()
        assert next(feed) == (None, 1)
    assert list(feed) == []


def test_watch_with_async_for_never_blocks_the_event_loop() -> None:
    """While ``async for`` waits for the next change (a campaign 0.3 s later), the event loop
    runs other tasks."""
    a = Election("afeed", ttl=30, holder="a")

    async def campaign_later() -> None:
        await asyncio.sleep(0.3)
        await a.acampaign(timeout=0)

    async def follow() -> tuple[list[tuple[str | None, int]], int]:
        got: list[tuple[str | None, int]] = []
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        campaign: asyncio.Task[None] | None = None
        waiting_ticks = before = 0
        async with Election("afeed").watch(poll=0.05) as feed:
            async for leader, fence in feed:
                got.append((leader, fence))
                if len(got) == 1:
                    before = ticks
                    campaign = asyncio.create_task(campaign_later())
                elif len(got) == 2:
                    waiting_ticks = ticks - before
                    assert campaign is not None
                    await campaign  # observers may hear of the term before its winner's campaign returns
                    await a.aresign()
                else:
                    break
        ticker.cancel()
        return got, waiting_ticks

    got, waiting_ticks = asyncio.run(asyncio.wait_for(follow(), 60))
    assert got == [(None, 0), ("a", 1), (None, 1)]
    assert waiting_ticks >= 5, f"the event loop ran {waiting_ticks} ticks of 10 ms in 0.3 s: it was blocked"


def test_postgresql_wakes_an_observer_at_once() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("NOTIFY is PostgreSQL's; elsewhere an observer polls")
    seen = Seen()
    handle = Election("fast").observe(seen, poll=5.0)
    try:
        seen.wait_for((None, 0))
        time.sleep(0.3)  # the LISTEN connection is up
        a = Election("fast", ttl=30, holder="a")
        lags = []
        for fence in (1, 2, 3):
            start = time.monotonic()
            a.campaign(timeout=0)
            seen.wait_for(("a", fence), timeout=10)
            lags.append(time.monotonic() - start)
            start = time.monotonic()
            a.resign()
            seen.wait_for((None, fence), timeout=10)
            lags.append(time.monotonic() - start)
    finally:
        handle.stop()
    print(f"observe on PostgreSQL, poll 5 s: woken in {[round(x * 1000) for x in lags]} ms")
    assert max(lags) < 2.5, lags


# -- processes: fast turnover, SIGSTOP, SIGKILL ------------------------------------------------------

TTL = 1.0
SECONDS = 8.0


@pytest.fixture
def start(spawn_worker: Callable[..., subprocess.Popen[str]]) -> Callable[..., Child]:
    def run(*args: Any) -> Child:
        proc = spawn_worker("tests.procs.observe_proc", *map(str, args), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        return Child(proc, f"observe_proc-{args[0]}")

    return run


def _run(
    start: Callable[..., Child], *, naive: bool
) -> tuple[list[list[dict[str, Any]]], dict[int, str], dict[int, str]]:
    observers = [start("observer", "--name", "race", "--poll", 0.2, *(["--naive"] if naive else [])) for _ in range(2)]
    for o in observers:
        o.wait_for("ready", timeout=60)
        o.wait_for("saw", timeout=30)
    stalled, killed, crashing = (
        start("candidate", "--name", "race", "--seconds", SECONDS, "--ttl", TTL, "--hold", 0.03),
        start("candidate", "--name", "race", "--seconds", SECONDS, "--ttl", TTL, "--hold", 0.03),
        start(
            "candidate", "--name", "race", "--seconds", SECONDS, "--ttl", TTL, "--hold", 0.03, "--die-unrecorded-at", 8
        ),
    )
    candidates = [stalled, killed, crashing]
    for c in candidates:
        c.wait_for("ready", timeout=60)
    time.sleep(1.5)
    stalled.wait_for("won", since=stalled.mark(), timeout=30)
    stalled.stop()  # paused while leading (most likely), past its ttl
    time.sleep(TTL * 2)
    stalled.cont()
    killed.wait_for("won", since=killed.mark(), timeout=30)
    killed.kill()  # killed while leading
    for c in (stalled, crashing):
        c.proc.wait(timeout=120)
    for o in observers:  # nobody leads once the candidates are gone
        o.wait_for("saw", timeout=TTL + 15, since=max(0, len(o.events) - 1), where=lambda e: e["leader"] is None)
    time.sleep(0.5)
    for o in observers:
        assert o.finish(timeout=30) == 0, o.tail()
    ledger = {e["fence"]: e["holder"] for c in candidates for e in c.of("won")}
    dying = {e["fence"]: e["holder"] for e in crashing.of("dying")}
    return [o.of("saw") for o in observers], ledger, dying


def _violations(saw: list[dict[str, Any]], ledger: dict[int, str], dying: dict[int, str]) -> list[str]:
    problems = []
    start = saw[0]["fence"]
    terms = [(e["fence"], e["leader"]) for e in saw if e["leader"] is not None]
    fences = [f for f, _ in terms]
    if fences != sorted(set(fences)):
        problems.append(f"fences not strictly increasing: {fences}")
    for before, after in zip(saw, saw[1:], strict=False):
        if after["fence"] < before["fence"]:
            problems.append(f"went back: {before} then {after}")
    reported = dict(terms)
    missing = sorted(f for f in ledger if f > start and f not in reported)
    if missing:
        problems.append(f"{len(missing)} of {len(ledger)} terms missing: {missing[:10]}")
    wrong = sorted(f for f in ledger if f in reported and reported[f] != ledger[f])
    if wrong:
        problems.append(f"terms with another leader: {[(f, ledger[f], reported[f]) for f in wrong[:5]]}")
    lost = sorted(f for f in dying if f > start and reported.get(f) != dying[f])
    if lost:
        problems.append(f"the term of a winner that died before writing it down was not reported: {lost}")
    if saw[-1]["leader"] is not None:
        problems.append(f"the last report is {saw[-1]}, not None, though nobody leads")
    return problems


def test_observers_in_other_processes_miss_no_term_under_fast_turnover_stop_and_kill(
    start: Callable[..., Child],
) -> None:
    reports, ledger, dying = _run(start, naive=False)
    assert len(ledger) >= 20, f"only {len(ledger)} terms: not a fast turnover"
    assert dying, "the crashing candidate never reached its fatal win"
    for saw in reports:
        problems = _violations(saw, ledger, dying)
        print(f"observer: {len(saw)} reports, {len(ledger)} terms in the ledger, problems: {problems}")
        assert not problems, problems


def test_negative_control_an_observer_polling_the_current_leader_misses_terms(start: Callable[..., Child]) -> None:
    reports, ledger, dying = _run(start, naive=True)
    problems = [p for saw in reports for p in _violations(saw, ledger, dying)]
    print(f"negative control: {len(ledger)} terms, problems: {problems[:2]}")
    assert any("missing" in p for p in problems), "the check did not notice an observer that misses terms"


def test_the_admin_lists_every_term_read_only(admin_client: Any) -> None:
    for holder in ("a", "b"):
        e = Election("admin-terms", ttl=30, holder=holder)
        e.campaign(timeout=0)
        e.resign()
    page = admin_client.get("/admin/resource_lease/leadershipterm/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "admin-terms" in text and ">a<" in text and ">b<" in text
    assert admin_client.get("/admin/resource_lease/leadershipterm/add/").status_code == 403
