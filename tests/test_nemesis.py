"""The nemesis runner's short mode (docs/jepsen.md): every primitive used by four processes
while the nemesis SIGKILLs and SIGSTOPs them, ends their sessions, moves their wall clocks
(and, on one primitive, restarts the server unless RESOURCE_LEASE_FAULTS_NO_RESTART is set);
the checker finds no violation. Its negative controls: broken variants of the primitives
(tests/procs/nemesis_broken.py) run through the same runner and checker, which must report
them.

The long mode is ``manage.py nemesis --seconds N``; its figures are in docs/jepsen.md.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from project.bench.nemesis.runner import PRIMITIVES, Plan, Report, run
from project.bench.nemesis.tally import tally
from project.bench.targets import url_from_alias
from tests.short_mode import on_one_server, once_across_backends

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

#: The primitive whose short run may restart the server (once): one restart per backend.
RESTARTS_ON = "lock"


def _run(plan: Plan) -> Report:
    report = run(plan, alias="default", url=url_from_alias("default"))
    print(report.line())  # the figures, in the test's output
    return report


@pytest.mark.parametrize(
    "primitive",
    [pytest.param(p, marks=pytest.mark.restarts_server) if p == RESTARTS_ON else p for p in PRIMITIVES],
)
def test_no_violation_under_the_nemesis(primitive: str) -> None:
    if primitive != RESTARTS_ON:
        # CI's time: a short run per primitive costs some 20 s a backend. The one that
        # restarts the server runs on both servers; the others on one each, alternating, and
        # on SQLite (the long runs of docs/jepsen.md: every primitive on both servers).
        others = [p for p in PRIMITIVES if p != RESTARTS_ON]
        on_one_server(f"The nemesis's short run of {primitive}", others.index(primitive))
    # A restart takes the server away for a second or more (longer on a loaded machine): the
    # run that may restart it gets the time for every other kind of fault too.
    # (The first restart comes restart_every seconds into the run, after the other kinds.)
    seconds = 8.0 if primitive == RESTARTS_ON else 4.0
    plan = Plan(primitive, seconds=seconds, processes=4, ttl=1.0, heal=3.0, interval=0.3, restart_every=5.0)
    if primitive != RESTARTS_ON:
        plan.faults = tuple(f for f in plan.faults if f != "restart")
    report = _run(plan)
    assert report.violations == 0, (report.by_kind, report.examples, report.directory)
    # (A barrier round needs three members at once: on a loaded machine, a few rounds.)
    enough = 3 if primitive == "barrier" else 10
    assert report.grants >= enough, f"too few grants for the check to mean anything: {report.line()}"
    # Each kind comes once before any comes again: a short run sees every one it can inject.
    expected = {"kill", "stop"} | ({"cut", "skew"} - set(report.not_injected))
    assert expected <= set(report.faults), (report.faults, report.not_injected)
    if connection.vendor != "sqlite":
        assert {"cut", "skew"} <= set(report.faults), (report.faults, report.not_injected)


@pytest.mark.parametrize(
    ("primitive", "caught"),
    [
        ("lock", "overlap"),
        ("election", "overlap"),
        ("group", "overlap"),
        ("barrier", "barrier_round"),
        ("dispenser", "done_twice"),
    ],
)
def test_negative_control_broken_primitives_are_caught(primitive: str, caught: str) -> None:
    once_across_backends("A negative control of the nemesis's checker")
    # One lock, one election; one barrier of 2 for all four (two cohorts could be inside at
    # once); work long enough (0.1 s a unit) for the broken barrier's rounds to meet. The
    # broken dispenser is caught only when two workers' naive assigns meet in its 50 ms
    # window, which a loaded machine (a CI rehearsal: six shards on two cores) made rare in
    # 2 s: it runs longer.
    plan = Plan(
        primitive,
        seconds=6.0 if primitive == "dispenser" else 2.0,
        processes=4,
        ttl=1.0,
        hold=0.1,
        heal=0.5,
        settle=0.0,
        faults=("stop",),
        objects=1,
        size=2,
        patch="tests.procs.nemesis_broken",
    )
    report = _run(plan)
    assert report.by_kind.get(caught), f"the broken {primitive} was not caught: {report.line()}"


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"primitive": "mutex"}, "primitive"),
        ({"primitive": "lock", "faults": ("kill", "flood")}, "faults"),
        ({"primitive": "lock", "processes": 1}, "processes"),
        ({"primitive": "barrier", "processes": 2}, "processes"),
        # 12 clients on 6 barriers of 3: two members each, no barrier ever fills (the run
        # reported "no_progress" before this was refused).
        ({"primitive": "barrier", "processes": 12, "objects": 6}, "objects"),
    ],
)
def test_a_plan_that_cannot_run_is_refused_naming_the_argument(arguments: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=rf"^{named}\b"):
        Plan(seconds=1.0, **arguments)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--primitive", "mutex"], "unknown primitive 'mutex'"),
        (["--primitive", "lock", "--faults", "kill,flood"], "unknown fault 'flood'"),
        (["--primitive", "lock", "--processes", "0"], "--processes"),
        (["--primitive", "barrier", "--processes", "12", "--objects", "6"], "objects: 6 barriers of size 3"),
    ],
)
def test_the_commands_bad_options_are_refused_naming_them(args: list[str], named: str) -> None:
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match=named):
        call_command("nemesis", "--seconds", "1", *args, stdout=io.StringIO())


def test_the_tally_adds_up_the_runs_of_a_primitive_and_refuses_what_is_not_a_report(tmp_path: Path) -> None:
    base = {"primitive": "semaphore", "database": "PostgreSQL 15", "seconds": 600.0, "processes": 12, "ttl": 1.0}
    runs = [
        {**base, "elapsed": 610.4, "operations": 100, "grants": 90, "units": 180, "losses": 3, "violations": 0,
         "served_in_tail": "12/12", "faults": {"cut": 1, "kill": 2, "restart": 0, "skew": 3, "stop": 4}},
        {**base, "elapsed": 620.0, "operations": 1000, "grants": 900, "units": 1800, "losses": 30, "violations": 0,
         "served_in_tail": "12/12", "faults": {"cut": 10, "kill": 20, "restart": 9, "skew": 30, "stop": 40}},
    ]  # fmt: skip
    paths = []
    for i, run_report in enumerate(runs):
        paths.append(tmp_path / f"semaphore-postgres-{i}.json")
        paths[-1].write_text(json.dumps([run_report]))
    (row,) = (total.row(*key) for key, total in tally(paths).items())
    assert row == (
        "| semaphore | PostgreSQL 15 | 2 | 1,230 | 990 | 1,100 | 1,980 | 11, 22, 9, 33, 44 | 33 | 12/12 in each | **0** |"
    )
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps([{"primitive": "lock"}]))
    with pytest.raises(ValueError, match="broken.json: not a nemesis report"):
        tally([broken])


def test_the_failover_fault_needs_a_cluster_and_known_kinds() -> None:
    """Without a Patroni cluster behind the run's URL the failover fault is not injected, and
    the report says why (tests/test_patroni.py runs it on the cluster); an unknown way of
    failing over is refused, naming the ways."""
    from project.bench.nemesis.failover import failover_allowed

    assert "not a cluster" in failover_allowed("default")
    with pytest.raises(ValueError, match="failover kinds: reboot; choose from kill, stop, switchover, cut"):
        Plan("lock", seconds=1, failover_kinds=("reboot",))


def test_the_election_checker_allows_a_save_of_unknown_outcome_and_nothing_more() -> None:
    """A leader whose save's answer was lost with the connection (a switchover) may have
    written it and go on in the same term: the next logged save may be one higher for it. Two
    leaders' work is still caught: a jump with no such save, and a state that goes back."""
    from project.bench.nemesis.checker import _bad_saves

    once_across_backends("the election checker's rule")
    pid = 7
    logged = [(1, 1, pid), (1, 3, pid)]  # 2 saved, its answer lost, then 3 in the same term
    assert _bad_saves(logged, killed=set(), unknown=[1]) == []
    assert _bad_saves(logged, killed=set()) == ["saved units=3 under fence 1 after units=1"]
    assert _bad_saves([(1, 1, pid), (1, 4, pid)], killed=set(), unknown=[1]) != []
    assert _bad_saves([(1, 1, pid), (2, 1, 8)], killed=set(), unknown=[1]) != []
