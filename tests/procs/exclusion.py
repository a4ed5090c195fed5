"""A worker for the exclusion test: lease, run the unsafe critical section, record, release.

    python -m tests.procs.exclusion --kind K --dir D --seconds S [--hold H] [--naive]

``--naive`` uses a deliberately broken acquire (SELECT a free row, then an unconditional
UPDATE), the negative control the checker must catch.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import time
from pathlib import Path

from tests.procs import setup


def naive_acquire(kind: str, ttl: float, holder: str) -> tuple[int, int] | None:
    from django.db.models import F

    from resource_lease.db import DbNow
    from resource_lease.models import Resource

    free = Resource.objects.filter(kind=kind, busy_before__lte=DbNow()).order_by("busy_before").first()
    if free is None:
        return None
    time.sleep(0.002)  # the window between the read and the write, widened
    Resource.objects.filter(pk=free.pk).update(
        busy_before=DbNow() + dt.timedelta(seconds=ttl), holder=holder, fence=F("fence") + 1, grant_token="naive"
    )
    return free.pk, Resource.objects.get(pk=free.pk).fence


def naive_release(pk: int) -> None:
    from resource_lease.db import DbNow
    from resource_lease.models import Resource

    Resource.objects.filter(pk=pk).update(busy_before=DbNow(), grant_token="")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--hold", type=float, default=0.002)
    parser.add_argument("--ttl", type=float, default=10.0)
    parser.add_argument("--naive", action="store_true")
    args = parser.parse_args()
    setup()

    from resource_lease import NoResourceAvailable, acquire
    from tests.ledger import Grant, critical_section, record

    worker = str(os.getpid())
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        if args.naive:
            got = naive_acquire(args.kind, args.ttl, worker)
            if got is None:
                time.sleep(0.001)
                continue
            pk, fence = got
            start = time.monotonic_ns()
            critical_section(args.dir, pk, args.hold)
            record(args.dir, worker, Grant(pk, fence, start, time.monotonic_ns(), worker))
            naive_release(pk)
            continue
        try:
            lease = acquire(args.kind, ttl=args.ttl, timeout=1.0)
        except NoResourceAvailable:
            continue
        start = time.monotonic_ns()
        critical_section(args.dir, lease.resource.pk, args.hold)
        record(args.dir, worker, Grant(lease.resource.pk, lease.fence, start, time.monotonic_ns(), worker))
        if not lease.release():
            raise SystemExit(f"release of {lease!r} refused: the lease was lost inside its ttl")


if __name__ == "__main__":
    main()
