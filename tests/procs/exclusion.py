"""A worker for the exclusion tests: take, run the ledger's unsafe critical section, record, let go.

    python -m tests.procs.exclusion --kind K --dir D --seconds S [--hold H] [--ttl T] [--naive] [--at-least N]
    python -m tests.procs.exclusion --lock N [--slots K] --dir D --seconds S [--hold H] [--naive]

For S seconds, again and again: lease a resource of kind K (``acquire``), or take the lock N
(``lock``), or with ``--slots`` a slot of the semaphore N (``semaphore``); run the critical
section under it and record the grant (tests/ledger.py); release it. A release refused while
the lease was still trusted here (lost inside its ttl) ends the worker with an error.

``--naive`` is the negative control the checker must catch: a deliberately broken acquire
that looks for a free row and then takes it with an unconditional UPDATE.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import time
from pathlib import Path
from typing import Any

from tests.procs import setup


def at_least(enough: int, workers: int) -> list[str]:
    """The ``--at-least`` arguments that give each of ``workers`` its share of ``enough`` grants."""
    return ["--at-least", str(-(-enough // workers))]


def naive_take(rows: Any, ttl: float, holder: str) -> tuple[int, int] | None:
    """Check-then-unconditional-update on one of ``rows``: two takers can both see a row
    free and both take it. Returns (pk, fence), or None if none looked free."""
    from django.db.models import F

    from resource_lease.db.clock import DbNow
    from resource_lease.models import Resource

    free = rows.filter(busy_before__lte=DbNow()).order_by("busy_before").first()
    if free is None:
        return None
    time.sleep(0.002)  # the window between the look and the write, widened
    Resource.objects.filter(pk=free.pk).update(
        busy_before=DbNow() + dt.timedelta(seconds=ttl), holder=holder, fence=F("fence") + 1, grant_token="naive"
    )
    return free.pk, Resource.objects.get(pk=free.pk).fence


def naive_release(pk: int) -> None:
    from resource_lease.db.clock import DbNow
    from resource_lease.models import Resource

    Resource.objects.filter(pk=pk).update(busy_before=DbNow(), grant_token="")


def naive_rows(args: argparse.Namespace) -> Any:
    """The rows the negative control takes from: the pool of ``--kind``, or the lock's row."""
    from resource_lease import named
    from resource_lease.models import Resource
    from resource_lease.recipes.locks import LOCK_KIND

    if args.kind:
        return Resource.objects.filter(kind=args.kind)
    named.ensure("default", LOCK_KIND, [args.lock])
    return Resource.objects.filter(kind=LOCK_KIND, name=args.lock)


def take(args: argparse.Namespace) -> Any:
    """One grant through the public API (``NoResourceAvailable``, or ``LockHeld``, if none
    within a second)."""
    from resource_lease import acquire, lock, semaphore

    if args.kind:
        return acquire(args.kind, ttl=args.ttl, timeout=1.0)
    if args.slots:
        return semaphore(args.lock, args.slots, ttl=args.ttl, timeout=1.0)
    return lock(args.lock, ttl=args.ttl, timeout=1.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--kind", default="")
    what.add_argument("--lock", default="", help="take this named lock (with --slots: this semaphore)")
    parser.add_argument("--slots", type=int, default=0)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--hold", type=float, default=0.002)
    parser.add_argument("--ttl", type=float, default=10.0)
    parser.add_argument("--naive", action="store_true")
    parser.add_argument(
        "--at-least",
        type=int,
        default=0,
        help="go on past --seconds (60 s more at most) until this worker has recorded this many grants",
    )
    args = parser.parse_args()
    if args.slots and (args.kind or args.naive):
        parser.error("--slots goes with --lock, and has no --naive control")
    setup()

    from resource_lease import NoResourceAvailable
    from tests.ledger import work_and_record

    worker = str(os.getpid())
    deadline = time.monotonic() + args.seconds
    cap = deadline + 60.0
    grants = 0
    while (now := time.monotonic()) < deadline or (grants < args.at_least and now < cap):
        if args.naive:
            got = naive_take(naive_rows(args), args.ttl, worker)
            if got is None:
                time.sleep(0.001)
                continue
            pk, fence = got
            work_and_record(args.dir, worker, pk, fence, args.hold)
            grants += 1
            naive_release(pk)
            continue
        try:
            lease = take(args)
        except NoResourceAvailable:  # LockHeld too
            continue
        work_and_record(args.dir, worker, lease.resource.pk, lease.fence, args.hold)
        grants += 1
        if not lease.release() and lease.remaining() > 0:
            # Refused while its local deadline (counted from before the last grant or renewal
            # was sent, less the safety margin) had still not passed when the answer came: the
            # database let the lease go inside its ttl. A worker starved of the CPU past its
            # ttl between its grant and its release (CI's start-up, a 1 s ttl) is refused
            # rightly, and the ledger judges what it trusted.
            raise SystemExit(f"release of {lease!r} refused: the lease was lost inside its ttl")
    from resource_lease.line import stats

    # Grants a release handed to this worker's place that it gave back unused (PostgreSQL:
    # its own grant of another row went through a moment before): each raised a fence.
    (args.dir / f"handed-back-{worker}.count").write_text(str(stats.handed_back))


if __name__ == "__main__":
    main()
