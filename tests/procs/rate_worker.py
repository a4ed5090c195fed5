"""A caller of a shared rate limit, for tests/test_ratelimit.py.

    python -m tests.procs.rate_worker --key K --n N --per S --seconds T --out PATH [--go PATH]
        [--timeout S] [--control]

Connects, prints ``READY``, waits until the file ``--go`` exists (every worker starts
together), then acquires ``rate_limit(K, N, per=S)`` again and again for T seconds and writes
one line per successful acquisition to PATH: when it was granted by the database's clock (its
slot's expiry less ``per``, ISO 8601). ``--control`` is the negative control: each
acquisition's slot is given back at once (the mechanism that keeps it busy for ``per`` seconds
disabled: a semaphore of N, which bounds holders at once, not acquisitions per window).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import time

from tests.procs import setup


def run(args: argparse.Namespace) -> None:
    from resource_lease import RateLimited, rate_limit, signals
    from resource_lease.db.connections import lease_connection
    from resource_lease.db.operations import ops
    from resource_lease.models import Resource

    granted: list[dt.datetime] = []

    def on_granted(sender: object, lease: object, **kwargs: object) -> None:
        granted.append(lease.expires_at - dt.timedelta(seconds=args.per))  # type: ignore[attr-defined]
        if args.control:  # the negative control: the slot given back at once
            ops(lease.using).release(**lease._key())  # type: ignore[attr-defined]

    signals.lease_granted.connect(on_granted, sender=Resource, weak=False)
    limit = rate_limit(args.key, args.n, per=args.per)
    lease_connection("default").cursor().close()  # connected before the start gun
    print("READY", flush=True)
    if args.go:
        while not os.path.exists(args.go):
            time.sleep(0.001)
    refused = 0
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        try:
            limit.acquire(timeout=args.timeout)
        except RateLimited:
            refused += 1
    with open(args.out, "w") as out:
        out.writelines(f"{at.isoformat()}\n" for at in granted)
    print(f"DONE {len(granted)} {refused}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--key", required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--per", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--go", default="")
    parser.add_argument("--control", action="store_true")
    args = parser.parse_args()
    setup()
    run(args)


if __name__ == "__main__":
    main()
