"""leader_only: a periodic job that runs on one server at a time, its state handed along."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from resource_lease import Election, LeaseLost, leader_only
from resource_lease.models import Resource
from resource_lease.pool import database_now, force_release
from resource_lease.recipes.election import default_candidate
from tests import leadership

pytestmark = pytest.mark.django_db(transaction=True)

TTL = 2.0


def row(name: str) -> Resource:
    return Resource.objects.get(kind="@election", name=name)


# -- one process ---------------------------------------------------------------------------


def test_the_body_gets_the_state_the_previous_run_returned_and_keeps_leadership() -> None:
    seen: list[dict[str, Any]] = []

    @leader_only("job", ttl=30)
    def job(**state: Any) -> dict[str, Any]:
        seen.append(state)
        return {"last_id": state.get("last_id", 0) + 1}

    assert job() == {"last_id": 1}
    assert job() == {"last_id": 2}
    assert seen == [{}, {"last_id": 1}]
    leader = row("job")
    assert (leader.holder, leader.fence, leader.data) == (default_candidate(), 1, {"last_id": 2})  # one leadership
    assert job.__name__ == "job"


def test_renewed_at_return_then_left_to_lapse_between_calls() -> None:
    @leader_only("lapse", ttl=1.5)
    def job(**state: Any) -> None:
        time.sleep(1.0)  # longer than a third of the ttl: the background renewal keeps it

    job()
    after = row("lapse")
    remaining = (after.busy_before - database_now()).total_seconds()
    assert 1.0 < remaining <= 1.5  # renewed when the body returned
    time.sleep(0.8)
    assert row("lapse").busy_before == after.busy_before  # not renewed between calls
    time.sleep(1.0)
    assert Election("lapse", holder="observer").leader() is None  # lapsed ttl after the return
    job()  # and taken again by the next call
    assert row("lapse").fence == 2


def test_others_get_otherwise_with_the_record() -> None:
    other = Election("shared", ttl=30, holder="server-b")
    other.campaign(timeout=0)
    other.save_state({"last_id": 7})
    ran: list[Any] = []

    @leader_only("shared", ttl=30, otherwise=lambda record: ("skipped", record))
    def job(**state: Any) -> None:
        ran.append(state)

    outcome, record = job()
    assert outcome == "skipped" and not ran
    assert record["leader"] == "server-b" and record["state"] == {"last_id": 7}
    assert record["expires_at"] == row("shared").busy_before

    @leader_only("shared", ttl=30)
    def quiet(**state: Any) -> None:
        ran.append(state)

    assert quiet() is None and not ran
    other.resign()
    assert job() is None and ran == [{"last_id": 7}]  # None keeps the state
    assert row("shared").data == {"last_id": 7}


def test_a_run_that_lost_its_leadership_stores_nothing_and_raises() -> None:
    @leader_only("lost", ttl=30)
    def job(**state: Any) -> dict[str, Any]:
        if state:
            force_release(Resource.objects.filter(kind="@election", name="lost"))
            Election("lost", ttl=30, holder="usurper").campaign(timeout=0)
        return {"n": state.get("n", 0) + 1}

    assert job() == {"n": 1}
    with pytest.raises(LeaseLost):
        job()
    assert row("lost").data == {"n": 1} and row("lost").holder == "usurper"


def test_a_failing_body_keeps_leadership_and_state() -> None:
    @leader_only("fails", ttl=30)
    def job(fail: bool = False, **state: Any) -> dict[str, Any]:
        if fail:
            raise RuntimeError("boom")
        return {"n": state.get("n", 0) + 1}

    job()
    with pytest.raises(RuntimeError, match="boom"):
        job(fail=True)
    assert job() == {"n": 2}
    assert row("fails").fence == 1


def test_a_body_returning_something_other_than_a_dict_is_an_error_and_stores_nothing() -> None:
    @leader_only("bad-return", ttl=30)
    def job(**state: Any) -> Any:
        return [1, 2]

    with pytest.raises(ValueError, match="return value"):
        job()
    assert row("bad-return").data == {}


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [({"name": ""}, "name"), ({"ttl": -1}, "ttl"), ({"otherwise": "x"}, "otherwise"), ({"using": 3}, "using")],
)
def test_bad_arguments_are_refused_naming_them(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(ValueError, match=f"^{argument}"):
        leader_only(**({"name": "ok"} | kwargs))
    assert not Resource.objects.exists()


# -- real processes -----------------------------------------------------------------------


def servers(spawn_worker, tmp_path: Path, n: int, *extra: str, seconds: float) -> list[Any]:
    args = ["--name", tmp_path.name, "--dir", str(tmp_path), "--ttl", str(TTL), "--seconds", str(seconds)]
    return [spawn_worker("tests.procs.leader_job", *args, *extra) for _ in range(n)]


def ticks(tmp_path: Path) -> tuple[Counter[int], list[list[str]], dict[int, str]]:
    ran: Counter[int] = Counter()
    otherwise: list[list[str]] = []
    by: dict[int, str] = {}
    for worker, lines in leadership.events(tmp_path).items():
        for fields in lines:
            if fields[1] == "RAN":
                ran[int(fields[2])] += 1
                by[int(fields[2])] = worker
            elif fields[1] == "OTHERWISE":
                otherwise.append([worker, *fields[2:]])
    return ran, otherwise, by


def test_servers_run_each_tick_once_and_hand_the_state_on_after_a_kill(spawn_worker, tmp_path: Path) -> None:
    procs = {p.pid: p for p in servers(spawn_worker, tmp_path, 3, seconds=60.0)}
    observer = Election(tmp_path.name, holder="observer")
    deadline = time.monotonic() + 60
    while not ((holder := observer.leader()) and observer.state.get("units", 0) >= 4):
        assert time.monotonic() < deadline, "no server ran the job 4 times"
        time.sleep(0.1)
    leader = int(holder.rsplit(":", 1)[1])
    procs[leader].send_signal(signal.SIGKILL)
    killed_tick = int(time.time())
    time.sleep(TTL + 5.0)
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs.values():
        proc.wait(timeout=60)
    ran, otherwise, by = ticks(tmp_path)
    verdict = leadership.check(tmp_path, frozenset({str(leader)}))
    after = sorted(t for t in ran if t > killed_tick)
    print(f"leader_only: {verdict.summary()} ticks={len(ran)} otherwise={len(otherwise)} first after kill={after[:1]}")
    assert verdict.violations == 0, verdict.summary()
    assert [t for t, n in ran.items() if n > 1] == [], "a tick ran twice"
    assert by[max(t for t in ran if t < killed_tick)] == str(leader)  # the leader kept the job
    assert after and by[after[0]] != str(leader)
    assert after[0] - killed_tick <= TTL + 2, "the job was not taken over within ttl + a retry"
    assert len(otherwise) >= 6
    final = row(tmp_path.name).data
    for worker, tick, holder, units, has_expiry in otherwise:
        if holder == "None":
            # Nobody led at that moment: only while the killed leader's term ran out (its
            # lease lapsed between a server's try and its read, and again on the retry).
            assert has_expiry == "False" and killed_tick <= int(tick) <= killed_tick + TTL + 2, (worker, tick)
        else:
            assert holder.rsplit(":", 1)[1] != worker and has_expiry == "True"
        assert 0 <= int(units) <= final["units"]
    assert final["units"] in (len(verdict.saved), len(verdict.saved) + 1)  # + the killed one's unlogged save


def test_negative_control_a_lock_around_the_body_runs_ticks_twice(spawn_worker, tmp_path: Path) -> None:
    """The same check must catch a job that gives up its leadership when the body returns."""
    procs = servers(spawn_worker, tmp_path, 3, "--release-at-return", seconds=6.0)
    for proc in procs:
        assert proc.wait(timeout=60) == 0
    ran, _, _ = ticks(tmp_path)
    twice = [t for t, n in ran.items() if n > 1]
    print(f"negative control: ticks={len(ran)} ran twice={len(twice)}")
    assert len(ran) >= 4
    assert twice, "the checker did not notice a tick that ran twice"


def test_a_leader_paused_inside_the_body_past_its_ttl_stores_nothing(spawn_worker, tmp_path: Path) -> None:
    """The leader stops (SIGSTOP) while its body runs, past the ttl: another server takes the
    job; on SIGCONT the paused run returns, and leader_only refuses it (LeaseLost, no state).
    The body stops itself when the test asks (--pause-file), so the pause is inside it."""
    pause = tmp_path / "pause-now"
    procs = {p.pid: p for p in servers(spawn_worker, tmp_path, 2, "--pause-file", str(pause), seconds=60.0)}
    observer = Election(tmp_path.name, holder="observer")
    deadline = time.monotonic() + 60
    while not ((holder := observer.leader()) and observer.state.get("units", 0) >= 2):
        assert time.monotonic() < deadline, "no server ran the job twice"
        time.sleep(0.05)
    pause.touch()

    def pausing() -> tuple[int, int] | None:
        for worker, lines in leadership.events(tmp_path).items():
            for fields in lines:
                if fields[1] == "PAUSING":
                    return int(worker), int(fields[2])
        return None

    while (found := pausing()) is None:
        assert time.monotonic() < deadline, "no leader ran its body again"
        time.sleep(0.05)
    paused, paused_tick = found
    holder = f"{holder.rsplit(':', 1)[0]}:{paused}"
    while observer.leader() in (None, holder):
        assert time.monotonic() < deadline + 30, "nobody took over from the paused leader"
        time.sleep(0.05)
    time.sleep(2.0)  # the new leader runs a tick or two
    procs[paused].send_signal(signal.SIGCONT)
    time.sleep(2.0)
    for proc in procs.values():
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    mine = leadership.events(tmp_path)[str(paused)]
    at = next(i for i, f in enumerate(mine) if f[1] == "PAUSING")
    ran, _, _ = ticks(tmp_path)
    verdict = leadership.check(tmp_path)
    print(f"paused inside the body: {verdict.summary()}; the paused server's events then {mine[at : at + 3]}")
    assert mine[at + 1][1:] == ["LOST", str(paused_tick)], mine[at:]  # the paused run raised LeaseLost...
    assert verdict.violations == 0, verdict.summary()  # ...and stored nothing: 1, 2, 3, ... unbroken
    assert [t for t, n in ran.items() if n > 1] == []
    assert row(tmp_path.name).data["units"] == len(verdict.saved)
