"""The main job: a pool, several worker processes leasing it, one killed, a summary.

    python manage.py demo [--workers 6] [--resources 4] [--seconds 6]

Runs on whatever DATABASE_URL says (default: the embedded SQLite file).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from project.arguments import positive_int
from resource_lease import acquire, pool
from resource_lease.models import Resource

KIND = "demo-proxy"
SAMPLE = Path(__file__).resolve().parents[3] / "sample_proxies.txt"


class Command(BaseCommand):
    help = "Run the resource_lease demo: seed a pool, race workers on it, kill one, summarise."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--workers", type=positive_int, default=6)
        parser.add_argument("--resources", type=positive_int, default=4)
        parser.add_argument("--seconds", type=float, default=6.0)
        parser.add_argument("--ttl", type=float, default=2.0)

    def manage(self, *args: str, **popen: Any) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), *args], text=True, **popen)

    def handle(self, *args: Any, workers: int, resources: int, seconds: float, ttl: float, **options: Any) -> None:
        if not 0 < ttl < seconds:
            raise CommandError("--ttl must be > 0 and shorter than --seconds")
        db = settings.DATABASES["default"]
        self.stdout.write(self.style.MIGRATE_HEADING(f"Database: {db['ENGINE'].rsplit('.', 1)[-1]} {db['NAME']}"))
        call_command("migrate", verbosity=0)

        # The pool: the sample proxy list, loaded by the operator's command (re-running it adds
        # no duplicates); all but --resources are then quarantined so the workers compete.
        call_command("seed_proxies", str(SAMPLE), kind=KIND, replace=True, stdout=self.stdout)
        kind_rows = Resource.objects.filter(kind=KIND)
        pool.restore(kind_rows)
        keep = list(kind_rows.order_by("name").values_list("pk", flat=True)[:resources])
        held_back = pool.quarantine(
            kind_rows.exclude(pk__in=keep), seconds=3600, reason="demo: held back so the workers compete"
        )
        self.stdout.write(f"{len(keep)} resources of kind {KIND!r} in service, {held_back} quarantined.")

        # One process takes a lease and is then killed with SIGKILL: no release, no cleanup.
        victim = self.manage("demo_worker", "--kind", KIND, "--ttl", str(ttl), "--hold-forever", stdout=subprocess.PIPE)
        assert victim.stdout is not None
        held = json.loads(victim.stdout.readline())
        self.stdout.write(f"Process {held['pid']} holds {held['held']} (fence {held['fence']}), auto-renewing.")

        procs = [
            self.manage(
                "demo_worker", "--kind", KIND, "--seconds", str(seconds), "--ttl", str(ttl), stdout=subprocess.PIPE
            )
            for _ in range(workers)
        ]
        self.stdout.write(f"Started {workers} workers on {resources} resources for {seconds:g}s.")
        time.sleep(min(1.0, seconds / 4))
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        killed_at = time.monotonic()
        dead_expiry = Resource.objects.get(kind=KIND, name=held["held"]).busy_before
        left = (dead_expiry - pool.database_now()).total_seconds()
        self.stdout.write(
            f"Killed process {held['pid']} with SIGKILL while it held {held['held']}; "
            f"its last renewal keeps the lease {left:.2f}s more (by the database's clock)."
        )

        came_back = None
        while came_back is None and time.monotonic() - killed_at < ttl + 30:
            row = Resource.objects.get(kind=KIND, name=held["held"])
            if row.fence > held["fence"] and row.acquired_at is not None:
                came_back = time.monotonic() - killed_at
                after_expiry = (row.acquired_at - dead_expiry).total_seconds()
                self.stdout.write(
                    f"{row.name} came back {came_back:.2f}s after the kill, {after_expiry:.2f}s after the dead "
                    f"lease expired (never before): taken over by {row.holder} with fence {row.fence} "
                    f"(took_over={row.took_over})."
                )
                if after_expiry < 0:
                    raise CommandError("the resource was granted again before the dead holder's lease expired")
            else:
                time.sleep(0.05)
        if came_back is None:
            raise CommandError(f"{held['held']} did not come back after the holder was killed")

        reports = []
        for proc in procs:
            out, _ = proc.communicate(timeout=seconds + 60)
            if proc.returncode != 0:
                raise CommandError(f"a worker failed with exit code {proc.returncode}")
            reports.append(json.loads(out.strip().splitlines()[-1]))

        grants = [tuple(g) for report in reports for g in report["grants"]]
        per_resource = Counter(name for name, _ in grants)
        fences_unique = len(set(grants)) == len(grants)
        self.stdout.write(self.style.MIGRATE_HEADING("Summary"))
        for report in reports:
            self.stdout.write(f"  worker {report['pid']}: {len(report['grants'])} grants")
        for name, n in sorted(per_resource.items()):
            self.stdout.write(f"  {name}: granted {n} times")
        self.stdout.write(f"  total grants: {len(grants)}; every (resource, fence) granted once: {fences_unique}")
        # Nothing left held after the workers released everything.
        leftover = acquire(KIND, ttl=5, timeout=0)
        leftover.release()
        counts = pool.counts(Resource.objects.filter(kind=KIND))[KIND]
        self.stdout.write(f"  pool now: {counts}")
        if not fences_unique:
            raise CommandError("a (resource, fence) pair was granted twice")
        self.stdout.write(self.style.MIGRATE_HEADING("The pool as an operator sees it (inspect_pool)"))
        call_command("inspect_pool", kind=KIND, stdout=self.stdout)
        self.stdout.write(self.style.SUCCESS("Demo finished."))
        self.stdout.write(
            "To see the pool in the admin: .venv/bin/python manage.py createsuperuser, then "
            ".venv/bin/python manage.py runserver and open http://127.0.0.1:8000/admin/"
        )
