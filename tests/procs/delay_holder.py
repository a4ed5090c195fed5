"""Hold a lock (or an rwlock, a pool's resource) with a lock delay, for tests/test_lock_delay.py.

    python -m tests.procs.delay_holder --what lock:NAME|read:NAME|write:NAME|pool:KIND
        --ttl T --lock-delay D [--release]

Takes it (``auto_renew`` on: it stays held until the process dies), prints ``HELD <expires_at
ISO> <fence>`` (the expiry by the database's clock), and then waits to be killed; with
``--release`` it releases at once and prints ``RELEASED``.
"""

from __future__ import annotations

import argparse
import time

from tests.procs import setup


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--what", required=True)
    parser.add_argument("--ttl", type=float, required=True)
    parser.add_argument("--lock-delay", type=float, required=True)
    parser.add_argument("--release", action="store_true")
    args = parser.parse_args()
    setup()
    from resource_lease import acquire, lock, rwlock

    family, name = args.what.split(":", 1)
    options = {"ttl": args.ttl, "timeout": 30, "lock_delay": args.lock_delay}
    if family == "lock":
        lease = lock(name, auto_renew=False, **options)
    elif family in ("read", "write"):
        lease = getattr(rwlock(name), family)(auto_renew=False, **options)
    else:
        lease = acquire(name, **options)
    print(f"HELD {lease.expires_at.isoformat()} {lease.fence}", flush=True)
    if args.release:
        assert lease.release()
        print("RELEASED", flush=True)
        return
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
