"""A candidate for the election tests: campaign in the background, do leader work while leader.

    python -m tests.procs.campaigner --name N --dir D --ttl T --seconds S [--lead L] [--naive]

``Election.start()`` campaigns; each time it is elected, the main thread reads the hand-over
state (``{"units": n}``) and does units of leader work: ``lease.check()``, a short critical
section, ``lease.check()`` again, then records the unit's interval in the leadership ledger
(tests/leadership.py) and saves ``units + 1`` with ``save_state``. With ``--lead L`` it
resigns after L seconds of leadership (many hand-overs); 0 leads until it dies.

Events go to ``events-<pid>`` in D, one per line: ``<monotonic ns> ELECTED|REVOKED|LOST|
SAVED|REFUSED ...``. ``--naive`` is the negative control: an election that reads whether
the row is free and then writes the leadership unconditionally.
"""

from __future__ import annotations

import argparse
import os
import queue
import time
from pathlib import Path
from typing import Any

from tests.procs import setup


def naive_try_grant(
    alias: str, kind: str, name: str, *, holder: str, ttl: float, on_lost: Any = None, **ignored: Any
) -> Any:
    """Look whether the election's row is free, then take it with an unconditional UPDATE."""
    import datetime as dt

    from django.db.models import F

    from resource_lease import named
    from resource_lease.db.clock import DbNow
    from resource_lease.lease import Lease
    from resource_lease.models import Resource

    named.ensure(alias, kind, [name])
    rows = Resource.objects.using(alias).filter(kind=kind, name=name)
    if not rows.filter(busy_before__lte=DbNow()).exists():
        return None
    time.sleep(0.4)  # the window between the read and the write, widened
    sent_at = time.monotonic()
    rows.update(
        busy_before=DbNow() + dt.timedelta(seconds=ttl),
        holder=holder,
        fence=F("fence") + 1,
        grant_token=os.urandom(8).hex(),
    )
    return Lease(rows.get(), holder=holder, ttl=ttl, using=alias, sent_at=sent_at, on_lost=on_lost)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--lead", type=float, default=0.0)
    parser.add_argument("--hold", type=float, default=0.02)
    parser.add_argument("--naive", action="store_true")
    args = parser.parse_args()
    setup()

    from resource_lease import Election, LeaseLost, named
    from tests.leadership import EventLog, record_unit
    from tests.ledger import critical_section

    if args.naive:
        named.try_grant = naive_try_grant  # type: ignore[assignment]

    worker = str(os.getpid())
    log = EventLog(args.dir, worker).log

    elected: queue.Queue[Any] = queue.Queue()
    election = Election(args.name, ttl=args.ttl)
    election.start(on_elected=elected.put, on_revoked=lambda reason: log("REVOKED", reason.replace(" ", "_")))
    log("READY")
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        try:
            lease = elected.get(timeout=0.1)
        except queue.Empty:
            continue
        units = int(election.state.get("units", 0))
        log("ELECTED", lease.fence, units)
        lead_until = time.monotonic() + args.lead if args.lead else deadline
        while time.monotonic() < min(lead_until, deadline):
            try:
                lease.check()  # before each piece of leader work
                start = time.monotonic_ns()
                critical_section(args.dir, 0, args.hold)
                end = time.monotonic_ns()
                lease.check()  # the ledger records only a unit that was still ours at its end
            except LeaseLost as exc:
                log("LOST", str(exc).split(": ")[-1].replace(" ", "_"))
                try:  # what a leader that ignored the loss would do next: it must be refused
                    election.save_state({"units": units + 1, "by": worker, "stale": True})
                    log("STALE-SAVED", lease.fence, units + 1)
                except LeaseLost:
                    log("STALE-REFUSED", lease.fence)
                break
            record_unit(args.dir, worker, lease.fence, start, end)
            try:
                election.save_state({"units": units + 1, "by": worker})
            except LeaseLost:
                log("REFUSED", lease.fence, units + 1)
                break
            units += 1
            log("SAVED", lease.fence, units)
            time.sleep(0.01)
        else:
            if lease is election.lease:
                election.resign()
    election.stop()
    log("STOPPED")


if __name__ == "__main__":
    main()
