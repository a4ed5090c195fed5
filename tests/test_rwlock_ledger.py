"""rwlock across real processes: readers and writers racing, some SIGKILLed or SIGSTOPped while
they hold it, judged by one ledger (tests/rw_ledger.py): never a writer with anyone else,
fences in the order of the holdings, no torn read, no lost update, and a writer not starved
by a stream of readers. Each check has its negative control: a worker whose read grant lost a
condition (``--broken``, in the worker process only) must be caught by the same checker."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from resource_lease import named
from resource_lease.models import Resource, Waiter
from resource_lease.recipes.rwlock import RWLOCK_KIND
from tests import rw_ledger

pytestmark = pytest.mark.django_db(transaction=True)

TTL = 1.0


@pytest.fixture(autouse=True)
def _forget_created_rows():
    named._known.clear()


def wait_for_line(proc: subprocess.Popen) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


def race(spawn_worker, directory: Path, name: str, *extra: str, workers: int = 5, seconds: float = 4.0) -> None:
    args = ["--name", name, "--dir", str(directory), "--seconds", str(seconds), "--ttl", str(TTL), *extra]
    procs = [spawn_worker("tests.procs.rw_worker", *args) for _ in range(workers)]
    for proc in procs:
        assert proc.wait(timeout=seconds + 120) == 0


def victim(spawn_worker, directory: Path, name: str, mode: str, hold: float, *extra: str) -> subprocess.Popen:
    """A worker that takes the rwlock once (``mode``) and holds it ``hold`` seconds."""
    args = ["--name", name, "--dir", str(directory), "--victim", mode, "--hold", str(hold), "--ttl", str(TTL)]
    proc = spawn_worker("tests.procs.rw_worker", *args, *extra, stdout=subprocess.PIPE)
    assert wait_for_line(proc).startswith("HOLDING")
    return proc


def test_readers_and_writers_exclude_across_processes_killed_and_paused(spawn_worker, tmp_path: Path) -> None:
    name = "ledger"
    # A reader SIGKILLed while it holds: its read period keeps writers out until it expires.
    killed = victim(spawn_worker, tmp_path, name, "read", 30)
    args = ["--name", name, "--dir", str(tmp_path), "--seconds", "5", "--ttl", str(TTL), "--writes", "0.3"]
    racers = [spawn_worker("tests.procs.rw_worker", *args) for _ in range(4)]
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    time.sleep(1.5)
    # A writer SIGSTOPped while it holds, past its ttl: the others go on after its expiry; when
    # it resumes it has stopped trusting the grant at its deadline (its end in the ledger).
    paused = victim(spawn_worker, tmp_path, name, "write", 2 * TTL + 0.5, "--timeout", "30")
    os.kill(paused.pid, signal.SIGSTOP)
    time.sleep(2 * TTL + 0.5)
    os.kill(paused.pid, signal.SIGCONT)
    # A reader SIGSTOPped while it holds, then killed.
    stopped = victim(spawn_worker, tmp_path, name, "read", 30, "--timeout", "30")
    os.kill(stopped.pid, signal.SIGSTOP)
    time.sleep(TTL + 0.5)
    os.kill(stopped.pid, signal.SIGKILL)
    stopped.wait()
    for proc in racers:
        assert proc.wait(timeout=120) == 0
    assert paused.wait(timeout=30) == 0
    verdict = rw_ledger.check(tmp_path)
    print(f"rwlock ledger: {verdict.summary()}")
    assert verdict.writes >= 5 and verdict.reads >= 5, "too few grants for the check to mean anything"
    assert verdict.violations == 0, (verdict.summary(), verdict.overlaps[:5], verdict.fence_disorder[:5])
    # Every grant raised the one fence: the recorded ones are all of them (none doubled).
    assert Resource.objects.get(kind=RWLOCK_KIND, name=name).fence == len(verdict.grants)


def test_negative_control_a_reader_that_ignores_the_writer_is_caught(spawn_worker, tmp_path: Path) -> None:
    race(spawn_worker, tmp_path, "broken", "--writes", "0.3", "--hold", "0.05", "--broken", "reader-ignores-writer")
    verdict = rw_ledger.check(tmp_path)
    print(f"negative control: {verdict.summary()}")
    assert verdict.writes >= 3 and verdict.reads >= 3
    assert verdict.violations > 0, "the ledger did not notice readers joining a writer"


def starve(spawn_worker, directory: Path, name: str, *extra: str) -> tuple[rw_ledger.RwGrant | None, list]:
    """Four readers that overlap without a gap, and a writer that asks while they stream: the
    writer's grant (None if it was refused) and the readers that overtook it."""
    # A ttl long enough that a loaded machine never lets the writer's place in line lapse (a
    # waiter paused past its ttl goes to the back, by design).
    ttl, stop = "5", directory / "stop"
    readers = [
        spawn_worker(
            "tests.procs.rw_worker",
            *("--name", name, "--dir", str(directory), "--until", str(stop), "--role", "read", "--hold", "0.3"),
            *("--ttl", ttl, "--timeout", "60", *extra),
        )
        for _ in range(4)
    ]
    try:
        deadline = time.monotonic() + 60
        while not Resource.objects.filter(kind=RWLOCK_KIND, name=name, fence__gte=8).exists():  # streaming
            assert time.monotonic() < deadline, "the readers did not start"
            time.sleep(0.01)
        writer = spawn_worker(
            "tests.procs.rw_worker",
            *("--name", name, "--dir", str(directory), "--victim", "write", "--hold", "0.1", "--ttl", ttl),
            *("--timeout", "60", *extra),
            stdout=subprocess.PIPE,
        )
        deadline = time.monotonic() + 30
        while not Waiter.objects.filter(kind=RWLOCK_KIND, name=name, shared=False).exists():
            if writer.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.005)
        place_at = time.monotonic_ns()  # the writer has its place in line (or never needed one)
        try:
            writer.wait(timeout=10)  # readers that overtake it would keep it out until they stop
        except subprocess.TimeoutExpired:
            pass
        time.sleep(0.5)  # the readers go on after it
    finally:
        stop.touch()
    writer.communicate(timeout=90)
    for proc in readers:
        assert proc.wait(timeout=90) == 0
    grants, _ = rw_ledger.read(directory)
    writes = [g for g in grants if g.mode == "W"]
    if not writes:
        return None, []
    return writes[0], rw_ledger.overtaken(grants, writes[0], place_at)


def test_a_writer_is_served_before_the_readers_that_asked_after_it(spawn_worker, tmp_path: Path) -> None:
    written, overtook = starve(spawn_worker, tmp_path, "starve")
    assert written is not None, "the writer was starved by the readers"
    assert overtook == [], overtook[:3]
    verdict = rw_ledger.check(tmp_path)
    print(f"no starvation: {verdict.summary()}")
    assert verdict.violations == 0, verdict.summary()
    # Not vacuous: readers held the rwlock when the writer asked.
    assert any(g.mode == "R" and g.start < written.asked < g.end for g in verdict.grants)


def test_negative_control_readers_that_ignore_a_waiting_writer_are_caught(spawn_worker, tmp_path: Path) -> None:
    written, overtook = starve(spawn_worker, tmp_path, "starve-broken", "--broken", "reader-ignores-line")
    print(f"negative control: writer {'refused' if written is None else 'granted'}, overtaken by {len(overtook)}")
    assert written is None or overtook, "the check did not notice readers overtaking a waiting writer"
