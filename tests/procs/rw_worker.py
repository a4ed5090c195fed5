"""A reader or writer of an rwlock, for the ledger tests (tests/test_rwlock_ledger.py).

    python -m tests.procs.rw_worker --name N --dir D --seconds S|--until PATH [--writes F] [--hold H] [--ttl T]
    python -m tests.procs.rw_worker --name N --dir D --victim read|write --hold H [--ttl T]
    ... [--broken reader-ignores-writer|reader-ignores-line]

For S seconds (or until the file PATH exists), again and again: take ``rwlock(N)`` for writing (a fraction F of the turns) or
for reading, with ``auto_renew=False``. A writer runs the ledger's unsafe counter (read, sleep,
write back: tests/ledger.py); a reader reads the counter, sleeps, and reads it again: a
different value is a *torn read* (a writer ran meanwhile). Each grant is written to
``rw-<pid>`` twice: ``open`` once granted (mode, fence, asked, start, deadline), ``close``
before the release (end = the earlier of now and the local deadline: a holder paused past its
ttl stopped trusting the grant at its deadline; and whether a writer wrote, or a reader read
cleanly), so a worker killed while holding leaves an open grant that ends at its deadline. Times: CLOCK_MONOTONIC, in nanoseconds.

``--victim``: one grant, held ``--hold`` seconds (``HOLDING`` is printed once granted), for the
test to SIGKILL or SIGSTOP. ``--broken``: the negative controls, in this process only: the
read grant's statement loses its condition on writers (``RW_READABLE``: a reader joins a
writer's hold) or on the line (``RW_READ_CLEAR``: readers overtake a waiting writer).
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path
from typing import Any

from tests.procs import setup

BROKEN = {
    "reader-ignores-writer": ("RW_READABLE", "enabled = {true}"),
    # Always true, with RW_READ_CLEAR's six parameters (typed by the columns they meet).
    "reader-ignores-line": (
        "RW_READ_CLEAR",
        "NOT EXISTS (SELECT 1 FROM {waiters} w WHERE w.name = {p} AND w.id = {p} AND w.priority = {p}"
        " AND w.priority = {p} AND w.id = {p} AND w.id = {p} AND 1 = 0)",
    ),
}


def break_statements(which: str) -> None:
    """The negative control: render the read grant without one of its conditions."""
    from resource_lease.db.mysql import MySQLDialect
    from resource_lease.db.postgresql import PostgreSQLDialect
    from resource_lease.db.sqlite import SQLiteDialect

    name, text = BROKEN[which]
    for cls in (MySQLDialect, PostgreSQLDialect, SQLiteDialect):
        cls.templates = {**cls.templates, name: text}


def counter(directory: Path) -> int:
    path = directory / "counter"
    return int(path.read_text()) if path.exists() else 0


def hold(directory: Path, mode: str, seconds: float, deadline: int) -> bool:
    """The critical section, trusted until ``deadline``. A writer: True if it wrote the counter
    (not past its deadline: a paused holder's stale write is what fences are for). A reader:
    False for a torn read seen while it still trusted its grant."""
    if mode == "W":
        value = counter(directory)
        time.sleep(seconds)
        if time.monotonic_ns() >= deadline:
            return False
        scratch = directory / f"counter.{os.getpid()}"
        scratch.write_text(str(value + 1))
        os.replace(scratch, directory / "counter")
        return True
    before = counter(directory)
    time.sleep(seconds)
    after = counter(directory)
    return after == before or time.monotonic_ns() >= deadline


def one_grant(args: argparse.Namespace, mode: str, log: Any, seconds: float, *, victim: bool = False) -> None:
    from resource_lease import LockHeld, rwlock

    rw = rwlock(args.name)
    asked = time.monotonic_ns()
    try:
        take = rw.write if mode == "W" else rw.read
        lease = take(ttl=args.ttl, timeout=args.timeout, auto_renew=False)
    except LockHeld:
        log.write(f"refused {mode} {asked} {time.monotonic_ns()}\n")
        log.flush()
        return
    start = time.monotonic_ns()
    deadline = start + int(lease.remaining() * 1e9)
    log.write(f"open {mode} {lease.fence} {asked} {start} {deadline}\n")
    log.flush()
    if victim:
        print("HOLDING", lease.fence, flush=True)
    clean = hold(Path(args.dir), mode, seconds, deadline)
    end = min(time.monotonic_ns(), deadline)
    log.write(f"close {lease.fence} {end} {int(clean)}\n")
    log.flush()
    lease.release()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--until", default="", help="go on until this file exists (instead of --seconds)")
    parser.add_argument("--writes", type=float, default=0.3, help="the fraction of turns that write")
    parser.add_argument("--role", choices=["mixed", "read", "write"], default="mixed")
    parser.add_argument("--hold", type=float, default=0.02)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--victim", choices=["read", "write"])
    parser.add_argument("--broken", choices=sorted(BROKEN))
    args = parser.parse_args()
    setup()
    if args.broken:
        break_statements(args.broken)
    with open(Path(args.dir) / f"rw-{os.getpid()}", "a") as log:
        if args.victim:
            one_grant(args, args.victim[0].upper(), log, args.hold, victim=True)
            return
        until = time.monotonic() + args.seconds
        while (os.path.exists(args.until) is False) if args.until else time.monotonic() < until:
            if args.role == "mixed":
                mode = "W" if random.random() < args.writes else "R"
            else:
                mode = args.role[0].upper()
            one_grant(args, mode, log, args.hold)


if __name__ == "__main__":
    main()
