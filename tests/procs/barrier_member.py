"""A member of a DoubleBarrier computing its share of users, reporting JSON lines on stdout.

    python -m tests.procs.barrier_member --barrier B --size N --member M [--ttl S] [--users U]
        [--rounds R] [--timeout S] [--hold S] [--wait-go] [--unfrozen]

Per round: enter (prints ``inside``), optionally wait for a line on stdin (``--wait-go``),
compute its share (users with ``user % size == index``, printed with ``entered``), hold,
leave (prints ``left``). A timeout prints ``timeout``. ``--unfrozen`` is the negative
control: index and size from the member's own live read of who is in the barrier at the time
it computes, instead of the frozen cohort.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from tests.procs import setup

_out = threading.Lock()


def say(**fields: object) -> None:
    with _out:  # the watch thread prints too: one whole line at a time
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--barrier", required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--member", required=True)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--hold", type=float, default=0.0)
    parser.add_argument("--wait-go", action="store_true")
    parser.add_argument("--unfrozen", action="store_true")
    args = parser.parse_args()
    setup()
    from resource_lease import BarrierTimeout, DoubleBarrier, named

    barrier = DoubleBarrier(args.barrier, args.size, ttl=args.ttl, member=args.member)
    for _ in range(args.rounds):
        try:
            cohort = barrier.enter(timeout=args.timeout)
        except BarrierTimeout as exc:
            say(event="timeout", error=str(exc), at=time.time())
            return
        say(event="inside", round=barrier.round, cohort=cohort, index=barrier.index, size=barrier.size, at=time.time())
        if args.wait_go:
            sys.stdin.readline()
        if args.unfrozen:
            names = named.read(barrier.using, barrier.kind).live_names()
            index, size = names.index(args.member), len(names)
        else:
            index, size = barrier.index, barrier.size
        share = [u for u in range(args.users) if u % size == index]
        say(event="entered", round=barrier.round, index=index, size=size, share=share, at=time.time())
        time.sleep(args.hold)
        try:
            barrier.leave(timeout=args.timeout)
        except BarrierTimeout as exc:
            say(event="leave-timeout", error=str(exc), at=time.time())
            return
        say(event="left", round=barrier.round, at=time.time())


if __name__ == "__main__":
    main()
