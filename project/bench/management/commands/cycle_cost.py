"""``manage.py cycle_cost [--cycles N] [--rounds R] [--pool P] [--json]``

Where one lease cycle's CPU goes, on the database of DATABASE_URL, in one process: the server's
CPU and this process's CPU per cycle for four loops, taking turns round by round:

- ``floor``: two primary-key UPDATEs of ``holder`` (the benchmark's floor), on Django's own
  connection, as in ``lease_bench``;
- ``lease floor``: two that move ``busy_before`` (the benchmark's lease floor), the same way;
- ``engine statements``: the engine's grant (``Picker.grant_any``: the probe, else the scan)
  and its release (``LeaseStatements.release``), called directly: the SQL without the public API;
- ``engine``: ``acquire(kind, timeout=0).release()``, the public API.

``engine statements`` less ``lease floor`` is what the engine's SQL costs beyond moving the
expiry; ``engine`` less ``engine statements`` is the Python of the public API (argument
checks, the Lease and Resource objects, signals, the retry wrapper). Once a benchmark is
CPU-bound (from 4 processes on two cores), cycles/s follow the sum of the two, so
``x floor`` here (floor's total / the loop's total) predicts the benchmark's ratio.

Server CPU is read from /proc: PostgreSQL's backends of the two connections; MariaDB's/MySQL's
whole server process (so run it on a quiet server); 0 for SQLite (in this process) or a
server elsewhere. Prints figures; asserts nothing about speed.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import connections
from django.utils import timezone

from project.arguments import positive_int
from project.bench.vendor import SERVER_PROCESSES, cpu_ticks
from resource_lease.conf import lease_settings
from resource_lease.db.connections import close_connections, lease_connection
from resource_lease.db.line import Ask
from resource_lease.lease import acquire, default_holder
from resource_lease.models import Resource

KIND = "cyclecost"
TTL = 30.0
LOOPS = ("floor", "lease floor", "engine statements", "engine")


def _server_pids(vendor: str, cursors: list[Any]) -> list[int]:
    """The local server processes serving ``cursors``: PostgreSQL's backends of these
    connections, MySQL's whole server; none for SQLite or a server elsewhere."""
    if vendor == "postgresql":
        pids = []
        for cursor in cursors:
            cursor.execute("SELECT pg_backend_pid()")
            pids.append(int(cursor.fetchall()[0][0]))
        return list(cpu_ticks(pids=pids))  # those on this machine
    if vendor == "mysql":
        return list(cpu_ticks(names=SERVER_PROCESSES["mysql"]))
    return []


class Command(BaseCommand):
    help = "Server and worker CPU per lease cycle: floor, lease floor, the engine's statements, the public API."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--cycles", type=positive_int, default=3000, help="cycles per loop and round (3000)")
        parser.add_argument("--rounds", type=positive_int, default=3, help="rounds; the median is shown (3)")
        parser.add_argument("--pool", type=positive_int, default=40, help="resources in the engine's pool (40)")
        parser.add_argument("--json", action="store_true", dest="as_json")

    def handle(self, *args: Any, cycles: int, rounds: int, pool: int, as_json: bool, **options: Any) -> None:
        if settings.DEBUG:
            self.stderr.write(
                "DEBUG is on: Django's cursor keeps every query, which the floors pay for (DJANGO_DEBUG=0)"
            )
        if lease_settings.AUDIT:
            # Measured here: 440 us more client CPU per PostgreSQL cycle (216 -> 654), most of it
            # the writer thread contending with the loop's; the app's default is off.
            self.stderr.write(
                "RESOURCE_LEASE['AUDIT'] is on (the demo project's default): the public API's loop pays"
                " for the audit trail's writer thread too; RESOURCE_LEASE_AUDIT=0 measures the engine alone"
            )
        Resource.objects.filter(kind=KIND).delete()
        Resource.objects.bulk_create([Resource(kind=KIND, name=f"{KIND}-{i}") for i in range(pool)])
        try:
            result = self._measure(cycles, rounds, pool)
        finally:
            close_connections()
            Resource.objects.filter(kind=KIND).delete()
        if as_json:
            self.stdout.write(json.dumps(result, indent=2))
            return
        self.stdout.write(
            f"cycle_cost on {result['database']}, pool {pool}, {cycles} cycles x {rounds} rounds (median),"
            f" audit trail {'on' if result['audit'] else 'off'}, microseconds of CPU per cycle:"
        )
        self.stdout.write(f"  {'loop':<18} {'server':>8} {'worker':>8} {'total':>8} {'x floor':>8}")
        for name, row in result["loops"].items():
            self.stdout.write(
                f"  {name:<18} {row['server_us']:>8.1f} {row['worker_us']:>8.1f} {row['total_us']:>8.1f}"
                f" {row['x_floor']:>8.2f}"
            )
        if not result["server_measured"]:
            self.stdout.write("  (no local server process to read: server CPU is 0, the totals are the worker's)")

    def _measure(self, cycles: int, rounds: int, pool: int) -> dict[str, Any]:
        conn = lease_connection("default")
        cursor = conn.cursor()
        dialect = conn.dialect
        vendor = conn.wrapper.vendor
        django_connection = connections["default"]
        plain = django_connection.cursor()  # the floors' cursor, as lease_bench's floors
        ops = django_connection.ops
        table = ops.quote_name(Resource._meta.db_table)
        holder = default_holder()
        floor_pk = Resource.objects.filter(kind=KIND).order_by("pk").values_list("pk", flat=True)[0]
        pids = _server_pids(vendor, [cursor, plain])
        ttl = dt.timedelta(seconds=TTL)

        def floor() -> None:
            plain.execute(f"UPDATE {table} SET holder = %s WHERE id = %s", (holder, floor_pk))
            plain.execute(f"UPDATE {table} SET holder = '' WHERE id = %s", (floor_pk,))

        def lease_floor() -> None:
            until = ops.adapt_datetimefield_value(timezone.now() + ttl)
            plain.execute(f"UPDATE {table} SET busy_before = %s, holder = %s WHERE id = %s", (until, holder, floor_pk))
            now = ops.adapt_datetimefield_value(timezone.now())
            plain.execute(f"UPDATE {table} SET busy_before = %s WHERE id = %s", (now, floor_pk))

        ask = Ask(KIND, holder, TTL)

        def engine_statements() -> None:
            token = os.urandom(16).hex()
            row = conn.picker.grant_any(dialect, cursor, ask, token=token)
            if row is None:
                raise RuntimeError(f"nothing of {KIND!r} was free for one process alone")
            resource = dialect.to_resource(row)
            if not dialect.leases.release(cursor, pk=resource.pk, holder=holder, fence=resource.fence):
                raise RuntimeError("the release of a grant just made matched nothing")

        def engine() -> None:
            acquire(KIND, ttl=TTL, timeout=0).release()

        loops: dict[str, Callable[[], None]] = dict(
            zip(LOOPS, (floor, lease_floor, engine_statements, engine), strict=True)
        )
        for loop in loops.values():  # warm up: connect, fill the probe's sample, caches
            for _ in range(20):
                loop()
        hz = os.sysconf("SC_CLK_TCK")
        server: dict[str, list[float]] = {name: [] for name in LOOPS}
        worker: dict[str, list[float]] = {name: [] for name in LOOPS}
        order = list(LOOPS)
        for _ in range(rounds):
            for name in order:
                loop = loops[name]
                ticks0, cpu0 = sum(cpu_ticks(pids=pids).values()), time.process_time()
                for _ in range(cycles):
                    loop()
                cpu1, ticks1 = time.process_time(), sum(cpu_ticks(pids=pids).values())
                server[name].append((ticks1 - ticks0) / hz / cycles * 1e6)
                worker[name].append((cpu1 - cpu0) / cycles * 1e6)
            order = order[1:] + order[:1]
        cursor.close()
        plain.close()
        rows: dict[str, dict[str, float]] = {}
        for name in LOOPS:
            s, w = statistics.median(server[name]), statistics.median(worker[name])
            rows[name] = {"server_us": round(s, 1), "worker_us": round(w, 1), "total_us": round(s + w, 1)}
        base = rows["floor"]["total_us"]
        for row in rows.values():
            row["x_floor"] = round(base / row["total_us"], 3) if row["total_us"] else 0.0
        return {
            "database": vendor,
            "audit": bool(lease_settings.AUDIT),
            "pool": pool,
            "cycles": cycles,
            "rounds": rounds,
            "server_measured": bool(pids),
            "loops": rows,
            "per_round": {"server_us": server, "worker_us": worker},
        }
