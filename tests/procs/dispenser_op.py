"""One dispenser operation, for the fault suite: assign 3 items, then maybe mark them done;
prints what the process was told as JSON.

    python -m tests.procs.dispenser_op --dispenser D [--done]
"""

from __future__ import annotations

import argparse
import json

from tests.procs import setup


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dispenser", required=True)
    parser.add_argument("--done", action="store_true")
    args = parser.parse_args()
    setup()
    from resource_lease import Dispenser

    d = Dispenser(args.dispenser, ttl=60)
    items = d.assign("cut-worker", 3)
    report: dict[str, object] = {"assigned": [i.key for i in items], "fences": [i.fence for i in items]}
    if args.done:
        report["done"] = d.done("cut-worker", items)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
