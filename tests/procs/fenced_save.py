"""A leader whose save of its hand-over state loses its answer (tests/faults/test_election.py),
reporting JSON lines on stdout.

    python -m tests.procs.fenced_save --name N --go FILE [--naive]

Campaigns for election N (ttl 30 s) and prints ``leader`` with its fence, waits for FILE,
then calls ``save_state({"units": 1})`` and prints ``save`` with what it answered or raised
(``error``: the exception's class, ``message``). ``--naive``: the negative control, the
fenced write as it was before it told a lost answer from a refusal: asked again after the
connection was lost, a refusal meant "nothing written" (``LeaseLost``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tests.procs import setup


def emit(ev: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"ev": ev, "pid": os.getpid(), **fields}) + "\n")
    sys.stdout.flush()


def naive_write_data() -> None:
    """The control: a fenced write simply run again after a lost answer, its refusal believed."""
    from resource_lease.db.connections import run_repeatable
    from resource_lease.db.operations import Operations

    def write_data(self: Operations, *, pk: int, holder: str, fence: int, data: str) -> bool:
        return bool(
            run_repeatable(
                self.alias,
                lambda d, c: d.leases.write_data(c, pk=pk, holder=holder, fence=fence, data=data),
                what=f"writing resource {pk}'s data",
            )
        )

    Operations.write_data = write_data  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--go", type=Path, required=True)
    parser.add_argument("--naive", action="store_true")
    args = parser.parse_args()
    setup()
    if args.naive:
        naive_write_data()
    from resource_lease import Election, LeaseError

    election = Election(args.name, ttl=30)
    lease = election.campaign(timeout=30)
    emit("leader", fence=lease.fence, holder=lease.holder)
    while not args.go.exists():
        time.sleep(0.01)
    try:
        election.save_state({"units": 1})
        emit("save", answer="saved")
    except LeaseError as exc:
        emit("save", error=type(exc).__name__, message=str(exc))
    os._exit(0)  # the leadership was taken from it: nothing to resign


if __name__ == "__main__":
    main()
