"""notify() and watch(), with real processes racing on the database.

- N processes notifying a brand-new topic at once create one row and get the versions
  1..N*K, each once (a read-then-write bump, the negative control, is caught by that check);
- a watcher in another process sees the versions increase and always gets the latest,
  with the payload of that version;
- callbacks never overlap (a slow callback), and changes during one are coalesced, never
  lost (a watcher that compares payloads, the negative control, loses one);
- on PostgreSQL a NOTIFY wakes the watcher well within its poll interval;
- stop() joins the thread and closes its connections.

A watcher whose database goes away: test_watch_faults.py.
"""

from __future__ import annotations

import logging
import os
import random
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction

from resource_lease import LeaseError, Watch, notify, watch
from resource_lease.db.connections import close_connections
from resource_lease.keeper import keeper
from resource_lease.models import Topic
from resource_lease.recipes.notifications import topic_state
from tests.faults.harness import Child
from tests.notify_helpers import check_deliveries, deliveries, notify_child, quantile, wait_version

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def start(spawn_worker: Callable[..., subprocess.Popen[str]]) -> Callable[..., Child]:
    return notify_child(spawn_worker)


CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


# -- bad input ---------------------------------------------------------------------------


BAD_INPUT: list[tuple[Callable[[], Any], str]] = [
    (lambda: notify(""), "topic"),
    (lambda: notify("x" * 201), "topic"),
    (lambda: notify("a\x00b"), "topic"),
    (lambda: notify(42), "topic"),  # type: ignore[arg-type]
    (lambda: notify(None), "topic"),  # type: ignore[arg-type]
    (lambda: notify("t", float("nan")), "payload"),
    (lambda: notify("t", {"at": object()}), "payload"),
    (lambda: notify("t", "nul\x00"), "payload"),
    (lambda: notify("t", using="nope"), "using"),
    (lambda: watch("", print), "topic"),
    (lambda: watch("t", None), "callback"),  # type: ignore[arg-type]
    (lambda: watch("t", "print"), "callback"),  # type: ignore[arg-type]
    (lambda: watch("t", print, poll=0), "poll"),
    (lambda: watch("t", print, poll=-1), "poll"),
    (lambda: watch("t", print, poll=float("inf")), "poll"),
    (lambda: watch("t", print, poll=True), "poll"),
    (lambda: watch("t", print, using="nope"), "using"),
]


def test_bad_input_is_refused_naming_the_argument_and_nothing_is_written() -> None:
    for call, argument in BAD_INPUT:
        with pytest.raises(ValueError, match=argument):
            call()
    assert not Topic.objects.exists()


def test_notify_creates_the_topic_and_versions_go_up_by_one() -> None:
    assert topic_state("built") == (0, None)
    assert notify("built", {"day": "2026-11-23"}) == 1
    assert notify("built") == 2
    assert notify("built", ["a", 1, 2.5, True, None]) == 3
    assert topic_state("built") == (3, ["a", 1, 2.5, True, None])
    row = Topic.objects.get(name="built")
    assert (row.version, row.payload) == (3, ["a", 1, 2.5, True, None])
    assert len("x" * 200) == 200 and notify("x" * 200) == 1


def test_names_compare_exactly_case_and_trailing_spaces_included() -> None:
    """MariaDB's default collation would make these one topic; each must be its own."""
    names = ["Index", "index", "index ", "índex"]
    for name in names:
        assert notify(name, name) == 1
    assert sorted(Topic.objects.values_list("name", flat=True)) == sorted(names)
    for name in names:
        assert topic_state(name) == (1, name)


def test_notify_commits_at_once_whatever_the_callers_transaction() -> None:
    """Its own connection, its own commit: a rollback of the caller's transaction does not
    undo it. SQLite has one writer: inside atomic() it refuses instead of waiting for the
    caller's own lock."""
    if connection.vendor == "sqlite":
        with transaction.atomic(), pytest.raises(LeaseError, match="single writer"):
            notify("in-tx")
        assert topic_state("in-tx") == (0, None)
        return
    with pytest.raises(RuntimeError, match="roll back"), transaction.atomic():
        assert notify("in-tx", "kept") == 1
        raise RuntimeError("roll back the caller's transaction")
    assert topic_state("in-tx") == (1, "kept")


# -- race on a new topic -------------------------------------------------------------------

RACERS = 3
PER_RACER = 10


def _race(start: Callable[..., Child], tmp_path: Path, *, naive: bool) -> tuple[list[int], list[str]]:
    go = tmp_path / "go"
    args = ["race", "--topic", "fresh", "--count", PER_RACER, "--go", go, *(["--naive"] if naive else [])]
    racers = [start(*args) for _ in range(RACERS)]
    for racer in racers:
        racer.wait_for("ready", timeout=60)
    go.touch()
    for racer in racers:
        assert racer.proc.wait(timeout=120) == 0, racer.tail()
        racer.wait_for("eof")
    versions = [e["version"] for racer in racers for e in racer.of("notified")]
    errors = [e["error"] for racer in racers for e in racer.of("error")]
    return versions, errors


def _race_violations(versions: list[int], errors: list[str]) -> list[str]:
    """Each notification got its own version, 1..N with none twice or missing, and one row."""
    problems = [f"error: {e}" for e in errors]
    expected = list(range(1, RACERS * PER_RACER + 1))
    if sorted(versions) != expected:
        dupes = sorted({v for v in versions if versions.count(v) > 1})
        problems.append(f"versions {sorted(versions)} are not 1..{len(expected)} each once (twice: {dupes})")
    rows = list(Topic.objects.filter(name="fresh").values_list("version", flat=True))
    if rows != [len(expected)]:
        problems.append(f"topic rows {rows}, expected one at version {len(expected)}")
    return problems


def test_processes_notifying_a_new_topic_at_once_create_one_row_and_distinct_versions(
    start: Callable[..., Child], tmp_path: Path
) -> None:
    versions, errors = _race(start, tmp_path, naive=False)
    problems = _race_violations(versions, errors)
    print(f"race: {RACERS} processes x {PER_RACER} notifications, versions {min(versions)}..{max(versions)}")
    assert not problems, problems


def test_negative_control_a_read_then_write_bump_is_caught(start: Callable[..., Child], tmp_path: Path) -> None:
    """The same check must fail a bump that reads the version and writes it back + 1."""
    versions, errors = _race(start, tmp_path, naive=True)
    problems = _race_violations(versions, errors)
    print(f"negative control: {len(problems)} problem(s): {problems[:2]}")
    assert problems, "the check did not notice a non-atomic version bump"


# -- a watcher in another process ------------------------------------------------------------


def test_a_watcher_sees_versions_increase_and_always_the_latest(start: Callable[..., Child]) -> None:
    notify("feed", "before")  # not delivered: it happened before the watch started
    watcher = start("watch", "--topic", "feed", "--poll", 0.2)
    watcher.wait_for("ready", timeout=60)
    sent: dict[int, Any] = {}
    stop = threading.Event()

    def send(n: int) -> None:
        for i in range(n):
            payload = {"by": threading.get_ident(), "i": i}
            sent[notify("feed", payload)] = payload
            time.sleep(0.01 * (i % 4))
        close_connections()

    senders = [threading.Thread(target=send, args=(25,)) for _ in range(3)]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    stop.set()
    final = max(sent)
    wait_version(watcher, final)
    watcher.finish()
    got = deliveries(watcher)
    print(f"watch: {len(sent)} notifications, {len(got)} deliveries (coalesced {len(sent) - len(got)})")
    assert 1 not in [e["version"] for e in got], "a change from before the watch was delivered"
    problems = check_deliveries(got, sent, final)
    assert not problems, problems


def _slow_round(start: Callable[..., Child], *, naive: bool) -> tuple[list[dict[str, Any]], dict[int, Any], int]:
    """A slow callback: two changes arrive while it runs, the second back to the first
    payload. The last one must still be delivered (once the callback returns)."""
    args = ["watch", "--topic", "slow", "--poll", 0.2, "--slow", 0.6, *(["--naive-payload"] if naive else [])]
    watcher = start(*args)
    watcher.wait_for("ready", timeout=60)
    sent: dict[int, Any] = {}
    v = notify("slow", "on")
    sent[v] = "on"
    watcher.wait_for("enter", timeout=30, where=lambda e: e["version"] == v)
    for payload in ("off", "on"):  # during the callback
        sent[notify("slow", payload)] = payload
    watcher.wait_for("got", timeout=30, where=lambda e: e["version"] == v)  # the callback returned
    try:  # a correct watcher delivers version 3 next; the naive one never does
        watcher.wait_for("got", timeout=5, where=lambda e: e["version"] == v + 2)
    except AssertionError:
        pass
    sent[notify("slow", "quiet")] = "quiet"
    wait_version(watcher, max(sent), timeout=30)
    final = max(sent)
    watcher.finish()
    return deliveries(watcher), sent, final


def test_callbacks_never_overlap_and_changes_during_one_are_coalesced_not_lost(start: Callable[..., Child]) -> None:
    got, sent, final = _slow_round(start, naive=False)
    problems = check_deliveries(got, sent, final)
    # The change back to "on" made during the callback is delivered after it.
    if 3 not in [e["version"] for e in got]:
        problems.append("version 3 (sent during a callback, back to the first payload) was never delivered")
    spans = sorted((e["start"], e["end"]) for e in got)
    problems += [f"callbacks overlap: {a} and {b}" for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1]]
    if len({e["thread"] for e in got}) != 1:
        problems.append(f"callbacks ran on several threads: {sorted({e['thread'] for e in got})}")
    print(f"slow callback: sent {sorted(sent)}, delivered {[e['version'] for e in got]}")
    assert not problems, problems


def test_negative_control_a_watch_that_compares_payloads_loses_a_change(start: Callable[..., Child]) -> None:
    got, sent, final = _slow_round(start, naive=True)
    missed = [v for v in (3,) if v not in [e["version"] for e in got]]
    print(f"negative control: delivered {[e['version'] for e in got]}, missed {missed}")
    assert missed, "the payload-comparing watcher delivered the change back to 'on': the check proves nothing"


# -- in-process behaviour ------------------------------------------------------------------


def test_a_failing_callback_is_logged_loudly_and_the_watch_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []
    delivered = threading.Event()

    def callback(payload: Any, version: int) -> None:
        calls.append(version)
        if version == 1:
            raise RuntimeError("boom")
        delivered.set()

    with caplog.at_level(logging.ERROR, logger="resource_lease"):
        w = watch("flaky", callback, poll=0.1)
        try:
            notify("flaky")
            deadline = time.monotonic() + 20
            while 1 not in calls and time.monotonic() < deadline:
                time.sleep(0.05)
            notify("flaky")
            assert delivered.wait(20), calls
        finally:
            w.stop()
    assert calls == [1, 2]
    failed = [r for r in caplog.records if "callback failed" in r.getMessage()]
    assert failed and failed[0].exc_info is not None and "boom" in str(failed[0].exc_info[1])


def test_stop_joins_the_thread_and_closes_its_connections_and_may_be_called_from_the_callback() -> None:
    w = watch("stopping", lambda p, v: None, poll=0.1)
    assert isinstance(w, Watch) and w.is_alive()
    time.sleep(0.3)
    w.stop()
    assert not w.is_alive() and w.stopped.is_set()

    inside: list[Watch] = []
    done = threading.Event()

    def stop_from_inside(payload: Any, version: int) -> None:
        inside[0].stop()  # must not deadlock joining itself
        done.set()

    inside.append(watch("stopping", stop_from_inside, poll=0.1))
    notify("stopping")
    assert done.wait(20)
    assert inside[0].join(10)
    assert not inside[0].is_alive()


def _sessions() -> int | None:
    """Sessions on the test database other than this test's own Django connection."""
    if connection.vendor == "sqlite":
        return None
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(
                "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE() AND id <> CONNECTION_ID()"
            )
        else:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        return int(cursor.fetchone()[0])


def test_stop_closes_the_watch_threads_connections() -> None:
    topic_state("sessions")  # this thread's own engine connection, open from here on
    deadline = time.monotonic() + 10  # the keeper has finished what earlier tests left it
    while keeper().thread is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    before = _sessions()
    w = watch("sessions", lambda p, v: None, poll=0.1)
    time.sleep(0.5)
    during = _sessions()
    w.stop()
    deadline = time.monotonic() + 10  # the server notices a closed session a moment later
    while (after := _sessions()) != before and time.monotonic() < deadline:
        time.sleep(0.1)
    print(f"sessions: before {before}, watching {during}, after stop {after}")
    if before is not None:
        assert during is not None and during > before, "the watch opened no connection of its own?"
        assert after == before


# -- latency -------------------------------------------------------------------------------


def test_watch_latency(start: Callable[..., Child]) -> None:
    """PostgreSQL: NOTIFY wakes the watcher well within a 5 s poll. Elsewhere: polling
    (figures only, with a bound of poll plus a generous margin)."""
    pg = connection.vendor == "postgresql"
    poll = 5.0 if pg else 0.5
    watcher = start("watch", "--topic", "latency", "--poll", poll)
    watcher.wait_for("ready", timeout=60)
    time.sleep(0.5)  # the watcher's first wait has begun (and on PostgreSQL it LISTENs)
    latencies = []
    for _ in range(6 if CI else 12):
        sent_at = time.monotonic()
        version = notify("latency")
        got = wait_version(watcher, version, timeout=poll + 30)
        latencies.append(got["start"] - sent_at)
        time.sleep(random.uniform(0.1, 0.2 if pg else 0.6))  # not in step with the poll
    watcher.finish()
    how = "LISTEN/NOTIFY" if pg else "polling"
    print(
        f"watch latency ({connection.vendor}, {how}, poll {poll:g}s): p50 {statistics.median(latencies) * 1000:.1f} ms,"
        f" p99 {quantile(latencies, 0.99) * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms over {len(latencies)}"
    )
    if pg:
        assert max(latencies) < poll / 2, latencies
    else:
        assert max(latencies) < poll + 10, latencies
