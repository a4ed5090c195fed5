"""A racer for a brand-new lock name, for the named-lock tests.

    python -m tests.procs.lock_race --name N --go PATH

Connects, prints ``READY``, waits until the file PATH exists (so every racer starts together,
however slowly each started), makes one attempt at ``lock(N)`` (a brand-new name: its row is
created by the racers) and prints ``GRANTED <fence>`` or ``HELD <holder>``; anything else that
surfaced (an IntegrityError, a deadlock) is printed as ``ERROR <repr>`` with exit status 1.
The exclusion of locks and semaphores across processes is tests/procs/exclusion.py's.
"""

from __future__ import annotations

import argparse
import os
import time

from tests.procs import setup


def race(args: argparse.Namespace) -> None:
    from resource_lease import LockHeld, lock
    from resource_lease.db.connections import lease_connection

    lease_connection("default").cursor().close()  # connected before the start gun
    print("READY", flush=True)
    while not os.path.exists(args.go):
        time.sleep(0.001)
    try:
        lease = lock(args.name, ttl=30, timeout=0, auto_renew=False)
    except LockHeld as exc:
        print(f"HELD {exc.holder}", flush=True)
        return
    except Exception as exc:  # noqa: BLE001 - the test counts whatever surfaced
        print(f"ERROR {exc!r}", flush=True)
        raise SystemExit(1) from None
    print(f"GRANTED {lease.fence}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--go", required=True)
    args = parser.parse_args()
    setup()
    race(args)


if __name__ == "__main__":
    main()
