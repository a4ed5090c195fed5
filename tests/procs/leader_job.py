"""A server running a ``leader_only`` job on a schedule, for tests/test_leader_only.py.

    python -m tests.procs.leader_job --name N --dir D --ttl T --seconds S [--period P]
                                     [--spread X] [--release-at-return] [--pause-file F]

Every ``period`` seconds of the wall clock (shared by all processes on the machine) is a
tick; this server's schedule fires for tick k at k * period plus a random offset below
``spread`` (servers whose clocks or schedulers differ a little). The job's body runs a short
critical section and returns ``{"units": units + 1, "last_tick": k}``; a run that returns is
recorded in the leadership ledger (tests/leadership.py).
Events (``events-<pid>``): ``BODY k`` (the body started), ``RAN k``, ``SAVED <fence> <units>``,
``OTHERWISE k <leader> <units>``, ``LOST k`` (the run raised LeaseLost), ``PAUSING k``.

``--pause-file F``: a body that finds F removes it, logs ``PAUSING`` and stops its own process
(SIGSTOP) right there, so the test's SIGCONT resumes a run that was paused inside its body
(a SIGSTOP sent from outside may land after the body returned, while it saves).

``--release-at-return`` is the negative control: a job that holds its leadership only while
the body runs (a lock around the body), so a server whose schedule fires later in the same
tick runs it again.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

from tests.procs import setup


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--period", type=float, default=1.0)
    parser.add_argument("--spread", type=float, default=0.5)
    parser.add_argument("--hold", type=float, default=0.05)
    parser.add_argument("--release-at-return", action="store_true")
    parser.add_argument("--pause-file", type=Path)
    args = parser.parse_args()
    setup()

    from resource_lease import LeaseLost, leader_only
    from resource_lease.recipes.election import LeaderJob
    from tests.leadership import EventLog, record_unit
    from tests.ledger import critical_section

    worker = str(os.getpid())
    log = EventLog(args.dir, worker).log

    if args.release_at_return:
        run = LeaderJob._run

        def run_then_release(self: LeaderJob, lease: Any, a: Any, kw: Any) -> Any:
            try:
                return run(self, lease, a, kw)
            finally:
                self.election.resign()

        LeaderJob._run = run_then_release  # type: ignore[method-assign]

    unit: dict[str, int] = {}

    @leader_only(args.name, ttl=args.ttl, otherwise=lambda record: ("otherwise", record))
    def job(tick: int, units: int = 0, **state: Any) -> dict[str, Any]:
        lease = job.election.lease
        assert lease is not None
        log("BODY", tick)
        unit.update(fence=lease.fence, start=time.monotonic_ns())
        if args.pause_file is not None:
            try:
                args.pause_file.unlink()
            except FileNotFoundError:
                pass
            else:
                log("PAUSING", tick)
                os.kill(os.getpid(), signal.SIGSTOP)
        critical_section(args.dir, 0, args.hold)  # no check() here: leader_only must refuse the run
        unit["end"] = time.monotonic_ns()
        return {"units": units + 1, "last_tick": tick}

    # SIGTERM (the tests' way to stop a server) ends the loop between runs, never between a
    # run that stored its state and the events that say so: a server killed right there left
    # the row one unit ahead of its event log (test_leader_only, seen once on SQLite).
    running = {"run": False, "stop": False}

    def on_term(signum: int, frame: Any) -> None:
        running["stop"] = True
        if not running["run"]:
            raise Stopped

    signal.signal(signal.SIGTERM, on_term)
    log("READY")
    deadline = time.monotonic() + args.seconds
    try:
        while time.monotonic() < deadline and not running["stop"]:
            tick = int(time.time() // args.period) + 1
            time.sleep(max(0.0, tick * args.period + random.uniform(0, args.spread) - time.time()))
            running["run"] = True  # from here to the events that say what came of it
            faulthandler.dump_traceback_later(args.ttl * 3)  # a call stuck that long says where
            try:
                result = job(tick)
            except LeaseLost:
                result = None
                log("LOST", tick)
            finally:
                faulthandler.cancel_dump_traceback_later()
            if isinstance(result, tuple):
                rec = result[1]
                log("OTHERWISE", tick, rec["leader"], rec["state"].get("units", 0), rec["expires_at"] is not None)
            elif result is not None:
                # The run returned, so leader_only renewed its leadership at the return: it
                # held it all along, and the ledger may record the run.
                record_unit(args.dir, worker, unit["fence"], unit["start"], unit["end"])
                log("RAN", tick)
                log("SAVED", unit["fence"], result["units"])
            running["run"] = False
    except Stopped:
        pass
    log("STOPPED")


class Stopped(Exception):
    """SIGTERM, between two runs of the job."""


if __name__ == "__main__":
    main()
