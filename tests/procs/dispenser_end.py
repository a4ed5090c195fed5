"""The end of a nemesis dispenser run on another database (the Patroni tests: the cluster):
wait until its items are drained, then print what the nemesis runner's end check found, as
JSON (project/bench/nemesis/runner.py: nothing pending or assigned, every acknowledged put
still there, every item counted done done once).

    python -m tests.procs.dispenser_end --drain --object D --dir HISTORIES [--limit S]  # clients running
    python -m tests.procs.dispenser_end --object D --dir HISTORIES [--kills N]  # once they stopped
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tests.procs import setup


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--object", required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--kills", type=int, default=0)
    parser.add_argument("--limit", type=float, default=60.0)
    parser.add_argument("--drain", action="store_true", help="only wait until nothing is pending or assigned")
    args = parser.parse_args()
    setup()
    from project.bench.nemesis.runner import dispenser_drain, dispenser_end
    from resource_lease import Dispenser

    if args.drain:
        dispenser_drain("default", args.object, args.limit)
    found = [] if args.drain else dispenser_end("default", args.object, args.dir, args.kills)
    print(json.dumps({"found": found, "counts": Dispenser(args.object).counts()}), flush=True)


if __name__ == "__main__":
    main()
