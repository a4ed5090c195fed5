"""Handles that run in the background, started without keeping them (tests/test_watch_handles.py).

    python -m tests.procs.dropped_handles --prefix P [--poll S] [--ttl T] [--weak]

Starts, and drops at once, every handle that runs in the background: ``watch(topic, cb)``,
``Config(ns).watch(cb)``, ``Group(name).watch(cb)``, ``Election(name).observe(cb)``, a
``Group(name).join()`` and an ``Election(name).start(on_elected=cb)``; then
``gc.collect()`` and ``READY``. Each callback prints a line ``CALLED <row> <args>``. The test
changes each value from its own process and waits for the lines; it reads the group's members
and the election's leader itself. ``--weak``: the negative control, the keeper holds its jobs
weakly as before (a dropped handle is collected and stops without a word).
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import sys
import threading
import time

from tests.procs import setup

_out = threading.Lock()


def say(row: str, *args: object) -> None:
    # One write per line, under a lock: the callbacks run on several callback threads at
    # once, and print() writes its pieces one by one, so two lines could interleave
    # ("CALLED CALLED config group-watch ...") and the test would miss both.
    line = " ".join(["CALLED", row, *map(str, args)]) + "\n"
    with _out:
        sys.stdout.write(line)
        sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--poll", type=float, default=0.2)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--weak", action="store_true")
    args = parser.parse_args()
    setup()
    from resource_lease import Config, Election, Group, watch
    from resource_lease.keeper import Keeper

    if args.weak:
        schedule = Keeper.schedule

        def weak_schedule(self: Keeper, job: object, delay: float, *, step: str = "keep", hold: bool = False) -> None:
            schedule(self, job, delay, step=step)

        Keeper.schedule = weak_schedule  # type: ignore[method-assign]

    # A start that takes this long is stuck: every thread's stack into stderr, which the test
    # shows when it gives up on READY (once, in a full run, READY never came).
    faulthandler.dump_traceback_later(45)
    p, poll = args.prefix, args.poll
    watch(f"{p}topic", lambda payload, version: say("watch", payload), poll=poll)
    Config(f"{p}config", {"k": 0}, poll=poll).watch(lambda key, old, new: say("config", key, new))
    Group(f"{p}watched", ttl=args.ttl).watch(lambda members: say("group-watch", ",".join(members)), poll=poll)
    Election(f"{p}observed", ttl=args.ttl).observe(lambda leader, fence: say("observe", leader), poll=poll)
    Group(f"{p}joined", ttl=args.ttl, member="dropped-member").join()
    Election(f"{p}started", ttl=args.ttl, holder="dropped-candidate").start(
        on_elected=lambda lease: say("start", lease.holder)
    )
    gc.collect()
    print("READY", flush=True)
    faulthandler.cancel_dump_traceback_later()
    while True:  # as a long-running process does, now and then
        time.sleep(0.3)
        gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
