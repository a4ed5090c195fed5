"""Reports on one grant, or on grants of a one-resource pool, for tests/test_health.py.

    python -m tests.procs.reporter --pk ID --holder H --fence F --reports K [--naive] --go PATH
    python -m tests.procs.reporter --cycle KIND --grants G

The first form prints ``READY``, waits for the file PATH, then makes K ``"error"`` reports
on the live grant (ID, H, F) (a Lease rebuilt from the row: the same fencing key), each one
statement (``--naive``: the negative control, read the score and then write it plus one).
The second acquires KIND G times, reports ``"error"`` on each grant and releases it, and
prints ``GRANTS <n>``.
"""

from __future__ import annotations

import argparse
import os
import time

from tests.procs import setup


def report_on_one(args: argparse.Namespace) -> None:
    from resource_lease import Lease
    from resource_lease.db.connections import lease_connection
    from resource_lease.models import Resource

    resource = Resource.objects.get(pk=args.pk)
    assert resource.holder == args.holder and resource.fence == args.fence
    lease = Lease(resource, holder=args.holder, ttl=600, using="default", sent_at=time.monotonic())
    lease_connection("default").cursor().close()
    print("READY", flush=True)
    while not os.path.exists(args.go):
        time.sleep(0.001)
    for _ in range(args.reports):
        if args.naive:  # read, then write: two statements, another report may come between
            (score,) = Resource.objects.filter(pk=args.pk).values_list("health_score", flat=True)
            Resource.objects.filter(pk=args.pk).update(health_score=score + 1)
        else:
            lease.report("error")
    print("DONE", flush=True)


def cycle(args: argparse.Namespace) -> None:
    from resource_lease import acquire

    grants = 0
    for _ in range(args.grants):
        with acquire(args.cycle, ttl=30, timeout=60) as lease:
            lease.report("error")
            grants += 1
    print(f"GRANTS {grants}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pk", type=int, default=0)
    parser.add_argument("--holder", default="")
    parser.add_argument("--fence", type=int, default=0)
    parser.add_argument("--reports", type=int, default=0)
    parser.add_argument("--naive", action="store_true")
    parser.add_argument("--go", default="")
    parser.add_argument("--cycle", default="")
    parser.add_argument("--grants", type=int, default=0)
    args = parser.parse_args()
    setup()
    if args.cycle:
        cycle(args)
    else:
        report_on_one(args)


if __name__ == "__main__":
    main()
