"""Scenario 4: the database side fails under a holder (MariaDB and PostgreSQL; SQLite has no
server or connection to lose).

- its sessions are ended from the server (``KILL`` / ``pg_terminate_backend``);
- the server drops its sessions for idleness between renewals (``wait_timeout`` /
  ``idle_session_timeout`` shorter than the renew interval, set on its sessions only);
- a statement's answer is lost after the server committed it (a TCP proxy cuts the
  connection): an acquire is settled by reading the grant back by its token, and a release
  by retrying it;
- a grant's answer arrives after its lease expired (the proxy holds it back): not handed out;
- a leader's save is committed and its answer lost as its leadership ends: of unknown outcome,
  never "nothing written";
- the server is restarted under it (test_server_restart.py).

The holder reconnects (or reports the loss), and nobody else is granted the resource while
it still trusts its lease.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from resource_lease import Election, acquire
from resource_lease.conf import lease_settings
from resource_lease.db.connections import lease_connection
from resource_lease.exceptions import NoResourceAvailable
from resource_lease.models import Resource, Waiter
from resource_lease.pool import force_release
from tests.conftest import worker_env
from tests.faults.harness import Child, CutProxy, duration, end_session, rounds, spread
from tests.grants import Grant, exclusion_violations

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

RENEWER = "resource-lease-keeper"  # the thread that renews (resource_lease.keeper)


@pytest.fixture(autouse=True)
def _server_databases_only() -> None:
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no server: no session to kill, no connection to lose")


def _sessions(child: Child, thread: str, since: int = 0) -> list[dict[str, Any]]:
    return [e for e in child.events[since:] if e.get("ev") == "session" and e.get("thread") == thread]


def _contend(kind: str, ttl: float) -> Any:
    """One acquire attempt by this process: the lease, or None if the resource is held."""
    try:
        return acquire(kind, ttl=ttl, timeout=0)
    except NoResourceAvailable:
        return None


def test_sessions_killed_from_the_server_are_reopened(
    make_pool: Callable[..., list[Resource]], start_holder: Callable[..., Child], figures: Callable[..., Any]
) -> None:
    ttl = 3.0
    make_pool("killed-session", 1)
    a = start_holder("killed-session", ttl)
    got = a.wait_for("acquired")
    a.wait_for("renewed")
    n = rounds(3, 1 / 3)
    recoveries: list[float] = []
    stolen: list[Grant] = []
    for _ in range(n):
        session = _sessions(a, RENEWER)[-1]["session"]
        mark = a.mark()
        killed_at = time.monotonic()
        end_session(session)
        a.wait_for("session", since=mark, where=lambda e: e["thread"] == RENEWER, timeout=ttl + 30)
        renewed = a.wait_for("renewed", since=mark, timeout=ttl + 30)
        recoveries.append(renewed["t"] - killed_at)
        for _ in range(3):
            taken = _contend("killed-session", ttl)
            if taken is not None:
                stolen.append(Grant(taken.resource.pk, taken.fence, "contender", time.monotonic(), time.monotonic()))
                taken.release()
            time.sleep(0.2)
    # The main thread's session too: the release goes through on a new one.
    end_session(_sessions(a, "MainThread")[-1]["session"])
    time.sleep(0.2)
    released = a.command("release")
    lost = a.of("lost")
    grants = [Grant(got["pk"], got["fence"], "holder", got["t_recv"], released["result"]["t_sent"]), *stolen]
    violations = exclusion_violations(grants) + [f"lost: {e['reason']}" for e in lost]
    if released["result"]["released"] is not True:
        violations.append(f"release after its session was killed: {released}")
    figures(
        "4-session-killed",
        kills=n + 1,
        grants=len(grants),
        violations=len(violations),
        reconnects=len(_sessions(a, RENEWER)) - 1,
        lost=len(lost),
        ttl=ttl,
        **spread("recovery", recoveries),
    )
    assert not violations, violations


def test_sessions_dropped_for_idleness_between_renewals(
    make_pool: Callable[..., list[Resource]], start_holder: Callable[..., Child], figures: Callable[..., Any]
) -> None:
    """The server drops the engine's sessions after 1 s idle; the holder renews every 1.5 s
    (ttl 4.5), so every renewal finds its session gone."""
    ttl = 4.5
    make_pool("idle", 1)
    a = start_holder("idle", ttl, env={"FAULTS_WAIT_TIMEOUT": "1"})
    got = a.wait_for("acquired")
    seconds = duration(4.5)
    end = time.monotonic() + seconds
    stolen: list[Grant] = []
    while time.monotonic() < end:
        taken = _contend("idle", ttl)
        if taken is not None:
            stolen.append(Grant(taken.resource.pk, taken.fence, "contender", time.monotonic(), time.monotonic()))
            taken.release()
        time.sleep(0.5)
    renewals = [e for e in a.of("renewed") if e["thread"] == RENEWER]
    reconnects = len(_sessions(a, RENEWER)) - 1
    time.sleep(1.5)  # the main thread's session has idled out too
    released = a.command("release")
    time.sleep(1.5)
    # One attempt on a session the server has dropped: the statement never ran, so the
    # resource is free and must be granted, not reported as unavailable.
    again = a.command("acquire", 0)
    lost = a.of("lost")
    grants = [Grant(got["pk"], got["fence"], "holder", got["t_recv"], released["result"]["t_sent"]), *stolen]
    violations = exclusion_violations(grants) + [f"lost: {e['reason']}" for e in lost]
    if released["result"]["released"] is not True:
        violations.append(f"release on an idled-out session: {released}")
    if not again["ok"]:
        violations.append(f"acquire(timeout=0) on an idled-out session: {again}")
    else:
        a.command("release")
    figures(
        "4-wait-timeout",
        seconds=seconds,
        grants=len(grants) + again["ok"],
        violations=len(violations),
        renewals=len(renewals),
        reconnects=reconnects,
        lost=len(lost),
    )
    assert not violations, violations
    assert reconnects >= len(renewals) - 1, "the server did not drop the idle sessions: the fault was not injected"


# -- answers lost after the commit ------------------------------------------------------


@pytest.fixture
def proxy() -> Iterator[CutProxy]:
    settings = connection.settings_dict
    cut = CutProxy(settings["HOST"] or "127.0.0.1", int(settings["PORT"]))
    yield cut
    cut.close()


def _through(proxy: CutProxy) -> dict[str, str]:
    """Environment for a child whose connections go through the proxy."""
    settings = connection.settings_dict
    scheme = "mysql" if connection.vendor == "mysql" else "postgres"
    return {"DATABASE_URL": f"{scheme}://{settings['USER']}@127.0.0.1:{proxy.port}/unused"}


# The statements, recognised in the bytes the client sends.
# Any grant of a free row (the probe by primary key or the scan): both carry the grant's SET list.
ACQUIRE = {vendor: (b"UPDATE", b"previous_holder = holder") for vendor in ("mysql", "postgresql")}
# Every vendor's RELEASE (PostgreSQL's writes released_at by a CASE: it may hand the row on).
RELEASE = (b"UPDATE", b"released_at = ")


def _prepared_on_mariadb() -> bool:
    """Whether the children send the probe's grant and the release as the EXECUTE of a
    statement their session prepared (MariaDB, ``MySQLDialect.run_hot``): their text goes to
    the server once, in the PREPARE, whose answer is not the grant's."""
    return connection.vendor == "mysql" and connection.mysql_is_mariadb and bool(lease_settings.PREPARED_STATEMENTS)


def _grant_packet() -> tuple[bytes, ...]:
    """A grant's packet (a child's first grant is the probe's)."""
    return (b"EXECUTE rl_grant_",) if _prepared_on_mariadb() else ACQUIRE[connection.vendor]


def _release_packet() -> tuple[bytes, ...]:
    return (b"EXECUTE rl_release_",) if _prepared_on_mariadb() else RELEASE


@pytest.mark.parametrize("settle", [True, False], ids=["engine", "no-settle-control"])
def test_acquire_whose_answer_is_lost_is_settled_by_reading_back(
    settle: bool,
    proxy: CutProxy,
    make_pool: Callable[..., list[Resource]],
    start_holder: Callable[..., Child],
    figures: Callable[..., Any],
) -> None:
    """The server commits the grant, the connection dies before the answer arrives. The
    engine reads the grant back by its token and returns the lease; an engine that did not
    (the control) would report no resource while the row stays granted to nobody."""
    make_pool("unknown", 1)
    proxy.arm(*_grant_packet())
    env = _through(proxy) | ({} if settle else {"FAULTS_NO_SETTLE": "1"})
    a = start_holder("unknown", 30, auto_renew=False, timeout=0, env=env)
    proxy.cuts.get(timeout=60)
    row_after: Resource
    if settle:
        got = a.wait_for("acquired")
        row_after = Resource.objects.get()
        held = a.command("is_held")["result"]
        ok = got["fence"] == 1 and row_after.fence == 1 and row_after.holder == got["holder"] and held
        violations = [] if ok else [f"settled lease {got} / row {row_after.holder} {row_after.fence} / held {held}"]
        assert a.command("release")["result"]["released"]
    else:
        failed = a.wait_for("acquire_failed")
        row_after = Resource.objects.get()
        # The grant committed (fence 1, a live token) but nobody has the lease.
        violations = [f"the resource is lost to a grant nobody holds: {failed['error']}"]
        assert row_after.fence == 1 and row_after.grant_token
    figures(
        "4-lost-answer-acquire" + ("" if settle else "-control"),
        cuts=1,
        grants=1,
        violations=len(violations),
        fence=row_after.fence,
    )
    if settle:
        assert not violations, violations
    else:
        assert violations  # the control must show the resource lost


@pytest.mark.parametrize("engine", [True, False], ids=["engine", "hand-out-control"])
def test_a_grant_whose_answer_arrives_after_its_ttl_is_not_handed_out(
    engine: bool,
    proxy: CutProxy,
    make_pool: Callable[..., list[Resource]],
    start_holder: Callable[..., Child],
    figures: Callable[..., Any],
) -> None:
    """The server commits a grant of the pool's one row, and its answer is held back for
    longer than the ttl (as a paused Galera node finishes a grant when it resumes, or a
    stalled network delivers it). Meanwhile the lease expires by the database's clock and the
    row is granted again, with a higher fence. When the late answer arrives the engine must
    not hand the expired lease out (its caller would work under a fence lower than one already
    granted); the control, an engine that does, is caught (docs/pitfalls.md#late-answers)."""
    ttl = 1.0
    make_pool("late", 1)
    # Late by less than 4 s: MariaDB's probe reads a grant back when the answer came that
    # late (its clock estimate is off), and the read-back finds the row granted again.
    proxy.arm(*_grant_packet(), hold=ttl + 2.0)
    env = _through(proxy) | ({} if engine else {"FAULTS_HAND_OUT_LATE": "1"})
    late = start_holder("late", ttl, auto_renew=False, timeout=0, env=env)
    proxy.cuts.get(timeout=60)  # committed, its answer held back
    again = acquire("late", ttl=30, timeout=ttl + 10)  # granted once the first lease expired
    _judge_late_hand_out(late, again, "4-late-answer-acquire", engine, figures, grants=2)


def _judge_late_hand_out(
    late: Child, again: Any, name: str, engine: bool, figures: Callable[..., Any], grants: int
) -> None:
    """``late``'s acquire ends (handed out or refused) after ``again`` was granted the row
    again: a fence lower than again's handed out after it is a violation, and so is a
    touched row. The engine must have none and tell ``late`` no resource; the control some."""
    granted_again = time.monotonic()
    deadline = time.monotonic() + 30
    while not (late.of("acquired") or late.of("acquire_failed")) and time.monotonic() < deadline:
        time.sleep(0.05)
    handed_out = late.of("acquired")
    violations = [
        f"fence {got['fence']} handed out {got['t_recv'] - granted_again:.2f}s after fence {again.fence} was granted"
        for got in handed_out
        if got["fence"] < again.fence and got["t_recv"] > granted_again
    ]
    row = Resource.objects.get()
    if row.fence != again.fence or row.holder != again.holder:
        violations.append(f"the new holder's row was touched: {row.holder} fence {row.fence}")
    figures(
        name + ("" if engine else "-control"),
        grants=grants,
        violations=len(violations),
        handed_out=len(handed_out),
        fence=again.fence,
    )
    again.release()
    if engine:
        assert not violations, violations
        assert late.of("acquire_failed"), late.tail()  # told no resource, not left hanging
    else:
        assert violations, f"the control handed out nothing late: {late.tail()}"


def _until_in_line(kind: str, child: Child) -> None:
    """Wait until ``child`` has taken a place in the line of ``kind``."""
    deadline = time.monotonic() + 30
    while not Waiter.objects.filter(kind=kind).exists():
        assert time.monotonic() < deadline, f"the child never took a place in line: {child.tail()}"
        time.sleep(0.02)


@pytest.mark.parametrize("engine", [True, False], ids=["engine", "hand-out-control"])
def test_a_grant_held_up_leaving_the_line_past_its_ttl_is_not_handed_out(
    engine: bool,
    proxy: CutProxy,
    make_pool: Callable[..., list[Resource]],
    start_holder: Callable[..., Child],
    figures: Callable[..., Any],
) -> None:
    """A waiter in line is granted the pool's one row in time; then leaving its place (a
    statement too, after the grant) is held up past the ttl, as on a Galera node paused
    right after the grant. Meanwhile the lease expires and the row is granted again, with a
    higher fence. The engine must not hand the expired lease out when the wait ends (it
    gives it back and waits on); the control, an engine that does, is caught. Seen on
    Galera: a cycler's acquire that returned 10 s after its grant (tests/test_galera.py).
    Where a release hands the row to the waiter (PostgreSQL) the waiter sends no leaving
    statement: what is held up is the answer to its read of the handed grant
    (``CLAIM_HANDED_BY_ID``), the one statement between its grant and its caller. (A waiter
    reads it when the release's NOTIFY came late or not at all; here it is made to read it
    always, ``FAULTS_READ_HANDED``. A NOTIFY that comes late: tests/test_line_handoff.py.)"""
    ttl = 1.0
    make_pool("late-leave", 1)
    first = acquire("late-leave", ttl=30)  # the row is taken: the child waits in line
    env = _through(proxy) | ({} if engine else {"FAULTS_HAND_OUT_LATE": "1"})
    if lease_connection("default").dialect.line.hands_off:
        env["FAULTS_READ_HANDED"] = "1"
    late = start_holder("late-leave", ttl, auto_renew=False, timeout=ttl + 9, env=env)
    _until_in_line("late-leave", late)
    if lease_connection("default").dialect.line.hands_off:
        proxy.arm(b"EXTRACT(EPOCH FROM busy_before", b"grant_token =", hold=ttl + 2.0)  # its claim's answer
    else:
        proxy.arm(b"DELETE FROM", b"WHERE id =", hold=ttl + 2.0)  # the child's LEAVE_LINE
    first.release()  # the child is granted the row; its leaving the line is held back
    proxy.cuts.get(timeout=60)
    again = acquire("late-leave", ttl=30, timeout=ttl + 10)  # granted once the child's lease expired
    _judge_late_hand_out(late, again, "4-late-leave-line", engine, figures, grants=3)


@pytest.mark.parametrize("engine", [True, False], ids=["engine", "no-retry-control"])
def test_a_place_left_while_the_database_was_away_is_left_once_it_answers(
    engine: bool,
    proxy: CutProxy,
    make_pool: Callable[..., list[Resource]],
    start_holder: Callable[..., Child],
    figures: Callable[..., Any],
) -> None:
    """A waiter gives up (its timeout) just as the database goes away for it: its leaving
    statement never arrives, and neither does the one retry. Its place would stay in line for
    its whole ttl (30 s here): on MariaDB nobody behind it is served, on PostgreSQL the
    release hands it the row, which nobody takes. The row is released during the outage, and
    a newcomer asks for it. The engine's keeper leaves the place (and gives back what it was
    handed) once the database answers again, so the newcomer is served within seconds of the
    outage; the control, whose keeper does not, keeps the newcomer out past its timeout."""
    ttl, outage = 30.0, 2.0
    make_pool("left-away", 1)
    child = start_holder("left-away", ttl, env=_through(proxy) | ({} if engine else {"FAULTS_NO_LEAVE_RETRY": "1"}))
    child.wait_for("acquired")
    assert child.command("release")["ok"]
    first = acquire("left-away", ttl=60)  # the row is taken: the child's next ask waits in line
    asked = child.send("acquire", 4.0)
    _until_in_line("left-away", child)
    # Its LEAVE_LINE as it gives up (PostgreSQL's grants delete a place too, in an UPDATE).
    proxy.arm(b"DELETE FROM", b"WHERE id =", outage=outage, unless=b"UPDATE")
    proxy.cuts.get(timeout=30)
    gave_up = child.reply(asked, 30)
    assert not gave_up["ok"] and "NoResourceAvailable" in gave_up["error"], gave_up
    assert Waiter.objects.live().filter(kind="left-away").exists(), "the place was left after all"
    assert first.release()  # during the outage: PostgreSQL hands the row to the child's place
    started = time.monotonic()
    try:
        newcomer = acquire("left-away", ttl=30, timeout=outage + 10.0)
    except NoResourceAvailable:
        newcomer = None
    waited = time.monotonic() - started
    figures(
        "4-left-while-away" + ("" if engine else "-control"),
        outage=outage,
        place_ttl=ttl,
        newcomer_waited=waited,
        served=int(newcomer is not None),
    )
    if newcomer is not None:
        newcomer.release()
    if engine:
        assert newcomer is not None, f"the newcomer was kept out by the place left behind: {child.tail()}"
        assert not Waiter.objects.filter(kind="left-away").exists()
        # The keeper's round counts its leave after the give-back that served the newcomer.
        deadline = time.monotonic() + 10
        while (kept := child.command("line_stats")["result"])["leaves_pending"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert kept["leaves_retried"] == 1 and kept["leaves_pending"] == 0, kept
        # PostgreSQL's release handed the row to the place left behind: given back.
        assert kept["handed_back"] == int(lease_connection("default").dialect.line.hands_off), kept
    else:
        assert newcomer is None, "the control's place left behind kept nobody out"


@pytest.mark.parametrize("engine", [True, False], ids=["engine", "hand-out-control"])
def test_a_renewal_whose_answer_arrives_after_its_ttl_loses_the_lease(
    engine: bool,
    proxy: CutProxy,
    make_pool: Callable[..., list[Resource]],
    start_holder: Callable[..., Child],
    figures: Callable[..., Any],
) -> None:
    """The same for a renewal: it commits, its answer is held back past the ttl it set, and
    the row is granted again meanwhile. ``renew()`` must raise ``LeaseLost``, not report the
    lease renewed; the control reports it renewed and is caught."""
    ttl = 1.0
    make_pool("late-renewal", 1)
    env = _through(proxy) | ({} if engine else {"FAULTS_HAND_OUT_LATE": "1"})
    late = start_holder("late-renewal", ttl, auto_renew=False, env=env)
    first = late.wait_for("acquired")
    proxy.arm(b"UPDATE", b"SET busy_before =", hold=ttl + 2.0)
    ident = late.send("renew")
    proxy.cuts.get(timeout=60)  # committed, its answer held back
    again = acquire("late-renewal", ttl=30, timeout=ttl + 10)  # once the renewed lease expired
    answer = late.reply(ident, timeout=30)
    violations = [] if not answer["ok"] else [f"renew() succeeded after fence {again.fence} was granted: {answer}"]
    figures(
        "4-late-answer-renewal" + ("" if engine else "-control"),
        grants=2,
        violations=len(violations),
        fence=again.fence,
        first_fence=first["fence"],
    )
    again.release()
    if engine:
        assert not violations, violations
        assert "LeaseLost" in answer["error"], answer
    else:
        assert violations, f"the control did not report the late renewal a success: {answer}"


def test_release_whose_answer_is_lost_is_retried(
    proxy: CutProxy,
    make_pool: Callable[..., list[Resource]],
    start_holder: Callable[..., Child],
    figures: Callable[..., Any],
) -> None:
    make_pool("unknown-release", 1)
    a = start_holder("unknown-release", 30, auto_renew=False, env=_through(proxy))
    got = a.wait_for("acquired")
    proxy.arm(*_release_packet())
    released = a.command("release")
    proxy.cuts.get(timeout=60)
    row = Resource.objects.get()
    violations = []
    if row.grant_token or row.busy_before > got_expiry(got):
        violations.append(f"not released: {row.grant_token!r} {row.busy_before}")
    if released["result"]["released"] is not True:
        violations.append(f"release() said {released['result']['released']} although it released the resource")
    after = acquire("unknown-release", ttl=5)
    figures("4-lost-answer-release", cuts=1, grants=2, violations=len(violations), fence=after.fence)
    after.release()
    assert not violations, violations


def got_expiry(got: dict[str, Any]) -> Any:
    import datetime as dt

    return dt.datetime.fromisoformat(got["expires_at"])


#: A leader's save of its hand-over state: the election's fenced write of the row's payload.
SAVE = (b"UPDATE", b"SET data = ")


@pytest.mark.parametrize("engine", [True, False], ids=["engine", "naive-control"])
def test_a_save_lost_as_the_leadership_ends_is_of_unknown_outcome(
    engine: bool, proxy: CutProxy, spawn_worker: Callable[..., subprocess.Popen[str]], tmp_path: Path
) -> None:
    """A leader saves its state; the server commits the save, and its answer is held back, then
    lost with the connection (as through a failover: the old primary cut off, the client waiting
    out its timeout). Meanwhile the leadership ends (an operator's force release here, the ttl
    through a failover) and another candidate is elected, reading the state that save left.
    Asked again, the write is refused. The leader must be told the outcome is unknown
    (``OutcomeUnknown``), never ``LeaseLost``'s "nothing written": its successor already works
    from that state. The Patroni failover test's election checker caught it so: a leader that
    believed its save lost, a state one ahead of the saves it logged. The control: the write as
    it was, which said ``LeaseLost``."""
    name = f"lost-save-{'engine' if engine else 'control'}"
    go = tmp_path / "go"
    env = worker_env(DJANGO_SETTINGS_MODULE="tests.faults.settings", **_through(proxy))
    args = ["--name", name, "--go", str(go), *([] if engine else ["--naive"])]
    proc = spawn_worker("tests.procs.fenced_save", *args, env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    leader = json.loads(proc.stdout.readline())
    assert leader["ev"] == "leader", leader
    held = 6.0  # the answer held back: time for the force release and the successor's election
    proxy.arm(*SAVE, hold=held, lose=True)
    go.touch()
    caught = proxy.cuts.get(timeout=60)  # the save committed, its answer held back
    assert force_release(Resource.objects.filter(name=name)) == 1
    successor = Election(name, ttl=30, holder="successor")
    successor.campaign(timeout=10)
    state = successor.state
    before_the_cut = time.monotonic() < caught + held
    successor.resign()
    out, _ = proc.communicate(timeout=120)
    save = next(e for e in map(json.loads, out.splitlines()) if e["ev"] == "save")
    assert before_the_cut, "the successor was elected after the answer was lost: the fault was not injected"
    assert state == {"units": 1}, state  # committed before the leadership ended: the successor read it
    if engine:
        assert save.get("error") == "OutcomeUnknown", save
        assert "may or may not have been applied" in save["message"], save
    else:
        assert save.get("error") == "LeaseLost", f"the control did not say 'nothing written': {save}"
