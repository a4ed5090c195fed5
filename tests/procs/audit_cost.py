"""What the audit trail costs an acquire + release cycle, audit off against on, same process.

    DATABASE_URL=mysql://root@127.0.0.1:3306/DB python -m tests.procs.audit_cost [--cycles 2000] [--rounds 4]

Runs on the database DATABASE_URL names (migrated first), on a kind of its own. Rounds
alternate the order (off, on / on, off) so a drift of the machine's load hits both alike.
With the audit on, the background writer stores the events while the cycles run: its work
is part of what is measured. Prints per-round and overall figures (microseconds per cycle).
"""

from __future__ import annotations

import argparse
import statistics
import time

from tests.procs import setup

KIND = "audit-cost-bench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()

    setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import override_settings

    from resource_lease import acquire, audit
    from resource_lease.models import LeaseEvent, Resource

    call_command("migrate", verbosity=0)
    Resource.objects.filter(kind=KIND).delete()
    Resource.objects.bulk_create(Resource(kind=KIND, name=f"r{i}") for i in range(4))

    def cycles(audit_on: bool) -> list[float]:
        times = []
        with override_settings(RESOURCE_LEASE={**settings.RESOURCE_LEASE, "AUDIT": audit_on}):
            for _ in range(args.cycles):
                started = time.perf_counter()
                acquire(KIND, ttl=30).release()
                times.append(time.perf_counter() - started)
            if audit_on:
                audit.flush()  # outside the timing; normally nearly everything is stored by now
        return times

    cycles(False)  # warm up connections and caches
    cycles(True)
    results: dict[bool, list[float]] = {False: [], True: []}
    print(f"{connection.vendor} {connection.settings_dict['NAME']}: {args.rounds} rounds x {args.cycles} cycles")
    for number in range(args.rounds):
        order = (False, True) if number % 2 == 0 else (True, False)
        line = []
        for audit_on in order:
            times = cycles(audit_on)
            results[audit_on].extend(times)
            line.append(
                f"audit {'on ' if audit_on else 'off'} mean {statistics.fmean(times) * 1e6:7.0f} µs"
                f" median {statistics.median(times) * 1e6:7.0f} µs"
            )
        print(f"round {number + 1}: " + " | ".join(line))
    off, on = results[False], results[True]
    for label, pick in (("mean", statistics.fmean), ("median", statistics.median)):
        a, b = pick(off) * 1e6, pick(on) * 1e6
        print(f"overall {label}: off {a:.0f} µs, on {b:.0f} µs, difference {b - a:+.0f} µs ({(b / a - 1) * 100:+.1f}%)")
    for label, q in (("p90", 0.9), ("p99", 0.99)):
        a = statistics.quantiles(off, n=100)[int(q * 100) - 1] * 1e6
        b = statistics.quantiles(on, n=100)[int(q * 100) - 1] * 1e6
        print(f"overall {label}: off {a:.0f} µs, on {b:.0f} µs")
    stored = LeaseEvent.objects.filter(kind=KIND).count()
    print(f"events stored: {stored} (expected {2 * args.cycles * (args.rounds + 1)})")
    LeaseEvent.objects.filter(kind=KIND).delete()
    Resource.objects.filter(kind=KIND).delete()


if __name__ == "__main__":
    main()
