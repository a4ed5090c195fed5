"""The named-lock demo: several processes share one lock through the database, one holder is
SIGKILLed, and the summary shows what the lock guaranteed.

    python manage.py demo_locks [--workers 4] [--seconds 5] [--ttl 2]

A victim process takes ``lock("demo:nightly-report")`` and is killed with SIGKILL while it
holds it. The workers wait for the lock and then take turns under it. Each turn runs a
deliberately unsafe read-sleep-write counter and records (fence, start, end). The summary
checks that no two turns overlapped, that fences went strictly up, that the counter equals
the number of turns (no lost update), and when the dead holder's lock came back (ttl plus at
most one retry interval; nobody cleaned up). It runs on the embedded SQLite by default.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from project.arguments import positive

NAME = "demo:nightly-report"


class Command(BaseCommand):
    help = "Processes sharing one named lock; one holder SIGKILLed; a summary of what held."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--workers", type=int, default=4)
        parser.add_argument("--seconds", type=positive, default=5.0, help="how long the workers take turns")
        parser.add_argument("--ttl", type=positive, default=2.0)
        # Internal: the roles of the child processes.
        parser.add_argument("--victim", action="store_true", help="(internal) hold the lock until killed")
        parser.add_argument("--worker-dir", default="", help="(internal) take turns, recording into this folder")

    def handle(self, *args: Any, workers: int, seconds: float, ttl: float, **options: Any) -> None:
        if options["victim"]:
            return self._victim(ttl)
        if options["worker_dir"]:
            return self._worker(Path(options["worker_dir"]), seconds, ttl)
        if workers < 1:
            raise CommandError("--workers must be at least 1")
        call_command("migrate", verbosity=0)
        with tempfile.TemporaryDirectory(prefix="demo-locks-") as scratch:
            self._run(Path(scratch), workers, seconds, ttl)

    # -- the parent ---------------------------------------------------------------------

    def _manage(self, *args: str) -> subprocess.Popen[str]:
        manage = str(Path(settings.BASE_DIR) / "manage.py")
        return subprocess.Popen([sys.executable, manage, "demo_locks", *args], text=True, stdout=subprocess.PIPE)

    def _run(self, scratch: Path, workers: int, seconds: float, ttl: float) -> None:
        from resource_lease import LockHeld, lock

        victim = self._manage("--victim", "--ttl", str(ttl))
        assert victim.stdout is not None
        held = json.loads(victim.stdout.readline())
        self.stdout.write(f"victim {held['holder']} holds {NAME!r} (fence {held['fence']}, ttl {ttl:g}s)")
        try:
            lock(NAME, timeout=0)
        except LockHeld as exc:
            self.stdout.write(f"a second caller gets LockHeld: {exc}")
        procs = [
            self._manage("--worker-dir", str(scratch), "--seconds", str(seconds), "--ttl", str(ttl))
            for _ in range(workers)
        ]
        for proc in procs:  # each says so once it is about to wait for the lock
            assert proc.stdout is not None
            proc.stdout.readline()
        time.sleep(0.5)
        killed_at = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        self.stdout.write(f"SIGKILLed the victim (pid {victim.pid}) while it held the lock; nobody cleans up")
        for proc in procs:
            proc.communicate(timeout=seconds + 120)
            if proc.returncode != 0:
                raise CommandError(f"a worker failed with exit status {proc.returncode}")
        self._summary(scratch, held, killed_at, ttl)

    def _summary(self, scratch: Path, held: dict[str, Any], killed_at: float, ttl: float) -> None:
        from resource_lease.models import Resource
        from resource_lease.recipes.locks import LOCK_KIND

        turns = sorted(
            (json.loads(line) for path in scratch.glob("ledger-*") for line in path.read_text().splitlines()),
            key=lambda t: t["start"],
        )
        if not turns:
            raise CommandError("no worker got the lock")
        overlaps = sum(1 for a, b in zip(turns, turns[1:], strict=False) if b["start"] < a["end"])
        fences = [t["fence"] for t in turns]
        increasing = all(b > a for a, b in zip(fences, fences[1:], strict=False))
        counter = int((scratch / "counter").read_text())
        first = turns[0]
        back_after = first["granted"] - killed_at
        row = Resource.objects.get(kind=LOCK_KIND, name=NAME)
        workers = len({t["pid"] for t in turns})
        lines = [
            f"turns under the lock: {len(turns)} by {workers} processes, fences {fences[0]}..{fences[-1]}",
            f"overlapping turns: {overlaps}",
            f"fences strictly increasing: {'yes' if increasing else 'NO'}",
            f"unsafe counter: {counter} for {len(turns)} turns ({'no lost update' if counter == len(turns) else 'LOST UPDATES'})",
            f"the dead holder's lock came back {back_after:.2f}s after the kill (ttl {ttl:g}s + at most 1s of retry),"
            f" taken over from {first['previous_holder']} {'(the victim)' if first['previous_holder'] == held['holder'] else ''}",
            f"the lock's row now: fence {row.fence}, held by nobody" if not row.grant_token else "",
        ]
        ok = overlaps == 0 and increasing and counter == len(turns) and back_after <= ttl + 1.0 + 2.0
        self.stdout.write("\nSummary (named locks)")
        for line in filter(None, lines):
            self.stdout.write(f"  {line}")
        self.stdout.write(
            self.style.SUCCESS("  OK: one holder at a time, fenced, and a dead holder's lock came back")
            if ok
            else self.style.ERROR("  FAILED: see above")
        )
        if not ok:
            raise CommandError("the named-lock demo found a violation")

    # -- the children -------------------------------------------------------------------

    def _victim(self, ttl: float) -> None:
        from resource_lease import lock

        lease = lock(NAME, ttl=ttl, timeout=30)
        self.stdout.write(json.dumps({"holder": lease.holder, "fence": lease.fence}))
        self.stdout.flush()
        while True:
            time.sleep(60)

    def _worker(self, scratch: Path, seconds: float, ttl: float) -> None:
        from resource_lease import LockHeld, lock

        end: float | None = None
        self.stdout.write("waiting")
        self.stdout.flush()
        ledger = scratch / f"ledger-{os.getpid()}"
        counter = scratch / "counter"
        while end is None or time.monotonic() < end:
            try:
                lease = lock(NAME, ttl=ttl, timeout=30)
            except LockHeld:
                continue
            granted = time.monotonic()
            end = end or granted + seconds  # the turns start once the dead holder's lock is back
            with lease:
                start = time.monotonic()
                value = int(counter.read_text()) if counter.exists() else 0
                time.sleep(0.02)  # unsafe unless exclusive: read, wait, write back
                counter.write_text(str(value + 1))
                record = {
                    "pid": os.getpid(),
                    "fence": lease.fence,
                    "granted": granted,
                    "start": start,
                    "end": time.monotonic(),
                    "previous_holder": lease.resource.previous_holder if lease.resource.took_over else "",
                }
            with open(ledger, "a") as f:
                f.write(json.dumps(record) + "\n")
            time.sleep(0.01)
