"""The liveness matrix: every primitive that waits, on every backend, is woken at release.

Three processes contend for each row's primitive (project/bench/liveness_contender.py: one thread, or one
asyncio task, per row in each process), each taking it CYCLES times and holding it a moment:
at any time one holds it and the others wait in its line, in other processes. The fallback
that would hide a missed wake-up is raised far above the test's deadline (``LINE_POLL_MAX``
600 s; every lease and place lasts 60 s, so no expiry serves anyone either): a waiter that
sleeps through a release is still asleep when the test gives up, and the row *stalls*. A
missed wake-up is a failure, never a slow pass.

The check: every row finishes all its cycles, and no row goes STALL seconds without a grant
while it has cycles left. Its negative control cuts the wake-up path in the contenders
(``--no-wakeups``: no waiter is woken, and none looks sooner than ``LINE_POLL_MAX``): the same
check must find every row stalled.

The long mode: ``LIVENESS_CONTENDERS=8 LIVENESS_CYCLES=6 scripts/test -- tests/test_liveness.py``.

``@leader_only`` never waits (a server that does not lead calls ``otherwise``), so it has no row.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import worker_env

pytestmark = pytest.mark.django_db(transaction=True)

SYNC_ROWS = [
    "acquire",
    "lock",
    "semaphore",
    "rwlock-write",
    "rwlock-mixed",
    "holder",
    "election",
    "synchronized",
    "barrier",
    "worker",
]
ASYNC_ROWS = ["aacquire", "alock", "asemaphore", "arwlock-write", "arwlock-mixed", "aelection", "asynchronized"]
ROWS = [r for r in SYNC_ROWS + ASYNC_ROWS if r in os.environ.get("LIVENESS_ROWS", r).split(",")]
#: Processes per row. The long mode (``LIVENESS_CONTENDERS=8``) puts a reader of an rwlock behind
#: two writers and more waiters behind each release (the benchmark found a missed wake-up that
#: three contenders never show: a reader that counted its one wake-up as one of two rows).
CONTENDERS = int(os.environ.get("LIVENESS_CONTENDERS", "3"))
CYCLES = int(os.environ.get("LIVENESS_CYCLES", "4"))
HOLD = 0.1  # longer than the contenders' start apart: three want two slots at once
#: The negative control's hold: a row whose contenders never had to wait proves nothing, and
#: under CI's load one statement on SQLite (one writer for all the rows of three processes) can
#: take longer than HOLD, so that a refused contender's next statement found the slot free
#: again and no wake-up was ever needed (the semaphore's row passed the control once so, every
#: grant within 0.17 s of a release). Held this long, the two first grants of a semaphore of
#: two are still held when the third contender asks, and it must be woken.
CONTROL_HOLD = 2.0
#: Seconds without a grant in a row that has cycles left: a stall. A hand-off takes
#: milliseconds; this leaves room for a loaded machine, and is far below LINE_POLL_MAX.
STALL = 12.0
#: Seconds for the whole matrix to finish (the engine) once the contenders have started.
DEADLINE = 120.0
#: The fallback look of every waiter (``LINE_POLL_MAX``; ``BACKOFF_BASE`` and ``BACKOFF_MAX``,
#: the pace of a barrier member's attempts), far above DEADLINE.
POLL_MAX = 600.0
PREFIX = "live-"


def _seed() -> None:
    """The pools of the rows that ask for 'any resource of a kind': one resource each (two
    for a semaphore-like pool would let waiters through without a hand-off)."""
    from resource_lease.models import Resource

    for kind in ("acquire", "aacquire", "holder"):
        Resource.objects.create(kind=f"{PREFIX}{kind}", name=f"{kind}-0")


def _read(out: Path) -> tuple[dict[str, list[tuple[int, int, int, int]]], dict[str, list[str]]]:
    grants: dict[str, list[tuple[int, int, int, int]]] = defaultdict(list)
    errors: dict[str, list[str]] = defaultdict(list)
    if not out.exists():
        return grants, errors
    for line in out.read_text().splitlines():
        row, index, *rest = line.split(" ", 2)
        if rest and rest[0].startswith("error"):
            errors[row].append(f"contender {index}: {rest[0]}")
            continue
        asked, granted, released = map(int, rest[0].split())
        grants[row].append((int(index), asked, granted, released))
    return grants, errors


def _lines() -> list[str]:
    """The rows and places of the matrix, as the database has them now."""
    from resource_lease.models import Resource, Waiter

    rows = Resource.objects.filter(name__startswith=PREFIX) | Resource.objects.filter(kind__startswith=PREFIX)
    found = [
        f"row {r.kind}/{r.name} holder={r.holder!r} fence={r.fence} busy_before={r.busy_before}"
        f" readers={getattr(r, 'readers', None)} line_until={r.line_until}"
        for r in rows
    ]
    found += [
        f"place {w.pk} {w.kind}/{w.name} holder={w.holder!r} shared={w.shared} expires={w.expires_at}"
        for w in Waiter.objects.all()
    ]
    return found


def run_matrix(tmp_path: Path, *, no_wakeups: bool, hold: float = HOLD) -> dict[str, Any]:
    """Run every row at once, each contender holding each grant ``hold`` seconds; per row:
    grants, errors, whether and when it stalled, and the release-to-grant gaps (seconds)."""
    _seed()
    out, go = tmp_path / "grants.log", tmp_path / "go"
    env = worker_env(
        RESOURCE_LEASE_LINE_POLL_MAX=str(POLL_MAX),
        RESOURCE_LEASE_BACKOFF_BASE=str(POLL_MAX),
        RESOURCE_LEASE_BACKOFF_MAX=str(POLL_MAX),
    )
    procs = []
    for index in range(CONTENDERS):
        argv = [
            "-m",
            "project.bench.liveness_contender",
            "--index",
            str(index),
            "--rows",
            ",".join(ROWS),
            "--cycles",
            str(CYCLES),
            "--hold",
            str(hold),
            "--prefix",
            PREFIX,
            "--out",
            str(out),
            "--go",
            str(go),
            "--worker-poll",
            str(POLL_MAX),
        ]
        if no_wakeups:
            argv.append("--no-wakeups")
        procs.append(
            subprocess.Popen(
                [sys.executable, *argv],
                env=env,
                cwd=Path(__file__).resolve().parent.parent,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stderr is not None
            line = proc.stdout.readline()
            assert line.strip() == "READY", (line, proc.stderr.read() if proc.poll() is not None else "")
        go.touch()
        started = time.monotonic()
        last_grant: dict[str, float] = {row: started for row in ROWS}
        counts: dict[str, int] = {row: 0 for row in ROWS}
        stalled: dict[str, float] = {}
        lines: list[str] = []
        wanted = CONTENDERS * CYCLES
        while time.monotonic() - started < DEADLINE:
            grants, errors = _read(out)
            now = time.monotonic()
            for row in ROWS:
                if row in stalled or row in errors:
                    continue
                n = len(grants.get(row, ()))
                if n != counts[row]:
                    counts[row], last_grant[row] = n, now
                elif n < wanted and now - last_grant[row] > STALL:
                    stalled[row] = now - last_grant[row]
            unfinished = [r for r in ROWS if len(grants.get(r, ())) < wanted and r not in stalled and r not in errors]
            if not unfinished:
                break
            time.sleep(0.2)
        if stalled and not no_wakeups:
            # Where each contender is (its threads' stacks on its stderr), and what the line
            # holds, for the report.
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGUSR1)
            time.sleep(0.5)
            lines = _lines()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        stderr = [proc.communicate(timeout=30)[1] for proc in procs]
    grants, errors = _read(out)
    report: dict[str, Any] = {}
    for row in ROWS:
        events = sorted(grants.get(row, ()), key=lambda g: g[2])
        # The gap between a release and the next grant that waited for it (asked before it).
        gaps = [
            (nxt[2] - cur[3]) / 1e9
            for cur, nxt in zip(events, events[1:], strict=False)
            if nxt[1] < cur[3] and nxt[2] >= cur[3]
        ]
        report[row] = {
            "grants": len(events),
            "errors": errors.get(row, []),
            "stalled": stalled.get(row),
            "max_gap": max(gaps, default=0.0),
        }
    report["_stderr"] = [s[-6000:] for s in stderr if "Traceback" in s or "Thread 0x" in s]
    report["_lines"] = lines
    (tmp_path / "report.json").write_text(json.dumps(report, indent=1, default=str))
    return report


def test_every_waiter_is_woken_at_release(tmp_path: Path) -> None:
    report = run_matrix(tmp_path, no_wakeups=False)
    wanted = CONTENDERS * CYCLES
    failed = {
        row: info
        for row, info in report.items()
        if not row.startswith("_") and (info["grants"] != wanted or info["errors"] or info["stalled"])
    }
    assert not failed, (failed, report["_lines"], report["_stderr"])


def test_negative_control_a_missed_wake_up_stalls_every_row(tmp_path: Path) -> None:
    report = run_matrix(tmp_path, no_wakeups=True, hold=CONTROL_HOLD)
    caught = {row for row in ROWS if report[row]["stalled"]}
    missed = {row: report[row] for row in ROWS if row not in caught}
    assert not missed, ("rows the check did not catch with their wake-ups cut", missed, report["_stderr"])
