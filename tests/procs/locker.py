"""Worker processes for the named-lock tests.

    python -m tests.procs.locker race --name N --go PATH
    python -m tests.procs.locker ledger --name N --dir D --seconds S [--slots K] [--broken] [--hold H]

``race`` connects, prints ``READY``, waits until the file PATH exists (so every racer starts
together, however slowly each started), makes one attempt at ``lock(N)`` (a brand-new name: its row is created by the racers) and prints
``GRANTED <fence>`` or ``HELD <holder>``; anything else that surfaced (an IntegrityError, a
deadlock) is printed as ``ERROR <repr>`` with exit status 1.

``ledger`` takes the lock (or, with ``--slots``, a slot of the semaphore N) again and again
for S seconds, runs the ledger's unsafe critical section under it and records the grant
(tests/ledger.py). ``--broken`` is the negative control: a lock that looks at the row and
then takes it with an unconditional UPDATE.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from tests.procs import setup


def broken_lock(name: str, ttl: float, holder: str) -> tuple[int, int] | None:
    """Check-then-unconditional-update: both racers can see the row free and both take it."""
    import datetime as dt

    from django.db.models import F

    from resource_lease import named
    from resource_lease.db import DbNow
    from resource_lease.models import Resource
    from resource_lease.recipes.locks import LOCK_KIND

    named.ensure("default", LOCK_KIND, [name])
    row = Resource.objects.filter(kind=LOCK_KIND, name=name, busy_before__lte=DbNow()).first()
    if row is None:
        return None
    time.sleep(0.002)  # the window between the look and the write, widened
    Resource.objects.filter(pk=row.pk).update(
        busy_before=DbNow() + dt.timedelta(seconds=ttl), holder=holder, fence=F("fence") + 1, grant_token="broken"
    )
    return row.pk, Resource.objects.get(pk=row.pk).fence


def broken_unlock(pk: int) -> None:
    from resource_lease.db import DbNow
    from resource_lease.models import Resource

    Resource.objects.filter(pk=pk).update(busy_before=DbNow(), grant_token="")


def race(args: argparse.Namespace) -> None:
    from resource_lease import LockHeld, lock
    from resource_lease.db.connections import lease_connection

    lease_connection("default").cursor().close()  # connected before the start gun
    print("READY", flush=True)
    while not os.path.exists(args.go):
        time.sleep(0.001)
    try:
        lease = lock(args.name, ttl=30, timeout=0, auto_renew=False)
    except LockHeld as exc:
        print(f"HELD {exc.holder}", flush=True)
        return
    except Exception as exc:  # noqa: BLE001 - the test counts whatever surfaced
        print(f"ERROR {exc!r}", flush=True)
        raise SystemExit(1) from None
    print(f"GRANTED {lease.fence}", flush=True)


def ledger(args: argparse.Namespace) -> None:
    from resource_lease import LockHeld, lock, semaphore
    from tests.ledger import Grant, critical_section, record

    worker = str(os.getpid())
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        if args.broken:
            got = broken_lock(args.name, args.ttl, worker)
            if got is None:
                time.sleep(0.001)
                continue
            pk, fence = got
            start = time.monotonic_ns()
            critical_section(args.dir, pk, args.hold)
            record(args.dir, worker, Grant(pk, fence, start, time.monotonic_ns(), worker))
            broken_unlock(pk)
            continue
        try:
            if args.slots:
                lease = semaphore(args.name, args.slots, ttl=args.ttl, timeout=1.0)
            else:
                lease = lock(args.name, ttl=args.ttl, timeout=1.0)
        except LockHeld:
            continue
        with lease:
            start = time.monotonic_ns()
            critical_section(args.dir, lease.resource.pk, args.hold)
            record(args.dir, worker, Grant(lease.resource.pk, lease.fence, start, time.monotonic_ns(), worker))
            if not lease.is_held():
                raise SystemExit(f"{lease!r} was lost inside its ttl")


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("race")
    p.add_argument("--name", required=True)
    p.add_argument("--go", required=True)
    p = sub.add_parser("ledger")
    p.add_argument("--name", required=True)
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--hold", type=float, default=0.002)
    p.add_argument("--ttl", type=float, default=10.0)
    p.add_argument("--slots", type=int, default=0)
    p.add_argument("--broken", action="store_true")
    args = parser.parse_args()
    setup()
    race(args) if args.mode == "race" else ledger(args)


if __name__ == "__main__":
    main()
