"""``manage.py coord_cost [--calls N] [--rounds R] [--json]``

What one call of the coordination primitives of issue 23 costs, next to a lock cycle, on the
database of DATABASE_URL, in one process with nobody else contending. Loops, taking turns
round by round (each figure is the median of the rounds):

- ``lock cycle``: ``lock(name, timeout=0, auto_renew=False).release()`` (two statements);
- ``counter.add``: ``counter(name).add()`` (one upsert and its answer);
- ``counter.value``: one indexed read;
- ``Config.set``: one upsert (the reference for the next);
- ``compare_and_set``: ``Config.compare_and_set(key, a, b)`` alternating a and b, so every
  call writes (a read of the namespace, then one conditional UPDATE);
- ``election cycle``: ``Election(name).campaign(timeout=0)`` then ``resign()``: a lock cycle
  plus writing the term down (and its read-back) and the resignation's wake-up;
- ``observer look``: one look of an ``Election.observe`` observer when nothing changed (one
  read of the election's row), what each poll costs.

Wall-clock microseconds per call and this process's CPU per call. Prints figures; asserts
nothing about speed.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import connections

from project.arguments import positive_int
from resource_lease import Config, Election, counter, lock
from resource_lease.db.connections import close_connections
from resource_lease.models import ConfigEntry, Counter, LeadershipTerm, Resource
from resource_lease.recipes.election import KIND
from resource_lease.recipes.observing import Observer

NAME = "coordcost"


class Command(BaseCommand):
    help = "Wall and CPU time per call of counter.add, Config.compare_and_set and friends, next to a lock cycle."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--calls", type=positive_int, default=2000, help="calls per loop and round (2000)")
        parser.add_argument("--rounds", type=positive_int, default=3, help="rounds; the median is shown (3)")
        parser.add_argument("--json", action="store_true", dest="as_json")

    def handle(self, *args: Any, calls: int, rounds: int, as_json: bool, **options: Any) -> None:
        logging.getLogger("resource_lease").setLevel(logging.WARNING)  # not a line per election won
        try:
            result = self._measure(calls, rounds)
        finally:
            close_connections()
            Counter.objects.filter(name=NAME).delete()
            ConfigEntry.objects.filter(namespace=NAME).delete()
            Resource.objects.filter(name=NAME, kind__startswith="@lock").delete()
            Resource.objects.filter(name=NAME, kind=KIND).delete()
            LeadershipTerm.objects.filter(election=NAME).delete()
        if as_json:
            self.stdout.write(json.dumps(result, indent=2))
            return
        self.stdout.write(f"coord_cost on {result['database']}, {calls} calls x {rounds} rounds (median), one process:")
        self.stdout.write(f"  {'call':<16} {'wall us':>9} {'cpu us':>9} {'calls/s':>9} {'x lock':>8}")
        for name, row in result["loops"].items():
            self.stdout.write(
                f"  {name:<16} {row['wall_us']:>9.1f} {row['cpu_us']:>9.1f} {row['per_second']:>9.0f}"
                f" {row['x_lock']:>8.2f}"
            )

    def _measure(self, calls: int, rounds: int) -> dict[str, Any]:
        hits = counter(NAME)
        params = Config(NAME, defaults={"n": 0})
        flip = [0]
        election = Election(NAME, ttl=30, holder="coord_cost")
        observer = Observer(KIND, NAME, election.using)

        def lock_cycle() -> None:
            lock(NAME, ttl=30, timeout=0, auto_renew=False).release()

        def add() -> None:
            hits.add()

        def value() -> None:
            hits.value()

        def config_set() -> None:
            flip[0] ^= 1
            params.set("n", flip[0])

        def compare_and_set() -> None:
            flip[0] ^= 1
            if not params.compare_and_set("n", 1 - flip[0], flip[0]):
                raise RuntimeError("a compare-and-set with nobody else writing missed")

        def election_cycle() -> None:
            election.campaign(timeout=0)
            election.resign()

        def observer_look() -> None:
            observer.check(lambda *change: None)

        loops: dict[str, Callable[[], None]] = {
            "lock cycle": lock_cycle,
            "counter.add": add,
            "counter.value": value,
            "Config.set": config_set,
            "compare_and_set": compare_and_set,
            "election cycle": election_cycle,
            "observer look": observer_look,
        }
        params.set("n", 0)
        for loop in loops.values():  # warm up: connect, create the rows
            for _ in range(20):
                loop()
        params.set("n", flip[0])
        wall: dict[str, list[float]] = {name: [] for name in loops}
        cpu: dict[str, list[float]] = {name: [] for name in loops}
        order = list(loops)
        for _ in range(rounds):
            for name in order:
                loop = loops[name]
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(calls):
                    loop()
                c1, t1 = time.process_time(), time.perf_counter()
                wall[name].append((t1 - t0) / calls * 1e6)
                cpu[name].append((c1 - c0) / calls * 1e6)
            order = order[1:] + order[:1]
        rows: dict[str, dict[str, float]] = {}
        for name in loops:
            w, c = statistics.median(wall[name]), statistics.median(cpu[name])
            rows[name] = {"wall_us": round(w, 1), "cpu_us": round(c, 1), "per_second": round(1e6 / w, 1)}
        base = rows["lock cycle"]["wall_us"]
        for row in rows.values():
            row["x_lock"] = round(row["wall_us"] / base, 3)
        return {
            "database": connections["default"].vendor,
            "calls": calls,
            "rounds": rounds,
            "loops": rows,
            "per_round": {"wall_us": wall, "cpu_us": cpu},
        }
