"""``manage.py lock_bench [--seconds S] [--rounds R] [--json]``

Named locks next to the engine's ``acquire()``, on the database of DATABASE_URL, in one run:
``lock(name)`` + ``release()`` cycles per second with 1 process and with 8 processes on one
name, 8 processes on 8 names, ``rwlock(name).read()`` and ``.write()`` + ``release()`` with 1
process and 8 processes on one name, and ``acquire()`` + ``release()`` on a pool of 1
resource with 1 and 8 processes. Each worker is a real process (``project.bench.lock_cycles``); the
contenders take turns, window by window, in an order that rotates each round, so a noisy
neighbour hurts them alike. Prints figures; asserts nothing about speed.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import connection

from project.arguments import positive
from resource_lease.models import Resource

POOL_KIND = "lockbench-one"
#: (label, mode, processes, names): names=1 puts every process on one lock (or the pool).
CONTENDERS = (
    ("lock, 1 process", "lock", 1, 1),
    ("lock, 8 processes, one name", "lock", 8, 1),
    ("lock, 8 processes, 8 names", "lock", 8, 8),
    ("rwlock read, 1 process", "read", 1, 1),
    ("rwlock read, 8 processes, one name", "read", 8, 1),
    ("rwlock write, 1 process", "write", 1, 1),
    ("rwlock write, 8 processes, one name", "write", 8, 1),
    ("acquire, 1 process, pool of 1", "acquire", 1, 1),
    ("acquire, 8 processes, pool of 1", "acquire", 8, 1),
)


class Command(BaseCommand):
    help = (
        "lock()+release() cycles/s (1 and 8 processes, one name and 8 names), rwlock read and write (1 and 8"
        " processes, one name) next to acquire() on a pool of 1."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--seconds", type=positive, default=3.0, help="length of one window (default 3)")
        parser.add_argument("--rounds", type=int, default=2, help="windows per contender (default 2)")
        parser.add_argument("--json", action="store_true", dest="as_json")

    def handle(self, *args: Any, seconds: float, rounds: int, as_json: bool, **options: Any) -> None:
        Resource.objects.get_or_create(kind=POOL_KIND, name=f"{POOL_KIND}-0")
        Resource.objects.filter(kind=POOL_KIND).exclude(name=f"{POOL_KIND}-0").delete()
        figures: dict[str, list[float]] = {label: [] for label, *_ in CONTENDERS}
        timeouts: dict[str, int] = dict.fromkeys(figures, 0)
        order = list(CONTENDERS)
        for round_ in range(max(1, rounds)):
            for label, mode, processes, names in order:
                cycles, waits = self._window(mode, processes, names, seconds)
                figures[label].append(cycles / seconds)
                timeouts[label] += waits
                if not as_json:
                    self.stderr.write(f"  round {round_ + 1}: {label}: {cycles / seconds:.0f}/s")
            order = order[1:] + order[:1]
        vendor = connection.vendor
        medians = {label: round(statistics.median(v), 1) for label, v in figures.items()}
        result: dict[str, Any] = {
            "database": connection.vendor,
            "server": _server_version(),
            "seconds": seconds,
            "rounds": rounds,
            "cycles_per_second": medians,
            "per_round": {label: [round(x, 1) for x in v] for label, v in figures.items()},
            "waits_that_timed_out": timeouts,
        }
        if as_json:
            self.stdout.write(json.dumps(result, indent=2))
            return
        self.stdout.write(f"lock_bench on {vendor} {result['server']} ({seconds:g}s windows, {rounds} rounds, median)")
        for label, value in medians.items():
            self.stdout.write(f"  {label:<34} {value:>9.1f} cycles/s")

    def _window(self, mode: str, processes: int, names: int, seconds: float) -> tuple[int, int]:
        start = time.time() + 2.0 + 0.6 * processes  # every worker has set Django up by then
        procs = []
        for i in range(processes):
            name = POOL_KIND if mode == "acquire" else f"lockbench:{names}:{i % names}"
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "project.bench.lock_cycles",
                        "--mode",
                        mode,
                        "--name",
                        name,
                        "--start",
                        str(start),
                        "--seconds",
                        str(seconds),
                    ],
                    cwd=settings.BASE_DIR,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        cycles = waits = 0
        for proc in procs:
            out, _ = proc.communicate(timeout=seconds + 120)
            if proc.returncode != 0:
                raise RuntimeError(f"a lock_cycles worker failed ({proc.returncode}): {out}")
            answer = json.loads(out.strip().splitlines()[-1])
            cycles += answer["cycles"]
            waits += answer["timeouts"]
        return cycles, waits


def _server_version() -> str:
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT sqlite_version()")
        else:
            cursor.execute("SELECT version()")
        return str(cursor.fetchone()[0]).split(" on ")[0].split(" (")[0][:40]
