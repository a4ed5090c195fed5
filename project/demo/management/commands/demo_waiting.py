"""The waiting demo: more processes than resources, served in line; an rwlock's readers and a
writer; a shared counter added to by every process at once.

    python manage.py demo_waiting [--workers 6] [--pool 2] [--seconds 3]

1. The line: ``--workers`` processes share a pool of ``--pool`` GPUs. Each loops: take one
   (``acquire(timeout=None)``), hold it 30 ms, release, and ask again at once. A releaser that
   asks again goes behind those already waiting, so every process gets about the same number
   of turns. The summary gives each process's turns, Jain's fairness index (1.0: equal), the
   longest wait, and checks that no GPU was held by two processes at once.
2. The rwlock: three readers and one writer loop on ``rwlock("demo:model")`` for the same time;
   the writer is not starved by the readers (writers first in the line), and no turn overlaps
   a write.
3. The counter: every process adds 1 to ``counter("demo:jobs")`` 100 times, all at once; the
   final value is exact (each ``add`` is one statement).

It runs on the embedded SQLite by default, and on MariaDB or PostgreSQL with DATABASE_URL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from project.arguments import positive, positive_int

KIND = "demo-gpu"
RW_NAME = "demo:model"
COUNTER = "demo:jobs"
HOLD = 0.03
ADDS = 100


def jain(values: list[int]) -> float:
    """Jain's fairness index: 1.0 when every value is equal, 1/n when one process had it all."""
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values)) if any(values) else 0.0


def overlaps(turns: list[dict[str, Any]]) -> int:
    turns = sorted(turns, key=lambda t: t["start"])
    return sum(1 for a, b in zip(turns, turns[1:], strict=False) if b["start"] < a["end"])


class Command(BaseCommand):
    help = "Processes waiting in line for a small pool, an rwlock's readers and writer, a shared counter."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--workers", type=positive_int, default=6, help="processes on the pool (default 6)")
        parser.add_argument("--pool", type=positive_int, default=2, help="GPUs in the pool (default 2)")
        parser.add_argument("--seconds", type=positive, default=3.0, help="how long each part runs (default 3)")
        # Internal: the roles of the child processes.
        parser.add_argument("--role", choices=["line", "reader", "writer", "counter"], help="(internal)")
        parser.add_argument("--ledger", default="", help="(internal) where a child records its turns")

    def handle(self, *args: Any, workers: int, pool: int, seconds: float, **options: Any) -> None:
        if options["role"]:
            return self._child(options["role"], Path(options["ledger"]), seconds)
        call_command("migrate", verbosity=0)
        from resource_lease.models import Resource

        Resource.objects.filter(kind=KIND).delete()
        Resource.objects.bulk_create(Resource(kind=KIND, name=f"gpu-{i}") for i in range(pool))
        with tempfile.TemporaryDirectory(prefix="demo-waiting-") as scratch:
            ok = self._line(Path(scratch), workers, pool, seconds)
            ok = self._rwlock(Path(scratch), seconds) and ok
            ok = self._counter(Path(scratch), workers) and ok
        self.stdout.write(
            self.style.SUCCESS("  OK: served in line, readers and a writer kept apart, no lost update")
            if ok
            else self.style.ERROR("  FAILED: see above")
        )
        if not ok:
            raise CommandError("the waiting demo found a violation")

    # -- the parent ---------------------------------------------------------------------

    def _start(self, role: str, ledger: Path, seconds: float) -> subprocess.Popen[str]:
        manage = str(Path(settings.BASE_DIR) / "manage.py")
        args = [
            sys.executable,
            manage,
            "demo_waiting",
            "--role",
            role,
            "--ledger",
            str(ledger),
            "--seconds",
            str(seconds),
        ]
        return subprocess.Popen(args, text=True, stdout=subprocess.PIPE)

    def _run(self, started: list[subprocess.Popen[str]], ledger: Path, seconds: float) -> None:
        """Let them all start at once (each says when it is ready), then wait for them."""
        for proc in started:
            assert proc.stdout is not None
            proc.stdout.readline()
        (ledger / "go").write_text(str(time.time()))
        for proc in started:
            proc.wait(timeout=seconds + 120)
            if proc.returncode != 0:
                raise CommandError(f"a demo process failed with exit status {proc.returncode}")

    @staticmethod
    def _turns(ledger: Path) -> list[dict[str, Any]]:
        return [json.loads(line) for path in ledger.glob("*.jsonl") for line in path.read_text().splitlines()]

    def _line(self, scratch: Path, workers: int, pool: int, seconds: float) -> bool:
        ledger = scratch / "line"
        ledger.mkdir()
        self.stdout.write(
            f"{workers} processes on a pool of {pool} GPUs for {seconds:g}s, each holding {HOLD * 1000:g} ms"
        )
        self._run([self._start("line", ledger, seconds) for _ in range(workers)], ledger, seconds)
        turns = self._turns(ledger)
        per_process = Counter(t["pid"] for t in turns)
        counts = sorted(per_process.values())
        twice = sum(overlaps([t for t in turns if t["row"] == row]) for row in {t["row"] for t in turns})
        worst = max((t["waited"] for t in turns), default=0.0)
        held = sum(t["end"] - t["start"] for t in turns)
        span = max(t["end"] for t in turns) - min(t["start"] for t in turns)
        fair = jain(counts + [0] * (workers - len(counts)))
        self.stdout.write("\nSummary (waiting in line)")
        self.stdout.write(f"  turns per process: {counts} ({len(turns)} in all)")
        self.stdout.write(f"  Jain's fairness: {fair:.3f} (1.0: equal turns); longest wait {worst:.2f}s")
        self.stdout.write(f"  the GPUs were held {held / (pool * span):.0%} of the time")
        self.stdout.write(f"  a GPU held by two processes at once: {twice} times")
        return twice == 0 and len(per_process) == workers

    def _rwlock(self, scratch: Path, seconds: float) -> bool:
        ledger = scratch / "rw"
        ledger.mkdir()
        self._run(
            [self._start("reader", ledger, seconds) for _ in range(3)] + [self._start("writer", ledger, seconds)],
            ledger,
            seconds,
        )
        turns = sorted(self._turns(ledger), key=lambda t: t["start"])
        writes = [t for t in turns if t["mode"] == "write"]
        reads = [t for t in turns if t["mode"] == "read"]
        crossed = sum(
            1 for w in writes for t in turns if t is not w and t["start"] < w["end"] and w["start"] < t["end"]
        )
        fences = [t["fence"] for t in turns]
        self.stdout.write("\nSummary (rwlock)")
        self.stdout.write(f"  {len(reads)} reads by 3 readers, {len(writes)} writes by 1 writer")
        self.stdout.write(
            f"  turns overlapping a write: {crossed}; fences {fences[0] if fences else '-'}..{max(fences, default='-')}"
        )
        return crossed == 0 and len(writes) > 0 and len(reads) > 0

    def _counter(self, scratch: Path, workers: int) -> bool:
        from resource_lease import counter

        before = counter(COUNTER).value()
        ledger = scratch / "counter"
        ledger.mkdir()
        self._run([self._start("counter", ledger, 1.0) for _ in range(workers)], ledger, 1.0)
        after = counter(COUNTER).value()
        expected = workers * ADDS
        self.stdout.write("\nSummary (counter)")
        self.stdout.write(
            f"  {workers} processes added 1, {ADDS} times each, all at once: {after - before} (expected {expected})"
        )
        return after - before == expected

    # -- the children -------------------------------------------------------------------

    def _child(self, role: str, ledger: Path, seconds: float) -> None:
        from resource_lease import acquire, counter, rwlock

        out = ledger / f"{os.getpid()}.jsonl"
        self.stdout.write("ready")
        self.stdout.flush()
        while not (ledger / "go").exists():
            time.sleep(0.005)
        if role == "counter":
            jobs = counter(COUNTER)
            for _ in range(ADDS):
                jobs.add(1)
            return
        end = time.monotonic() + seconds
        records = []
        while time.monotonic() < end:
            asked = time.monotonic()
            if role == "line":
                lease = acquire(KIND, ttl=10, timeout=None)
            elif role == "reader":
                lease = rwlock(RW_NAME).read(ttl=10, timeout=None)
            else:
                lease = rwlock(RW_NAME).write(ttl=10, timeout=None)
            start = time.monotonic()
            time.sleep(HOLD)
            records.append(
                {
                    "pid": os.getpid(),
                    "row": lease.resource.pk,
                    "fence": lease.fence,
                    "mode": {"line": "take", "reader": "read", "writer": "write"}[role],
                    "waited": start - asked,
                    "start": time.time() - (time.monotonic() - start),
                    "end": time.time(),
                }
            )
            lease.release()
        out.write_text("".join(json.dumps(r) + "\n" for r in records))
