"""counter() and Config.compare_and_set(), with real processes racing on the database.

- ``add(n)`` returns the new value from one statement: N processes x K adds on a brand-new
  counter end at exactly N*K, every value 1..N*K handed out once, one row (a counter that reads
  then writes, the negative control, is caught by that check);
- ``Config.compare_and_set``: N processes each doing K increments by compare-and-set (retried
  until it succeeds) end at exactly N*K, every value stored once (a read then ``set``, the
  negative control, loses updates under the same check);
- bad input is a ValueError naming the argument, nothing written; the value stays in BIGINT;
- a watcher sees a compare-and-set like a ``set``; the admin and ``inspect_topics`` show counters.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test import Client

from resource_lease import Config, LeaseError, counter
from resource_lease.db.counters import BIGINT_MAX, BIGINT_MIN
from resource_lease.models import ConfigEntry, Counter
from tests.faults.harness import Child

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def start(spawn_worker: Callable[..., subprocess.Popen[str]]) -> Callable[..., Child]:
    def run(*args: Any) -> Child:
        proc = spawn_worker("tests.procs.counter_race", *map(str, args), stdout=subprocess.PIPE)
        return Child(proc, f"counter_race-{args[0]}")

    return run


# -- one process -------------------------------------------------------------------------------


def test_add_returns_the_new_value_and_a_counter_starts_at_zero() -> None:
    hits = counter("crawl:hits")
    assert hits.value() == 0
    assert not Counter.objects.exists()  # reading creates nothing
    assert hits.add() == 1
    assert hits.add(5) == 6
    assert hits.add(-10) == -4
    assert hits.add(0) == -4
    assert counter("crawl:hits").value() == -4
    assert list(Counter.objects.values_list("name", "value")) == [("crawl:hits", -4)]


def test_the_value_stays_within_bigint() -> None:
    top, bottom = counter("top"), counter("bottom")
    assert top.add(BIGINT_MAX) == BIGINT_MAX
    with pytest.raises(ValueError, match="^n: .*BIGINT"):
        top.add(1)
    assert top.value() == BIGINT_MAX
    assert bottom.add(BIGINT_MIN) == BIGINT_MIN
    with pytest.raises(ValueError, match="^n: .*BIGINT"):
        bottom.add(-1)
    assert bottom.value() == BIGINT_MIN
    assert bottom.add(BIGINT_MAX) == -1


BAD_INPUT: list[tuple[Callable[[], Any], str]] = [
    (lambda: counter(""), "name"),
    (lambda: counter("x" * 201), "name"),
    (lambda: counter("a\x00b"), "name"),
    (lambda: counter(7), "name"),  # type: ignore[arg-type]
    (lambda: counter("c", using="nope"), "using"),
    (lambda: counter("c").add(True), "n"),
    (lambda: counter("c").add(1.0), "n"),  # type: ignore[arg-type]
    (lambda: counter("c").add("1"), "n"),  # type: ignore[arg-type]
    (lambda: counter("c").add(None), "n"),  # type: ignore[arg-type]
    (lambda: counter("c").add(BIGINT_MAX + 1), "n"),
    (lambda: counter("c").add(BIGINT_MIN - 1), "n"),
]


def test_bad_input_is_refused_naming_the_argument_and_nothing_is_written() -> None:
    for call, argument in BAD_INPUT:
        with pytest.raises(ValueError, match=rf"^{argument}\b"):
            call()
    assert not Counter.objects.exists()


def test_names_compare_exactly_case_and_trailing_spaces_included() -> None:
    assert counter("Hits").add(1) == 1
    assert counter("hits").add(2) == 2
    assert counter("hits ").add(3) == 3
    assert sorted(Counter.objects.values_list("name", "value")) == [("Hits", 1), ("hits", 2), ("hits ", 3)]


def test_add_commits_at_once_whatever_the_callers_transaction() -> None:
    """Its own connection, its own commit (SQLite: refused inside atomic(), one writer)."""
    if connection.vendor == "sqlite":
        with transaction.atomic(), pytest.raises(LeaseError, match="single writer"):
            counter("in-tx").add()
        assert counter("in-tx").value() == 0
        return
    with pytest.raises(RuntimeError, match="roll back"), transaction.atomic():
        assert counter("in-tx").add(3) == 3
        raise RuntimeError("roll back the caller's transaction")
    assert counter("in-tx").value() == 3


def test_threads_adding_at_once_each_get_their_own_value() -> None:
    hits = counter("threads")
    got: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(25):
            value = hits.add()
            with lock:
                got.append(value)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(1, 101))


# -- processes racing ----------------------------------------------------------------------------

RACERS = 4
PER_RACER = 50


def _race(start: Callable[..., Child], tmp_path: Path, mode: str, *, naive: bool) -> tuple[list[int], list[str]]:
    go = tmp_path / "go"
    name = ["--name", "fresh"] if mode == "add" else ["--namespace", "fresh"]
    args = [mode, *name, "--count", PER_RACER, "--go", go, *(["--naive"] if naive else [])]
    racers = [start(*args) for _ in range(RACERS)]
    for racer in racers:
        racer.wait_for("ready", timeout=60)
    go.touch()
    for racer in racers:
        assert racer.proc.wait(timeout=180) == 0, racer.tail()
        racer.wait_for("eof")
    values = [e["value"] for racer in racers for e in racer.of("added" if mode == "add" else "cas")]
    errors = [e["error"] for racer in racers for e in racer.of("error")]
    return values, errors


def _violations(values: list[int], errors: list[str], final: int) -> list[str]:
    """Every add (or increment) got its own value, 1..N*K each once, and the final value is N*K."""
    total = RACERS * PER_RACER
    problems = [f"error: {e}" for e in errors]
    if sorted(values) != list(range(1, total + 1)):
        twice = sorted({v for v in values if values.count(v) > 1})
        problems.append(
            f"{len(values)} values, {len(set(values))} distinct, not 1..{total} each once (twice: {twice[:5]})"
        )
    if final != total:
        problems.append(f"final value {final}, expected {total} ({total - final} updates lost)")
    return problems


def test_processes_adding_to_a_new_counter_end_at_the_exact_sum_with_distinct_values(
    start: Callable[..., Child], tmp_path: Path
) -> None:
    values, errors = _race(start, tmp_path, "add", naive=False)
    problems = _violations(values, errors, counter("fresh").value())
    assert Counter.objects.filter(name="fresh").count() == 1
    print(f"counter race: {RACERS} processes x {PER_RACER} adds, final {counter('fresh').value()}")
    assert not problems, problems


def test_negative_control_a_read_then_write_counter_is_caught(start: Callable[..., Child], tmp_path: Path) -> None:
    values, errors = _race(start, tmp_path, "add", naive=True)
    problems = _violations(values, errors, counter("fresh").value())
    print(f"negative control: {len(problems)} problem(s): {problems[:2]}")
    assert problems, "the check did not notice a counter that reads, then writes"


def _final_hits() -> int:
    return int(Config("fresh", defaults={"hits": 0})["hits"])


def test_processes_incrementing_by_compare_and_set_lose_no_update(start: Callable[..., Child], tmp_path: Path) -> None:
    values, errors = _race(start, tmp_path, "cas", naive=False)
    problems = _violations(values, errors, _final_hits())
    print(f"compare-and-set race: {RACERS} processes x {PER_RACER} increments, final {_final_hits()}")
    assert not problems, problems


def test_negative_control_a_read_then_set_loses_updates(start: Callable[..., Child], tmp_path: Path) -> None:
    values, errors = _race(start, tmp_path, "cas", naive=True)
    problems = _violations(values, errors, _final_hits())
    print(f"negative control: {len(problems)} problem(s): {problems[:2]}")
    assert problems, "the check did not notice a read-then-set increment"


# -- compare_and_set -----------------------------------------------------------------------------


def test_compare_and_set_stores_only_over_the_expected_value() -> None:
    params = Config("recs", defaults={"max_rec": 1000, "ratio": 0.5, "tags": ["a"]})
    assert params.compare_and_set("max_rec", 1000, 800)  # the default counts when nothing is stored
    assert params["max_rec"] == 800
    assert not params.compare_and_set("max_rec", 1000, 700)
    assert Config("recs", defaults={"max_rec": 1000})["max_rec"] == 800
    assert params.compare_and_set("ratio", 0.5, 1)  # an int for a float key, as set() takes it
    assert params["ratio"] == 1.0
    assert params.compare_and_set("tags", ["a"], ["a", "b"])
    assert not params.compare_and_set("tags", ["a"], [])
    assert params.compare_and_set("max_rec", 800, 800)  # nothing to change
    other = Config("recs", defaults={"max_rec": 1000})
    other.set("max_rec", 5)
    assert not params.compare_and_set("max_rec", 800, 900)  # what this process last read is not trusted
    assert params["max_rec"] == 5


def test_compare_and_set_is_validated_like_set_and_writes_nothing_when_refused() -> None:
    params = Config("recs", defaults={"max_rec": 1000, "on": True})
    before = list(ConfigEntry.objects.values_list("key", "value", "version"))
    with pytest.raises(KeyError, match="no key 'nope'"):
        params.compare_and_set("nope", 1, 2)
    with pytest.raises(ValueError, match="^new: config key 'max_rec' takes an int"):
        params.compare_and_set("max_rec", 1000, "800")
    with pytest.raises(ValueError, match="^new: config key 'max_rec' takes an int"):
        params.compare_and_set("max_rec", 1000, True)
    with pytest.raises(ValueError, match="^expected: config key 'on' takes a bool"):
        params.compare_and_set("on", 1, False)
    assert list(ConfigEntry.objects.values_list("key", "value", "version")) == before


def test_a_watcher_sees_a_compare_and_set_like_a_set() -> None:
    params = Config("recs", defaults={"max_rec": 1000}, poll=0.05)
    seen: list[tuple[str, Any, Any]] = []
    got = threading.Event()

    def on_change(key: str, old: Any, new: Any) -> None:
        seen.append((key, old, new))
        got.set()

    handle = params.watch(on_change)
    try:
        assert params.compare_and_set("max_rec", 1000, 42)
        assert got.wait(10), "the watcher saw nothing"
    finally:
        handle.stop()
    assert seen == [("max_rec", 1000, 42)]


# -- operators -----------------------------------------------------------------------------------


def test_counters_are_listed_read_only_in_the_admin_and_by_inspect_topics(admin_client: Client) -> None:
    counter("crawl:hits").add(41)
    page = admin_client.get("/admin/resource_lease/counter/")
    assert page.status_code == 200
    assert "crawl:hits" in page.content.decode() and "41" in page.content.decode()
    assert admin_client.get("/admin/resource_lease/counter/add/").status_code == 403
    out = StringIO()
    call_command("inspect_topics", "--json", stdout=out)
    assert json.loads(out.getvalue())["counters"] == [
        {"name": "crawl:hits", "value": 41, "updated_at": json.loads(out.getvalue())["counters"][0]["updated_at"]}
    ]
    table = StringIO()
    call_command("inspect_topics", "--counter", "crawl:hits", stdout=table)
    assert "Counters: 1" in table.getvalue() and "crawl:hits" in table.getvalue()
