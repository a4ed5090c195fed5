"""Candidates and observers of one election in their own processes, JSON lines on stdout.

    python -m tests.procs.observe_proc candidate --name E --seconds S --ttl T --hold H [--die-unrecorded-at K]
    python -m tests.procs.observe_proc observer --name E --poll P [--naive]

``candidate`` campaigns, prints ``won`` (holder, fence) as soon as it leads (the ground truth:
the terms it acted on), holds the leadership for up to H seconds, resigns, and again, for S
seconds. ``--die-unrecorded-at K``: at its K-th win it kills itself (SIGKILL) after the grant
and before writing the term down (printing ``dying`` with the fence first), as a crash at the
worst moment would. ``observer`` prints ``saw`` (leader, fence) for each call of
``Election.observe``'s callback, until its stdin closes. ``--naive`` is the negative control:
an observer that polls the current leader with one-off reads (the row's holder and fence
every P seconds) and reports what changed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from typing import Any

from tests.procs import setup

OUT = threading.Lock()


def emit(ev: str, **fields: Any) -> None:
    with OUT:
        sys.stdout.write(json.dumps({"ev": ev, "pid": os.getpid(), "t": time.monotonic(), **fields}) + "\n")
        sys.stdout.flush()


def candidate(args: argparse.Namespace) -> None:
    from resource_lease import Election
    from resource_lease.db import term_operations

    if args.die_unrecorded_at:
        wins = [0]
        record = term_operations.TermOperations.record_term

        def record_or_die(self: Any, kind: str, name: str, *, fence: int, holder: str, channel: str) -> bool:
            wins[0] += 1
            if wins[0] == args.die_unrecorded_at:
                emit("dying", fence=fence, holder=holder)
                os.kill(os.getpid(), signal.SIGKILL)
            return record(self, kind, name, fence=fence, holder=holder, channel=channel)

        term_operations.TermOperations.record_term = record_or_die  # type: ignore[method-assign]

    election = Election(args.name, ttl=args.ttl)
    emit("ready", holder=election.holder)
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        lease = election.campaign(timeout=None)
        emit("won", holder=election.holder, fence=lease.fence)
        time.sleep(random.uniform(0, args.hold))
        election.resign()
    emit("done")


def observer(args: argparse.Namespace) -> None:
    from resource_lease import Election

    def on_change(leader: str | None, fence: int) -> None:
        emit("saw", leader=leader, fence=fence)

    stop = (
        naive_observe(args.name, on_change, args.poll)
        if args.naive
        else Election(args.name).observe(on_change, poll=args.poll).stop
    )
    emit("ready")
    for _ in sys.stdin:  # until the test closes stdin
        pass
    stop()
    emit("stopped")


def naive_observe(name: str, callback: Any, poll: float) -> Any:
    """The negative control: poll the current leader (one read of the row) and report changes."""
    from resource_lease import named
    from resource_lease.recipes.election import KIND

    stopping = threading.Event()

    def look() -> tuple[str | None, int]:
        snapshot = named.read("default", KIND, [name])
        row, live = snapshot.rows.get(name), snapshot.live(name)
        return (live.holder if live else None), (row.fence if row else 0)

    last = look()
    callback(*last)

    def run() -> None:
        nonlocal last
        while not stopping.wait(poll):
            now = look()
            if now != last:
                last = now
                callback(*now)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def stop() -> None:
        stopping.set()
        thread.join()

    return stop


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("candidate")
    p.add_argument("--name", required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--ttl", type=float, required=True)
    p.add_argument("--hold", type=float, default=0.02)
    p.add_argument("--die-unrecorded-at", type=int, default=0)
    p = sub.add_parser("observer")
    p.add_argument("--name", required=True)
    p.add_argument("--poll", type=float, default=1.0)
    p.add_argument("--naive", action="store_true")
    args = parser.parse_args()
    setup()
    {"candidate": candidate, "observer": observer}[args.cmd](args)


if __name__ == "__main__":
    main()
