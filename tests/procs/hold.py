"""Hold one lease and report it, then wait to be killed.

    python -m tests.procs.hold --kind K --ttl T [--auto-renew]

Prints ``HELD <resource id> <fence>`` once the grant is committed.
"""

from __future__ import annotations

import argparse
import sys
import time

from tests.procs import setup


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", required=True)
    parser.add_argument("--ttl", type=float, required=True)
    parser.add_argument("--auto-renew", action="store_true")
    args = parser.parse_args()
    setup()
    from resource_lease import acquire

    lease = acquire(args.kind, ttl=args.ttl, timeout=30, auto_renew=args.auto_renew)
    print(f"HELD {lease.resource.pk} {lease.fence}", flush=True)
    while True:
        time.sleep(60)
    sys.exit(0)


if __name__ == "__main__":
    main()
