"""The benchmark's smoke mode on the test database: every scenario runs, measures and cleans up.

Nothing here judges speed (the machine is shared and noisy); the checks are that the
benchmark measured what it says, with real worker processes, and left nothing behind.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from project.bench.scenarios import SCENARIOS
from project.bench.targets import KIND_PREFIX
from resource_lease.models import Resource


def _run(out: Path, *args: str) -> str:
    stdout = io.StringIO()
    call_command("lease_bench", "--smoke", "--out", str(out), *args, stdout=stdout, stderr=io.StringIO())
    return stdout.getvalue()


def _result(out: Path, scenario: str) -> dict[str, Any]:
    doc = json.loads((out / f"{scenario}.json").read_text())
    [database] = doc["databases"]
    assert "error" not in database, database.get("error")
    return database["result"]


@pytest.mark.django_db(transaction=True)
def test_smoke_mode_runs_every_scenario_on_the_test_database(tmp_path: Path) -> None:
    printed = _run(tmp_path, "--database", "default")

    for scenario, (_, title) in SCENARIOS.items():
        assert title in printed
        assert (tmp_path / f"{scenario}.png").stat().st_size > 10_000
    assert (tmp_path / "summary.txt").read_text().strip()

    cycle = _result(tmp_path, "cycle")
    assert [point["processes"] for point in cycle["points"]] == [1, 2]
    for point in cycle["points"]:
        engine, floor = point["results"]["engine"], point["results"]["floor"]
        assert engine["cycles"] > 0 and floor["cycles"] > 0
        # The statement counters see the engine's private connection: an acquire and a release.
        assert engine["statements_per_cycle"] >= 2
        assert floor["statements_per_cycle"] == 2 and floor["lost_races"] == 0
        assert point["results"]["original"]["statements_per_cycle"] >= 3
        assert engine["x_floor"] > 0

    pool = _result(tmp_path, "pool")
    assert [point["size"] for point in pool["points"]] == [8, 300]

    scarcity = _result(tmp_path, "scarcity")
    assert scarcity["grants"] > 0 and len(scarcity["grants_per_worker"]) == scarcity["workers"]
    assert 0 < scarcity["utilisation"] <= 1.0001

    crash = _result(tmp_path, "crash")
    assert len(crash["events"]) == crash["holders"] * crash["rounds"]
    # Never regranted before the killed holder's lease ran out, and marked as a take-over.
    assert crash["granted_early"] == 0
    assert crash["all_took_over"]

    renewal = _result(tmp_path, "renewal")
    assert renewal["renewals"] > 0 and renewal["queries_per_renewal"] >= 1
    assert renewal["lateness"]["n"] > 0  # leases renewed more than once in the window

    waiting = _result(tmp_path, "waiting")
    for point in waiting["points"]:
        engine = point["results"]["engine"]
        assert engine["grants"] > 0 and 0 < engine["utilisation"] <= 1.0001
        assert 0 < engine["jain"] <= 1.0 and engine["gap_p50_ms"] is not None
        # What a waiter costs the database is counted (the line's looks, attempts, places).
        assert engine["statements_per_waiter_s"] and engine["line"]["entered"] >= 0
        # The baseline of the same run: the same processes on a row each, nobody waiting.
        unwaited = point["results"]["unwaited"]
        assert unwaited["grants"] > 0 and unwaited["client_cpu_ms_per_grant"] > 0
        assert "utilisation" not in unwaited
        # The server's CPU per grant is read (from /proc: 10 ms ticks, so a smoke window's
        # may be 0; SQLite has no server process, 0 too).
        assert engine["server_cpu_ms_per_grant"] >= 0 and unwaited["server_cpu_ms_per_grant"] >= 0

    crawl = _result(tmp_path, "crawl")
    assert list(crawl["results"]) == ["pool", "plain", "peer"]
    for figures in crawl["results"].values():
        # The crawlers' own count of requests is what the simulator answered.
        assert figures["requests"] == figures["simulator_answers"] > 0
        assert figures["ok"] + figures["forbidden"] + figures["too_many"] + figures["errors"] == figures["requests"]

    assert not Resource.objects.filter(kind__startswith=KIND_PREFIX).exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--processes", "0"], "--processes"),
        (["--processes", "two"], "--processes"),
        (["--duration", "nan"], "--duration"),
        (["--scenario", "nope"], "--scenario"),
        (["--database", "nosuchalias"], "nosuchalias"),
    ],
)
def test_bad_options_are_refused_before_anything_is_written(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "results"
    with pytest.raises(CommandError, match=message):
        call_command("lease_bench", "--out", str(out), *args, stdout=io.StringIO())
    assert not out.exists()


@pytest.mark.django_db(transaction=True)
def test_cycle_cost_measures_four_loops_and_leaves_nothing_behind() -> None:
    stdout = io.StringIO()
    call_command("cycle_cost", "--cycles", "30", "--rounds", "2", "--pool", "4", "--json", stdout=stdout)
    result = json.loads(stdout.getvalue())
    assert list(result["loops"]) == ["floor", "lease floor", "engine statements", "engine"]
    for name, row in result["loops"].items():
        assert row["worker_us"] > 0, name
        assert row["total_us"] == pytest.approx(row["server_us"] + row["worker_us"], abs=0.2)
        assert len(result["per_round"]["worker_us"][name]) == 2
    assert result["loops"]["floor"]["x_floor"] == 1.0
    assert not Resource.objects.filter(kind="cyclecost").exists()


@pytest.mark.django_db(transaction=True)
def test_coord_cost_measures_each_call_next_to_a_lock_cycle_and_leaves_nothing_behind() -> None:
    from resource_lease.models import ConfigEntry, Counter, LeadershipTerm

    stdout = io.StringIO()
    call_command("coord_cost", "--calls", "20", "--rounds", "2", "--json", stdout=stdout)
    result = json.loads(stdout.getvalue())
    assert list(result["loops"]) == [
        "lock cycle",
        "counter.add",
        "counter.value",
        "Config.set",
        "compare_and_set",
        "election cycle",
        "observer look",
    ]
    for name, row in result["loops"].items():
        assert row["wall_us"] > 0, name
        assert len(result["per_round"]["wall_us"][name]) == 2
    assert result["loops"]["lock cycle"]["x_lock"] == 1.0
    assert not Counter.objects.exists() and not ConfigEntry.objects.exists()
    assert not LeadershipTerm.objects.exists() and not Resource.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_notify_herd_benchmark_counts_the_wake_ups_it_causes() -> None:
    """project.bench.notify_herd: every NOTIFY it sends wakes each listener's waiter of the
    notified kind once, and a waiter of another kind never (its figure is then the LISTEN
    thread's alone)."""
    from django.db import connection

    from project.bench.notify_herd import UNTOUCHED, WOKEN, measure
    from tests.conftest import worker_env

    if connection.vendor != "postgresql":
        pytest.skip("NOTIFY is PostgreSQL's")
    per, woken = measure(WOKEN, 50, 2, env=worker_env())
    assert woken == [50, 50] and per > 0
    per, woken = measure(UNTOUCHED, 50, 2, env=worker_env())
    assert woken == [0, 0] and per > 0
