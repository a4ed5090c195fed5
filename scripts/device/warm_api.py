"""The public API's own Python per uncontended cycle, its two statements stubbed.

    DATABASE_URL=... python scripts/device/warm_api.py [--switch] [--rounds N]

Runs ``acquire(kind, timeout=0).release()`` with ``Operations.grant`` and
``Operations.release_to_line`` answering what they answered once for real (a granted row;
released), so nothing goes to the database. Run it from the checkout to measure, with
DJANGO_SETTINGS_MODULE=project.settings. A measuring script, not a test: the stubs never
leave this process.

- Warm (the default): 20,000 cycles in a row, the caches and branch predictors warm. Set
  against ``cycle_cost``'s "engine" less "engine statements" (the same Python between real
  round trips), it says how much of that is the code's own work (docs/benchmarks.md, eighth
  session).
- ``--switch``: each stubbed statement blocks on a pipe that a child process answers, as a
  round trip does, so the thread is switched out and back twice a cycle and its Python runs
  after each switch as it does between real statements: the in-situ cost, without the
  database's noise. Each round also times the two pipe round trips alone, and the figure is
  the cycle less them, paired round by round (median). It also times two cut-down cycles on
  the same stubs, which say where that cost lies (ninth session): ``bare``, the grant made
  into a lease and released with nothing around it (no argument checks, no wait, no metrics,
  no policy), and ``built``, the same after building the call's wait (``lease.acquiring``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import timeit
from collections.abc import Callable
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
sys.path.insert(0, os.getcwd())

import django  # noqa: E402

django.setup()

from resource_lease import acquire  # noqa: E402
from resource_lease.db import operations  # noqa: E402
from resource_lease.db.connections import lease_connection  # noqa: E402
from resource_lease.models import Resource  # noqa: E402

KIND = "warmapi"
CYCLES = 20_000
SWITCHED_CYCLES = 3_000


def _granted_row() -> Any:
    """A row as the grant statement returns it (granted once for real, then released)."""
    lease = acquire(KIND, ttl=3000, timeout=0)
    dialect = lease_connection("default").dialect
    cursor = lease_connection("default").cursor()
    cursor.execute(f"SELECT {dialect.columns} FROM {dialect.table} WHERE id = %s", (lease.resource.pk,))
    row = cursor.fetchall()[0]
    cursor.close()
    lease.release()
    return row


def _stub(row: Any, round_trip: Callable[[], None]) -> None:
    def grant(self: Any, ask: Any, turn: Any = None) -> tuple[Any, bool]:
        round_trip()
        return row, False

    def release_to_line(self: Any, *, pk: int, holder: str, fence: int) -> tuple[bool, int]:
        round_trip()
        return True, 0

    operations.Operations.grant = grant  # type: ignore[method-assign]
    operations.Operations.release_to_line = release_to_line  # type: ignore[method-assign]


def cycle() -> None:
    acquire(KIND, ttl=3000, timeout=0).release()


def warm() -> None:
    best = min(timeit.repeat(cycle, number=CYCLES, repeat=7)) / CYCLES * 1e6
    started = time.thread_time()
    for _ in range(CYCLES):
        cycle()
    spent = (time.thread_time() - started) / CYCLES * 1e6
    print(
        f"{os.getcwd()}: the public API's Python, statements stubbed: best {best:.1f} us, thread CPU {spent:.1f} us a cycle"
    )


def _cut_down() -> dict[str, Callable[[], None]]:
    from resource_lease.db.line import NEWCOMER, Ask
    from resource_lease.db.operations import ops
    from resource_lease.lease import acquiring, default_holder, lease_from_row

    holder = default_holder()
    ask = Ask(KIND, holder, 3000.0)

    def bare() -> None:
        row, _ = ops("default").grant(ask, NEWCOMER)
        assert row is not None
        lease = lease_from_row(row, time.monotonic(), holder=holder, ttl=3000.0, alias="default")
        assert lease is not None
        lease.release()

    def built() -> None:
        acquiring(KIND, ttl=3000, timeout=0)
        bare()

    return {"acquire().release()": cycle, "bare": bare, "built": built}


def switched(rounds: int) -> None:
    from_parent, to_child = os.pipe()  # (read, write)
    from_child, to_parent = os.pipe()
    child = os.fork()
    if child == 0:
        while os.read(from_parent, 1) == b"p":
            os.write(to_parent, b"x")
        os._exit(0)

    def round_trip() -> None:
        os.write(to_child, b"p")
        os.read(from_child, 1)

    def two_round_trips() -> None:
        round_trip()
        round_trip()

    _stub(ROW, round_trip)
    loops = _cut_down()
    spent: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(rounds):
        for name, loop in loops.items():
            for each in (two_round_trips, loop):
                started = time.thread_time()
                for _ in range(SWITCHED_CYCLES):
                    each()
                took = (time.thread_time() - started) / SWITCHED_CYCLES * 1e6
                if each is two_round_trips:
                    alone = took
                else:
                    spent[name].append(took - alone)
    os.write(to_child, b"q")
    os.waitpid(child, 0)
    print(f"{os.getcwd()}: Python per cycle between two switches (median of {rounds} rounds, us):")
    for name, figures in spent.items():
        print(f"  {name:22} {statistics.median(figures):7.1f}   ({min(figures):.1f}-{max(figures):.1f})")


def main() -> None:
    global ROW
    parser = argparse.ArgumentParser()
    parser.add_argument("--switch", action="store_true", help="a pipe round trip in each stubbed statement")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    Resource.objects.filter(kind=KIND).delete()
    Resource.objects.bulk_create([Resource(kind=KIND, name=f"{KIND}-{i}") for i in range(4)])
    try:
        ROW = _granted_row()
        if args.switch:
            switched(args.rounds)
        else:
            _stub(ROW, lambda: None)
            warm()
    finally:
        Resource.objects.filter(kind=KIND).delete()


ROW: Any = None

if __name__ == "__main__":
    main()
