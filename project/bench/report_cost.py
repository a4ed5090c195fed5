"""What a report costs the database, next to an acquire/release cycle (docs/learning.md#cost).

    DATABASE_URL=... python -m project.bench.report_cost [N]

On the database of ``DATABASE_URL`` (migrated first), with 8 resources of kind ``cost`` and a
policy whose threshold is never reached: the mean wall time of N acquire+release cycles, then
of N ``report("ok")`` and N ``report("error")`` on one held lease, then N cycles with a target
(``acquire(target=...)``: the scan with its cooldown test), N with a target and a cooldown on
release (one more fenced upsert), N with a session (the binding read before, written
after), and N with a target under the policy's ``target_rate`` (the grant counted: the
stored times read and written after the grant, and moved to the release before it; 200
targets in turn, so no (resource, target) reaches its cap), one process, no contention.
Prints one line. A measured figure, not an assertion.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable


def mean_us(call: Callable[[], object], n: int) -> float:
    call()
    started = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    os.environ["RESOURCE_LEASE_AUDIT"] = "0"
    import django

    django.setup()
    from django.core.management import call_command

    from resource_lease import acquire, pool_policy
    from resource_lease.models import PoolPolicy, Resource

    call_command("migrate", verbosity=0)
    Resource.objects.filter(kind="cost").delete()
    PoolPolicy.objects.filter(kind="cost").delete()
    Resource.objects.bulk_create([Resource(kind="cost", name=f"c{i}") for i in range(8)])
    pool_policy("cost", error_threshold=1e12)
    cycle = mean_us(lambda: acquire("cost", ttl=30).release(), n)
    lease = acquire("cost", ttl=300)
    ok = mean_us(lambda: lease.report("ok"), n)
    error = mean_us(lambda: lease.report("error"), n)
    lease.release()
    targeted = mean_us(lambda: acquire("cost", target="site.example", ttl=30).release(), n)
    cooled = mean_us(lambda: acquire("cost", target="site.example", ttl=30).release(cooldown=0.001), n)
    sticky = mean_us(lambda: acquire("cost", session="acct", ttl=30).release(), n)
    pool_policy("cost", error_threshold=1e12, target_rate=(10, 60))
    turns = iter(range(10**9))
    rated = mean_us(lambda: acquire("cost", target=f"site-{next(turns) % 200}.example", ttl=30).release(), n)
    Resource.objects.filter(kind="cost").delete()
    PoolPolicy.objects.filter(kind="cost").delete()
    vendor = django.db.connection.vendor
    sys.stdout.write(
        f"{vendor}: acquire+release {cycle:.0f} us, report('ok') {ok:.0f} us, report('error') {error:.0f} us,"
        f" with a target {targeted:.0f} us, with a target and release(cooldown=) {cooled:.0f} us,"
        f" with a session {sticky:.0f} us, with a target under target_rate {rated:.0f} us (mean of {n})\n"
    )


if __name__ == "__main__":
    main()
