"""``manage.py dispenser_bench``: what ``Dispenser.assign`` costs as the pool grows, and how
many items per second worker processes drain.

    manage.py dispenser_bench [--sizes 1000,1000000] [--rounds 200] [--workers 1,4,8] [--batches 1,10]
        [--drain-items 2000] [--json]

Figures only, never timed assertions. The assign figures are from one process: each round
assigns ``--limit`` items and gives them back, so the pool keeps its size. The drain figures
come from the database's own timestamps (first claim to last outcome), so process start-up
is not counted.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection
from django.db.models import Max, Min

from resource_lease import Dispenser
from resource_lease.db.operations import ops
from resource_lease.models import DispenserItem

FILL_CHUNK = 5_000


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise CommandError(f"not a list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise CommandError(f"must be integers >= 1, got {text!r}")
    return values


def fill(name: str, n: int) -> float:
    """Put n pending items (fast: big multi-row inserts); seconds it took."""
    started = time.monotonic()
    d = Dispenser(name)
    for start in range(0, n, FILL_CHUNK):
        chunk = [(f"item-{i:08d}", None) for i in range(start, min(n, start + FILL_CHUNK))]
        ops(d.using).items.put_items(name, chunk)
    return time.monotonic() - started


def ms(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {
        "p50": round(1000 * statistics.median(values), 3),
        "p99": round(1000 * values[min(len(values) - 1, int(len(values) * 0.99))], 3),
        "mean": round(1000 * statistics.fmean(values), 3),
    }


class Command(BaseCommand):
    help = "Measure Dispenser.assign at 1k and 1M pending items, and items/s drained by worker processes."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--sizes", type=int_list, default=[1_000, 1_000_000])
        parser.add_argument("--rounds", type=int, default=200)
        parser.add_argument("--limit", type=int, default=10, help="items per assign in the latency figures")
        parser.add_argument("--workers", type=int_list, default=[1, 4, 8])
        parser.add_argument("--batches", type=int_list, default=[1, 10])
        parser.add_argument("--drain-items", type=int, default=2_000)
        parser.add_argument("--skip-drain", action="store_true")
        parser.add_argument("--json", action="store_true", dest="as_json")

    def handle(self, *args: Any, **o: Any) -> None:
        report: dict[str, Any] = {"vendor": connection.vendor, "assign": [], "drain": []}
        self.stdout.write(f"dispenser_bench on {connection.vendor} ({settings.DATABASES['default']['NAME']})")
        for size in o["sizes"]:
            report["assign"].append(self.assign_latency(size, o["rounds"], o["limit"]))
        if not o["skip_drain"]:
            for batch in o["batches"]:
                for workers in o["workers"]:
                    report["drain"].append(self.drain(workers, batch, o["drain_items"]))
        if o["as_json"]:
            self.stdout.write(json.dumps(report, indent=2))

    def assign_latency(self, size: int, rounds: int, limit: int) -> dict[str, Any]:
        name = f"bench-assign-{size}"
        DispenserItem.objects.filter(dispenser=name).delete()
        filled = fill(name, size)
        # A second dispenser of the same size around it: the index must keep them apart.
        d = Dispenser(name, ttl=60)
        assign, release, done = [], [], []
        for _ in range(rounds):
            t0 = time.perf_counter()
            items = d.assign("bench", limit)
            t1 = time.perf_counter()
            d.release("bench", items)
            release.append(time.perf_counter() - t1)
            assign.append(t1 - t0)
        for _ in range(max(1, min(rounds, size // limit // 4))):
            items = d.assign("bench", limit)
            t0 = time.perf_counter()
            d.done("bench", items)
            done.append(time.perf_counter() - t0)
        row: dict[str, Any] = {
            "pool": size,
            "limit": limit,
            "fill_s": round(filled, 1),
            "assign_ms": ms(assign),
            "release_ms": ms(release),
            "done_ms": ms(done),
        }
        self.stdout.write(
            f"  pool {size:>9,} pending: assign({limit}) p50 {row['assign_ms']['p50']:.2f} ms, "
            f"p99 {row['assign_ms']['p99']:.2f} ms; done({limit}) p50 {row['done_ms']['p50']:.2f} ms "
            f"(filled in {filled:.1f}s)"
        )
        DispenserItem.objects.filter(dispenser=name).delete()
        return row

    def drain(self, workers: int, batch: int, items: int) -> dict[str, Any]:
        name = f"bench-drain-{workers}-{batch}"
        DispenserItem.objects.filter(dispenser=name).delete()
        fill(name, items)
        env = {**os.environ, "DISPENSER_BENCH_NAME": name, "DISPENSER_BENCH_BATCH": str(batch)}
        env["RESOURCE_LEASE_LOG"] = "WARNING"
        manage = str(Path(settings.BASE_DIR) / "manage.py")
        procs = [
            subprocess.Popen(
                [sys.executable, manage, "run_worker", "project.bench.dispenser.BenchWorker", "--name", f"b{i}"]
                + ["--until-empty", "-v", "0"],
                env=env,
            )
            for i in range(workers)
        ]
        for proc in procs:
            if proc.wait(timeout=600) != 0:
                raise CommandError(f"a bench worker failed with exit code {proc.returncode}")
        rows = DispenserItem.objects.filter(dispenser=name)
        span: dict[str, Any] = rows.aggregate(first=Min("claimed_at"), last=Max("finished_at"))
        done = rows.filter(state=DispenserItem.DONE).count()
        seconds = (span["last"] - span["first"]).total_seconds()
        rate = done / seconds if seconds > 0 else float("nan")
        self.stdout.write(f"  drain {items} items: {workers} worker(s), batch {batch}: {rate:,.0f} items/s")
        rows.delete()
        return {
            "workers": workers,
            "batch": batch,
            "items": done,
            "seconds": round(seconds, 3),
            "items_per_s": round(rate),
        }
