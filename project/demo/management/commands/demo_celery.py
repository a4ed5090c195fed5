"""The main job's Celery part: a worker, tasks that each hold a proxy while they run, a summary.

    python manage.py demo_celery [--tasks 20] [--work 0.3] [--concurrency 4] [--pool prefork] [--json]

Starts ``celery -A project worker`` as a subprocess on a queue of its own, submits ``--tasks``
``project.tasks.crawl`` tasks (each leases a resource of kind ``proxy`` for its run), waits
for them, stops the worker (warm shutdown) and checks the ledger the tasks return: no proxy
served two tasks at once, every task finished, no lease is left held.

Runs on the embedded defaults (SQLite file, kombu's filesystem transport under var/); set
DATABASE_URL and CELERY_BROKER_URL (and CELERY_RESULT_BACKEND) for MariaDB/PostgreSQL and Redis.
If the ``proxy`` pool is empty, ``--resources`` example proxies are added to it first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, cast

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from project.arguments import positive_int
from resource_lease import pool
from resource_lease.models import Resource

KIND = "proxy"  # project.tasks.crawl's lease_kind
POOLS = ("prefork", "threads", "solo")


def seconds(value: str) -> float:
    number = float(value)
    if not 0 < number < float("inf"):
        raise ValueError(value)
    return number


def overlaps(records: list[dict[str, Any]]) -> tuple[int, int]:
    """(overlapping pairs, fences out of order) among the grants of each resource."""
    by_resource: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        by_resource[rec["resource_id"]].append(rec)
    overlapping = disorder = 0
    for grants in by_resource.values():
        grants.sort(key=lambda g: g["start_ns"])
        for before, after in zip(grants, grants[1:], strict=False):
            overlapping += after["start_ns"] < before["end_ns"]
            disorder += after["fence"] <= before["fence"]
    return overlapping, disorder


class Command(BaseCommand):
    help = "Run Celery tasks that each hold a leased proxy: start a worker, submit, wait, summarise."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tasks", type=positive_int, default=20, help="how many crawl tasks (default 20)")
        parser.add_argument("--work", type=seconds, default=0.3, help="seconds each task holds its proxy")
        parser.add_argument("--concurrency", type=positive_int, default=4, help="worker pool size (default 4)")
        parser.add_argument(
            "--pool", dest="pool_type", choices=POOLS, default="prefork", help="the worker's pool (default prefork)"
        )
        parser.add_argument(
            "--resources", type=positive_int, default=3, help="example proxies to add if the pool is empty"
        )
        parser.add_argument("--timeout", type=seconds, default=300.0, help="seconds to wait for all tasks")
        parser.add_argument("--json", dest="as_json", action="store_true", help="print the summary as JSON")

    def handle(
        self,
        *args: Any,
        tasks: int,
        work: float,
        concurrency: int,
        pool_type: str,
        resources: int,
        timeout: float,
        as_json: bool,
        **options: Any,
    ) -> None:
        self.quiet = as_json or options["verbosity"] == 0
        call_command("migrate", verbosity=0)
        db = settings.DATABASES["default"]
        self.say(f"Database: {db['ENGINE'].rsplit('.', 1)[-1]} {db['NAME']}")
        self.say(f"Broker: {settings.CELERY_BROKER_URL.split('@')[-1]}; results: {settings.CELERY_RESULT_BACKEND}")
        self.seed(resources)

        queue = f"demo-celery-{uuid.uuid4().hex[:8]}"
        log_path = Path(settings.VAR_DIR) / "demo_celery-worker.log"
        if pool_type == "solo":
            concurrency = 1  # the solo pool runs one task at a time whatever -c says
        worker = self.start_worker(queue, pool_type, concurrency, log_path)
        started = time.monotonic()
        try:
            records, failures = self.run_tasks(queue, tasks, work, timeout, worker, log_path)
        finally:
            code = self.stop_worker(worker)
        elapsed = time.monotonic() - started

        overlapping, disorder = overlaps(records)
        counts = pool.counts(Resource.objects.filter(kind=KIND)).get(KIND, {})
        summary = {
            "tasks": tasks,
            "succeeded": len(records),
            "failed": len(failures),
            "failures": failures[:5],
            "seconds": round(elapsed, 2),
            "pool": pool_type,
            "concurrency": concurrency,
            "per_resource": dict(sorted(Counter(r["resource"] for r in records).items())),
            "retries_while_busy": sum(r["attempts"] - 1 for r in records),
            "overlapping_grants": overlapping,
            "fences_out_of_order": disorder,
            "held_after": counts.get("held", 0),
            "worker_exit_code": code,
            "worker_log": str(log_path),
        }
        ok = not failures and not overlapping and not disorder and summary["held_after"] == 0 and code == 0
        if as_json:
            self.stdout.write(json.dumps(summary | {"ok": ok}, indent=2))
        else:
            self.report(summary)
        if not ok:
            raise CommandError(f"the Celery demo found a problem (worker log: {log_path})")
        self.say(self.style.SUCCESS("Celery demo finished."))

    # -- steps -------------------------------------------------------------------------

    def say(self, text: str) -> None:
        if not self.quiet:
            self.stdout.write(text)

    def seed(self, resources: int) -> None:
        have = Resource.objects.filter(kind=KIND, enabled=True).count()
        if have:
            self.say(f"Pool {KIND!r}: {have} enabled resources.")
            return
        for i in range(resources):
            Resource.objects.get_or_create(
                kind=KIND, name=f"demo-celery-{i}", defaults={"data": {"url": f"http://192.0.2.{i + 101}:3128"}}
            )
        self.say(f"Pool {KIND!r} was empty: added {resources} example proxies (demo-celery-*).")

    def start_worker(self, queue: str, pool: str, concurrency: int, log_path: Path) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env["DJANGO_SETTINGS_MODULE"] = os.environ.get("DJANGO_SETTINGS_MODULE") or "project.settings"
        base_dir = str(settings.BASE_DIR)
        env["PYTHONPATH"] = base_dir + os.pathsep + env.get("PYTHONPATH", "")
        command = [sys.executable, "-m", "celery", "-A", "project", "worker", "-Q", queue, "-n", f"{queue}@%h"]
        command += ["-P", pool, "-c", str(concurrency), "--without-mingle", "--without-gossip", "--without-heartbeat"]
        command += ["-l", "info"]
        self.say(f"Starting a Celery worker ({pool}, concurrency {concurrency}); log: {log_path}")
        with open(log_path, "wb") as log:
            # A session of its own: the worker and its pool processes never get our terminal's signals.
            return subprocess.Popen(
                command, cwd=base_dir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def run_tasks(
        self, queue: str, tasks: int, work: float, timeout: float, worker: subprocess.Popen[bytes], log_path: Path
    ) -> tuple[list[dict[str, Any]], list[str]]:
        from project.tasks import crawl

        results = [
            crawl.apply_async(args=(f"https://example.com/page/{i}",), kwargs={"work": work}, queue=queue)
            for i in range(tasks)
        ]
        self.say(f"Submitted {tasks} crawl tasks, each holding a proxy for {work:g}s.")
        deadline = time.monotonic() + timeout
        records: list[dict[str, Any]] = []
        failures: list[str] = []
        pending = list(results)
        said = 0.0
        while pending:
            if worker.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise CommandError(f"the worker exited with code {worker.returncode}:\n{tail}")
            if time.monotonic() > deadline:
                raise CommandError(f"{len(pending)} of {tasks} tasks did not finish within {timeout:g}s")
            still = []
            for result in pending:
                if not result.ready():
                    still.append(result)
                elif result.successful():
                    records.append(cast(dict[str, Any], result.result))
                else:
                    failures.append(f"{result.id}: {result.result!r}")
            if len(still) != len(pending) and (not still or time.monotonic() - said >= 1.0):
                self.say(f"  {tasks - len(still)}/{tasks} done")
                said = time.monotonic()
            pending = still
            time.sleep(0.1)
        return records, failures

    def stop_worker(self, worker: subprocess.Popen[bytes]) -> int:
        # Warm shutdown: the worker finishes what it runs (releasing those leases) and exits.
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
        try:
            return worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
            return -signal.SIGKILL

    def report(self, summary: dict[str, Any]) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING("Summary"))
        self.stdout.write(
            f"  {summary['succeeded']}/{summary['tasks']} tasks succeeded, {summary['failed']} failed, "
            f"in {summary['seconds']:.1f}s ({summary['pool']} pool, concurrency {summary['concurrency']})"
        )
        for failure in summary["failures"]:
            self.stdout.write(f"  failed: {failure}")
        for name, n in summary["per_resource"].items():
            self.stdout.write(f"  {name}: served {n} tasks")
        self.stdout.write(
            f"  retries while every proxy was busy: {summary['retries_while_busy']} (the worker slot was freed each time)"
        )
        self.stdout.write(
            f"  same proxy held by two tasks at once: {summary['overlapping_grants']}; "
            f"fences out of order: {summary['fences_out_of_order']}"
        )
        self.stdout.write(f"  leases still held after the run: {summary['held_after']}")
