"""Workers of the Galera tests (settings: tests.galera_settings, DATABASE_URL = the cluster).

    python -m tests.procs.galera_worker setup --kind K --resources N
    python -m tests.procs.galera_worker cycle --kind K --dir D --seconds S [--hop] [--get-lock] [--until-stop]
    python -m tests.procs.galera_worker hold --kind K --ttl T --seconds S

``cycle``: until the time is up (or, with ``--until-stop``, the file ``<dir>/stop`` appears),
acquire, run the ledger's unsafe critical section, record the grant (tests/ledger.py)
and the port of the node that granted it (``nodes-<pid>``: ``start_ns port``), release. With
``--hop`` the lease is then renewed and released through the alias ``other`` (another first
node), and a renewal refused there is counted. Database errors (a node dying under us) are
counted and the loop goes on. ``--get-lock`` is the negative control: MySQL's GET_LOCK() on the
worker's node instead of a lease. Prints one JSON line of counts at the end.

``hold``: acquire one resource with auto_renew and hold it, printing JSON events (``acquired``,
``lost``, ``done``) until the file ``<dir>/stop`` appears (or the time is up), then release. Its holding goes into the ledger too:
from the grant to the release, or to the lease's local deadline if it was lost (the instant
this process stopped trusting it), so a grant to anyone else inside that interval is caught.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def emit(ev: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"ev": ev, "t": time.monotonic(), **fields}) + "\n")
    sys.stdout.flush()


def port_of(alias: str) -> int:
    """The port of the server this process's lease connection is on now (PostgreSQL with a
    host list, a Patroni cluster: the one libpq chose, the primary)."""
    from resource_lease.db.connections import lease_connection

    wrapper = lease_connection(alias).wrapper
    if wrapper.vendor == "postgresql" and wrapper.connection is not None:
        return int(wrapper.connection.info.port)
    return int(wrapper.settings_dict["PORT"])


def setup_pool(args: argparse.Namespace) -> None:
    from resource_lease.models import Resource

    Resource.objects.filter(kind=args.kind).delete()
    Resource.objects.bulk_create([Resource(kind=args.kind, name=f"{args.kind}-{i}") for i in range(args.resources)])


def get_lock_cycle(args: argparse.Namespace, worker: str) -> dict[str, int]:
    """The negative control: a named lock per resource, GET_LOCK() on this worker's node."""
    from django.db import connection

    from tests.grants import Grant
    from tests.ledger import critical_section, record

    grants = 0
    deadline = time.monotonic() + args.seconds
    i = 0
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            i = (i + 1) % args.resources
            cursor.execute("SELECT GET_LOCK(%s, 0)", (f"{args.kind}-{i}",))
            if cursor.fetchone()[0] != 1:
                continue
            start = time.monotonic_ns()
            critical_section(args.dir, i, args.hold)
            # No fence comes with GET_LOCK: record the time, so only overlaps and lost updates count.
            record(args.dir, Grant(i, start, worker, start, time.monotonic_ns()))
            cursor.execute("SELECT RELEASE_LOCK(%s)", (f"{args.kind}-{i}",))
            cursor.fetchall()
            grants += 1
    return {"grants": grants}


def cycle(args: argparse.Namespace, worker: str) -> dict[str, int]:
    from resource_lease import LeaseLost, NoResourceAvailable, acquire
    from resource_lease.exceptions import LeaseDatabaseError
    from tests.grants import Grant
    from tests.ledger import critical_section, record

    counts = {"grants": 0, "db_errors": 0, "renew_refused": 0, "release_refused": 0, "hops": 0}
    nodes = open(args.dir / f"nodes-{worker}", "a")  # noqa: SIM115 (closed at exit)
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline and not (args.until_stop and (args.dir / "stop").exists()):
        began = time.monotonic()
        try:
            lease = acquire(args.kind, ttl=args.ttl, timeout=1.0)
        except NoResourceAvailable:
            continue
        except LeaseDatabaseError as exc:  # e.g. every listed node down: loud, and we go on
            counts["db_errors"] += 1
            emit("db_error", during="acquire", error=str(exc))
            time.sleep(0.05)
            continue
        finally:
            if time.monotonic() - began > 1.5:  # where a failover's time goes
                emit("slow", during="acquire", began=began, seconds=time.monotonic() - began)
        start = time.monotonic_ns()
        critical_section(args.dir, lease.resource.pk, args.hold)
        end = time.monotonic_ns()  # the interval ends before any renewal or release is sent
        record(args.dir, Grant(lease.resource.pk, lease.fence, worker, start, end))
        nodes.write(f"{start} {port_of('default')}\n")
        nodes.flush()
        counts["grants"] += 1
        try:
            if args.hop:
                # The cluster is one database: the lease taken through one node is renewed and
                # released through another (the alias 'other' starts at a different node).
                lease.using = "other"
                try:
                    lease.renew()
                    counts["hops"] += 1
                except LeaseLost:
                    counts["renew_refused"] += 1
                    emit("renew_refused", pk=lease.resource.pk, fence=lease.fence)
                    continue
            began = time.monotonic()
            released = lease.release()
            if time.monotonic() - began > 1.0:
                emit("slow", during="release", began=began, seconds=time.monotonic() - began)
            if not released:
                counts["release_refused"] += 1
                emit("release_refused", pk=lease.resource.pk, fence=lease.fence)
        except LeaseDatabaseError as exc:
            counts["db_errors"] += 1
            emit("db_error", during="renew/release", error=str(exc))
    nodes.close()
    return counts


def hold(args: argparse.Namespace, worker: str) -> None:
    import threading

    from resource_lease import LeaseLost, acquire
    from tests.grants import Grant
    from tests.ledger import critical_section, record

    reported = threading.Event()

    def on_lost(lease: Any) -> None:
        emit("lost", pk=lease.resource.pk, fence=lease.fence, reason=lease.lost_reason)
        reported.set()

    lease = acquire(args.kind, ttl=args.ttl, timeout=30, auto_renew=True, on_lost=on_lost)
    start = time.monotonic_ns()
    critical_section(args.dir, lease.resource.pk, 0)
    emit("acquired", pk=lease.resource.pk, fence=lease.fence, port=port_of("default"))
    # Until the test says stop (a file), or --seconds if it never does.
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline and not (args.dir / "stop").exists():
        try:
            lease.check()  # past the local deadline without a renewal: lost, even if the
        except LeaseLost:  # renewal thread is stuck on a hung server
            break
        time.sleep(0.1)
    # Asked again once the loop ends: on a loaded machine the sleep above can outlast the local
    # deadline, and a holder that then saw the stop file without checking would record (and
    # trust) a holding past it, which the ledger reads as two holders at once.
    try:
        lease.check()
    except LeaseLost:
        pass
    ended = time.monotonic_ns()
    trusted_until = int(lease._deadline * 1e9)  # the local deadline: trust ends there at the latest
    if lease.lost:
        record(args.dir, Grant(lease.resource.pk, lease.fence, worker, start, min(ended, trusted_until)))
        # When the keeper found the loss, on_lost runs on a callback thread (a daemon): wait
        # for it, or this process may exit before it ran and the loss would go unreported.
        reported.wait(30)
        emit("done", held=False, pk=lease.resource.pk)
        return
    record(args.dir, Grant(lease.resource.pk, lease.fence, worker, start, min(ended, trusted_until)))
    released = lease.release()
    emit("done", held=True, released=released, pk=lease.resource.pk)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["setup", "cycle", "hold"])
    parser.add_argument("--kind", required=True)
    parser.add_argument("--resources", type=int, default=3)
    parser.add_argument("--dir", type=Path)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--hold", type=float, default=0.002)
    parser.add_argument("--ttl", type=float, default=10.0)
    parser.add_argument("--hop", action="store_true")
    parser.add_argument("--until-stop", action="store_true", help="cycle: also stop when <dir>/stop exists")
    parser.add_argument("--get-lock", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.galera_settings")
    import django

    django.setup()
    worker = str(os.getpid())
    if args.mode == "setup":
        setup_pool(args)
    elif args.mode == "hold":
        hold(args, worker)
    else:
        counts = get_lock_cycle(args, worker) if args.get_lock else cycle(args, worker)
        emit("counts", **counts)


if __name__ == "__main__":
    main()
