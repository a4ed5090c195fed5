"""The dispenser part of the main job: several workers drain a pool of work items while one
of them is SIGKILLed mid-batch; its items are finished by the others after its ttl, and the
summary proves every item was done exactly once.

python manage.py demo_dispenser [--items 200] [--workers 3] [--ttl 3]
"""

from __future__ import annotations

import os
import signal
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
from project.demo.workers import DISPENSER
from resource_lease import Dispenser
from resource_lease.models import DispenserItem

WORKER = "project.demo.workers.DemoWorker"


def read_ledger(directory: Path) -> tuple[Counter[str], Counter[str], dict[str, str]]:
    accepted: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    by: dict[str, str] = {}
    for path in directory.glob("ledger-*"):
        for line in path.read_text().splitlines():
            verdict, key, _fence, worker = line.split(" ")
            (accepted if verdict == "accepted" else refused)[key] += 1
            if verdict == "accepted":
                by[key] = worker
    return accepted, refused, by


class Command(BaseCommand):
    help = "Drain a dispenser with several worker processes, SIGKILL one mid-batch, prove exactly-once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--items", type=positive_int, default=200)
        parser.add_argument("--workers", type=positive_int, default=3)
        parser.add_argument("--ttl", type=positive, default=3.0, help="claim ttl of the workers (seconds)")

    def worker(self, name: str, ledger: Path, *, batch: int, hold: float, ttl: float) -> subprocess.Popen[str]:
        env = {
            **os.environ,
            "DEMO_DISPENSER_LEDGER": str(ledger),
            "DEMO_DISPENSER_BATCH": str(batch),
            "DEMO_DISPENSER_HOLD": str(hold),
            "DEMO_DISPENSER_TTL": str(ttl),
            "RESOURCE_LEASE_LOG": "WARNING",
        }
        args = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "run_worker", WORKER, "--name", name]
        return subprocess.Popen([*args, "--until-empty", "-v", "0"], env=env, text=True)

    def handle(self, *args: Any, items: int, workers: int, ttl: float, **options: Any) -> None:
        db = settings.DATABASES["default"]
        self.stdout.write(
            self.style.MIGRATE_HEADING(f"Dispenser demo on {db['ENGINE'].rsplit('.', 1)[-1]} {db['NAME']}")
        )
        call_command("migrate", verbosity=0)
        DispenserItem.objects.filter(dispenser=DISPENSER).delete()  # the demo's own items, from a previous run
        dispenser = Dispenser(DISPENSER, ttl=ttl)
        keys = [f"job-{i:04d}" for i in range(items)]
        dispenser.put({k: {"n": i} for i, k in enumerate(keys)})
        self.stdout.write(f"Put {items} items into dispenser {DISPENSER!r}.")

        ledger = Path(tempfile.mkdtemp(prefix="demo-dispenser-"))
        # The victim takes a big batch and works slowly, so it dies holding claims.
        victim = self.worker("victim", ledger, batch=20, hold=0.1, ttl=ttl)
        deadline = time.monotonic() + 60
        while sum(read_ledger(ledger)[0].values()) < 3:
            if time.monotonic() > deadline or victim.poll() is not None:
                raise CommandError("the victim worker did not start working")
            time.sleep(0.05)
        others = [self.worker(f"worker-{i + 1}", ledger, batch=5, hold=0.01, ttl=ttl) for i in range(workers)]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        killed_at = time.monotonic()
        orphaned = list(
            DispenserItem.objects.filter(dispenser=DISPENSER, worker="victim", state=DispenserItem.ASSIGNED)
            .order_by("id")
            .values_list("key", flat=True)
        )
        done_by_victim = sum(1 for w in read_ledger(ledger)[2].values() if w == "victim")
        self.stdout.write(
            f"Killed the victim (SIGKILL) after {done_by_victim} items, holding {len(orphaned)} claimed but "
            f"unfinished items; {workers} workers drain the pool."
        )
        for proc in others:
            if proc.wait(timeout=ttl + 300) != 0:
                raise CommandError(f"a worker failed with exit code {proc.returncode}")
        drained = time.monotonic() - killed_at

        accepted, refused, by = read_ledger(ledger)
        duplicates = {k: n for k, n in accepted.items() if n > 1}
        missing = sorted(set(keys) - set(accepted))
        counts = dispenser.counts()
        rows = {i.key: i for i in DispenserItem.objects.filter(dispenser=DISPENSER, key__in=orphaned)}
        taken_over = [k for k in orphaned if by.get(k, "victim") != "victim" and rows[k].state == DispenserItem.DONE]
        self.stdout.write(self.style.MIGRATE_HEADING("Summary"))
        for name, n in sorted(Counter(by.values()).items()):
            self.stdout.write(f"  {name}: {n} items done")
        self.stdout.write(
            f"  the victim's {len(orphaned)} orphaned items: {len(taken_over)} finished by the others after its "
            f"ttl of {ttl:g}s (each on its 2nd claim: attempts "
            f"{sorted({rows[k].attempts for k in orphaned}) if orphaned else []}); drained {drained:.1f}s after the kill"
        )
        self.stdout.write(f"  dispenser counts: {counts}")
        self.stdout.write(
            f"  items: {items}, done exactly once: {sum(1 for n in accepted.values() if n == 1)}, "
            f"done twice or more: {len(duplicates)}, never done: {len(missing)}, refused outcomes: {sum(refused.values())}"
        )
        ok = (
            not duplicates
            and not missing
            and counts == {"pending": 0, "assigned": 0, "done": items, "failed": 0}
            and len(taken_over) == len(orphaned)
            and orphaned
        )
        if not ok:
            raise CommandError("the dispenser demo failed: not every item was done exactly once")
        self.stdout.write(self.style.SUCCESS(f"Every one of the {items} items was done exactly once."))
